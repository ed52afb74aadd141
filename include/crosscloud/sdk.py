"""crosscloud's SDK for a team's own training program: ``import crosscloud.sdk as cc``.

    run = cc.init()                               # plan, cloud, rank, device, data of this sub-task
    model = build_model(run.args).to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=run.args["lr"])
    start = run.resume(model, opt)                # after a restart: the steps already trained
    with cc.DiLoCo(run, model, opt) as diloco:
        for batch in my_loader(run.data_files(), start=start):
            ...; opt.step(); opt.zero_grad()
            diloco.step(loss=loss)
            if diloco.done:
                break

The program also defines ``build_model(args)``, ``evaluate(model, run)`` and
``FAMILY``; see docs/programs.md.
"""

from crosscloud.training.diloco import DiLoCo
from crosscloud.training.program import ProgramError
from crosscloud.training.session import Run, init

__all__ = ["DiLoCo", "ProgramError", "Run", "init"]
