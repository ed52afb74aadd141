"""crosscloud's built-in byte-level language model, as an ordinary training program.

The model is ``crosscloud.training.model.ByteLM`` sized by a preset
(``model_size``: tiny, small, base, large); the data is the run's byte shards,
read as local files. The loop is plain PyTorch: AdamW on random windows, one
``diloco.step`` after each optimizer step. ``make demo`` runs this program.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch

import crosscloud.sdk as cc
from crosscloud.core.presets import SAMPLE_SECONDS, preset
from crosscloud.training.model import ByteLM, batches, evaluate as byte_loss

FAMILY = "byte-lm"


def model_name(args: dict) -> str:
    """Its registered model: one per preset, since each preset is another architecture."""
    return f"byte-lm-{args['model_size']}"


def figures(args: dict) -> dict:
    """What a sample and a device cost, until a run has measured it: the presets' reference figures."""
    return {"seconds_per_sample": SAMPLE_SECONDS[args["model_size"]],
            "memory_gb": preset(args["model_size"]).min_train_memory_gb()}


def build_model(args: dict) -> torch.nn.Module:
    """The model every cloud starts from: the same seed gives the same weights."""
    torch.manual_seed(args["seed"])
    return ByteLM(preset(args["model_size"]))


def _bytes(files: list[Path]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"\n".join(f.read_bytes() for f in files)), dtype=torch.uint8)


def evaluate(model: torch.nn.Module, run: cc.Run) -> float:
    """Mean loss on fixed windows of the held-out bytes."""
    return byte_loss(model, _bytes(run.eval_files()).to(run.device))


def windows(run: cc.Run, start: int):
    """Step i's batch: ``run.batch_size`` windows drawn by a generator seeded by (seed, cloud, rank, i),
    so that a restarted sub-task sees the very batches it would have."""
    data, seq_len = _bytes(run.data_files()), preset(run.args["model_size"]).seq_len
    step = start
    while True:
        gen = torch.Generator().manual_seed(zlib.crc32(f"{run.args['seed']}/{run.cloud}/{run.rank}/{step}".encode()))
        yield batches(data, run.batch_size, seq_len, gen).to(run.device)
        step += 1


def main() -> None:
    run = cc.init()
    model = build_model(run.args).to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=run.args["lr"], weight_decay=0.0)
    start = run.resume(model, opt)
    net = torch.nn.parallel.DistributedDataParallel(model) if run.world_size > 1 else model
    with cc.DiLoCo(run, model, opt) as diloco:
        for batch in windows(run, start):
            logits = net(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            diloco.step(loss=loss)
            if diloco.done:
                break


if __name__ == "__main__":
    main()
