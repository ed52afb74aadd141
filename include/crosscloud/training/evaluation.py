"""The global model's held-out loss, measured by the run's own program (its ``evaluate``)."""

from __future__ import annotations

import torch

from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectStore
from crosscloud.training.program import ProgramError, load_program, local_file
from crosscloud.training.session import Run, load_params, parameters


class Evaluator:
    """The program's model and ``evaluate`` on the cloud whose store holds the held-out files.

    The program is loaded once and its model built once; each call loads other
    params into it. Evaluation runs on the CPU of the process that asks.
    """

    def __init__(self, plan: Plan, store: ObjectStore, cloud: str):
        if plan.program is None:
            raise ProgramError(f"run {plan.run_id} names no training program to evaluate with")
        path = local_file(store, plan.tenant, plan.program.code, plan.program.file)
        self.program = load_program(path, plan.program.name)
        self.run = Run(plan, cloud, store)
        self.model = self.program.build_model(self.run.args).to(self.run.device)

    def initial(self) -> dict[str, torch.Tensor]:
        """The parameters the program's ``build_model`` gives: the run's global 0."""
        return {n: p.detach().cpu().clone() for n, p in parameters(self.model).items()}

    def __call__(self, params: dict[str, torch.Tensor]) -> float:
        load_params(self.model, params)
        loss = float(self.program.evaluate(self.model, self.run))
        if loss != loss:  # NaN: a diverged model, said as such rather than plotted as a gap
            print(f"program {self.run.plan.program.name}: evaluate returned NaN")
        return loss
