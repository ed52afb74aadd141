"""The training worker: one cloud's sub-task of a cross-cloud run.

Each round it trains ``inner_steps`` AdamW steps on its own shards, with an lr
for its part of the global batch (``job.local_lr``), and commits its
pseudo-gradient (global - local) with the round's timings. It reads and writes
nothing but its own cloud's store. Inside the cloud, several devices train with
ordinary data parallelism (torch.distributed, launched by torchrun).

Run as ``python -m crosscloud.training.worker --tenant T --run-id R --cloud C``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from crosscloud.core.federation import load_federation
from crosscloud.core.job import local_lr
from crosscloud.pool.partition import apportion
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectStore, StoreError
from crosscloud.store.chunks import read_blob
from crosscloud.store.commit import put_object, read_commit, read_object, write_step
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes, to_bytes
from crosscloud.training.checkpoint import PARAMS, global_params
from crosscloud.training.compression import ErrorFeedback
from crosscloud.training.model import batches as sample_batches
from crosscloud.training.model import build_model, lm_loss

POLL_S = 0.05


class Stopped(RuntimeError):
    """The run was stopped or abandoned; the worker exits without committing."""


def wait_for_commit(store: ObjectStore, step: str, stop_key: str, timeout_s: float) -> dict:
    """Poll until ``step`` is committed; give up when the run is stopped or stalls."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            commit = read_commit(store, step)
            if commit is not None:
                return commit
            if store.exists(stop_key):
                raise Stopped(f"run stopped while waiting for {step}")
        except StoreError as exc:  # a store failing past its retry deadline: the global may still come, ask again
            print(f"polling {step} again: {exc}", file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            raise Stopped(f"no commit of {step} within {timeout_s:.0f} s; the coordinator is gone or stalled")
        time.sleep(POLL_S)


class DelayedGlobal:
    """Folds each global checkpoint into a model that has trained on without it.

    Round r's exchange runs while round r + 1 computes, so global r + 1 (every cloud's round r)
    arrives while this cloud is already past it: its model is global r plus its own progress
    of rounds r, r + 1, ... . Global r + 1 is folded in the moment it is committed, usually a
    few steps into round r + 1, by swapping this cloud's own round-r progress for what the
    outer step made of all clouds' (``correction``). Waiting only happens when it is still
    missing a whole round later.
    """

    def __init__(self, params: dict[str, torch.Tensor], meta: dict, mix: float = 0.0):
        self.params, self.round, self.metas = params, 0, {0: meta}
        self.own: dict[int, dict[str, torch.Tensor]] = {}
        self.mix = mix
        self.drift: dict[str, torch.Tensor] = {}  # how far the model stays from where blocking rounds would have it

    def record(self, round_: int, progress: dict[str, torch.Tensor]) -> None:
        """This cloud's progress of ``round_``, kept until the global that contains it arrives."""
        self.own[round_] = progress

    def pending(self) -> bool:
        """Whether a round this cloud has committed is not yet folded in."""
        return self.round in self.own

    def correction(self, params: dict[str, torch.Tensor], meta: dict) -> dict[str, torch.Tensor]:
        """Global ``self.round + 1`` arrived: what to add to the model (and to its round base).

        The whole correction puts the model where blocking rounds would have it (the global
        plus the running round's progress). With ``mix`` (Streaming DiLoCo's mixing factor)
        the model keeps that share of its distance from there, so the steps it already took
        from its own unaveraged point are not undone at once; the globals, built only from
        progress, do not change.
        """
        own = self.own.pop(self.round)
        fix = {n: params[n] - self.params[n] - own[n] for n in params}
        if self.mix:
            gap = {n: fix[n] - self.drift.get(n, 0.0) for n in fix}
            self.drift = {n: -self.mix * g for n, g in gap.items()}
            fix = {n: (1.0 - self.mix) * g for n, g in gap.items()}
        self.params, self.round = params, self.round + 1
        self.metas[self.round] = meta
        return fix


def throttle(step_s: float, throughput: float) -> None:
    """Run at ``throughput`` of full speed: how a power cap shows on a local cloud, whose power is modelled."""
    if throughput < 1.0:
        time.sleep(step_s * (1.0 / throughput - 1.0))


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _commit_delta(store: ObjectStore, step: str, progress: dict, feedback: ErrorFeedback | None, meta: dict) -> None:
    """Commit the pseudo-gradient (-progress), int8 with error feedback where the plan says so."""
    t = time.perf_counter()
    delta = {n: -p for n, p in progress.items()}
    name, payload = ("delta.int8.safetensors", feedback.compress(delta)) if feedback else ("delta.safetensors", delta)
    entry = put_object(store, f"{step}/{name}", to_bytes(payload))
    write_step(store, step, {}, refs={name: entry}, meta={**meta, "upload_s": time.perf_counter() - t})


def _distributed() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), world
    return 0, 1


@dataclass
class RoundWork:
    """What one round's inner steps did, as the round's commit reports it."""

    started_at: float  # wall clock, for the timeline
    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    fold_s: float = 0.0  # spent looking for and folding in a global while training (overlap)
    folded_at: int | None = None  # the step a global was folded in before, if one was
    compute_s: float = 0.0  # the round's training time, folding left out


def round_line(r: int, work: RoundWork, cap: dict, ready: dict, inner_steps: int) -> str:
    """The worker's log line for round ``r``."""
    if not work.losses:
        return f"round {r}: idle, its work shifted to the other clouds"
    capped = "" if cap["cap"] == 1.0 else f" under a {cap['cap']:.0%} power cap"
    folded = "" if work.folded_at is None else f", global {r} folded in after {work.folded_at} steps"
    return (f"round {r}: loss {work.losses[0]:.3f} -> {work.losses[-1]:.3f}, {1000 * work.compute_s / inner_steps:.1f} "
            f"ms/step{capped}, waited {ready['wait_s']:.2f} s{folded}")


class CloudTrainer:
    """One cloud's sub-task: its model, optimizer and data, and the globals folded into its model.

    ``base`` is the model at the start of the running round, so the round's progress is
    ``model - base``; ``ready`` is how long the round waited for and downloaded its start.
    """

    known: DelayedGlobal  # set by start, from global 0
    base: dict[str, torch.Tensor]
    ready: dict[str, float]

    def __init__(self, plan: Plan, cloud: str, store: ObjectStore):
        self.plan, self.cloud, self.store = plan, cloud, store
        self.spec, self.keys, me = plan.spec, plan.keys, plan.cloud(cloud)
        self.rank, self.world = _distributed()
        torch.set_num_threads(1)
        shards = b"\n".join(read_blob(store, plan.tenant, plan.shards[i]) for i in me.shards)
        self.data = torch.frombuffer(bytearray(shards), dtype=torch.uint8)
        self.model = build_model(plan.model, self.spec.seed)
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.model) if self.world > 1 else self.model
        self.share = me.share
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=local_lr(self.spec, self.share), weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(zlib.crc32(f"{self.spec.seed}/{cloud}/{self.rank}".encode()))
        self.feedback = ErrorFeedback() if plan.compression == "int8" else None
        self.cap = {"cap": 1.0, "throughput": 1.0}

    def start(self) -> None:
        """Wait for global 0 and load it: every cloud starts from the same model."""
        t0 = time.perf_counter()
        commit = wait_for_commit(self.store, self.keys.global_step(0), self.keys.stop, self.spec.round_timeout_s)
        params = from_bytes(read_object(self.store, commit, PARAMS))
        self.model.load_state_dict(params)
        self.known = DelayedGlobal(params, commit["meta"], mix=self.spec.fold_mix if self.plan.overlap else 0.0)
        self.base = _snapshot(self.model)
        self.ready = {"wait_s": time.perf_counter() - t0, "download_s": 0.0}

    def fold_in(self, commit: dict) -> None:
        """Add the correction of a newly committed global to the model and to the round's base."""
        fix = self.known.correction(global_params(self.store, commit, self.known.params), commit["meta"])
        self.model.load_state_dict({n: t + fix[n] for n, t in _snapshot(self.model).items()})
        self.base = {n: t + fix[n] for n, t in self.base.items()}  # the running round's progress stays its own

    def arrived(self) -> dict | None:
        """The next global if it is committed already (rank 0 looks; every rank learns the answer)."""
        step = self.keys.global_step(self.known.round + 1)
        try:
            commit = read_commit(self.store, step) if self.rank == 0 else None
        except StoreError:  # not arrived, as far as this step can tell: asked again at the next step
            commit = None
        if self.world > 1:
            flag = torch.tensor([commit is not None], dtype=torch.int32)
            dist.broadcast(flag, 0)
            if flag.item() and commit is None:
                commit = read_commit(self.store, step)
        return commit

    def step(self, batch: int) -> tuple[float, float]:
        """One AdamW step on ``batch`` sequences, slowed to the power cap's throughput; returns loss and seconds."""
        ts = time.perf_counter()
        loss = lm_loss(self.ddp, sample_batches(self.data, batch, self.plan.model.seq_len, self.gen))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        value = loss.item()
        throttle(time.perf_counter() - ts, self.cap["throughput"])
        return value, time.perf_counter() - ts

    def inner_steps(self) -> RoundWork:
        """Train the round's inner steps on this cloud's share, folding a global in the moment it lands."""
        t1, work = time.perf_counter(), RoundWork(started_at=time.time())
        batch = apportion(self.share, [1.0] * self.world)[self.rank] if self.share >= self.world else 1
        for group in self.opt.param_groups:  # shares may have moved: the lr follows this cloud's part of the batch
            group["lr"] = local_lr(self.spec, self.share)
        for _ in range(self.spec.inner_steps if self.share > 0 else 0):  # share 0: the work moved away, devices idle
            if self.known.pending():  # overlap: fold the global in the moment it is committed, without waiting
                tf = time.perf_counter()
                if (commit := self.arrived()) is not None:
                    self.fold_in(commit)
                    work.folded_at = len(work.losses)
                work.fold_s += time.perf_counter() - tf
            loss, seconds = self.step(batch)
            work.losses.append(loss)
            work.step_s.append(seconds)
        work.compute_s = time.perf_counter() - t1 - work.fold_s
        return work

    def train_round(self, r: int) -> None:
        """Train round ``r`` and commit its pseudo-gradient (rank 0) with the round's timings."""
        work = self.inner_steps()
        progress = {n: t - self.base[n] for n, t in _snapshot(self.model).items()}
        self.known.record(r, progress)
        self.ready["download_s"] += work.fold_s
        if self.rank != 0:
            return
        _commit_delta(self.store, self.keys.cloud_step(self.cloud, r), progress, self.feedback, {
            "round": r, "cloud": self.cloud, "samples": self.share * self.spec.inner_steps, "losses": work.losses,
            "step_s": work.step_s, "compute_s": work.compute_s, "folded_at_step": work.folded_at, "cap": self.cap["cap"],
            "started_at": work.started_at, **self.ready,
        })
        print(round_line(r, work, self.cap, self.ready, self.spec.inner_steps), flush=True)

    def start_next_round(self, r: int) -> None:
        """Fold in the globals round ``r + 1`` starts from, and take up the share and power cap they set.

        overlap: round r + 1 needs no more than global r (this round's exchange runs while it
        computes and is folded in when it lands); blocking: it starts from global r + 1.
        """
        t3, wait_s = time.perf_counter(), 0.0
        need = r if self.plan.overlap else r + 1
        while self.known.round < need:
            tw = time.perf_counter()
            commit = wait_for_commit(self.store, self.keys.global_step(self.known.round + 1), self.keys.stop,
                                     self.spec.round_timeout_s)
            wait_s += time.perf_counter() - tw
            self.fold_in(commit)
        meta = self.known.metas[need]
        self.share = meta.get("next_shares", {}).get(self.cloud, self.share)  # straggler-aware and grid-shifted shares
        self.cap = meta.get("caps", {}).get(self.cloud, {"cap": 1.0, "throughput": 1.0})  # a grid request's power cap
        self.base = _snapshot(self.model)
        self.ready = {"wait_s": wait_s, "download_s": time.perf_counter() - t3 - wait_s}


def train(plan: Plan, cloud: str, store: ObjectStore) -> None:
    """Train ``cloud``'s part of every round of the run, committing each round's pseudo-gradient to ``store``."""
    trainer = CloudTrainer(plan, cloud, store)
    trainer.start()
    for r in range(plan.spec.rounds):
        trainer.train_round(r)
        if r < plan.spec.rounds - 1:
            trainer.start_next_round(r)
    if trainer.world > 1:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--cloud", required=True)
    parser.add_argument("--federation", default=None)
    args = parser.parse_args(argv)
    fed = load_federation(args.federation)
    store = open_store(fed.cloud(args.cloud), args.tenant)
    plan = Plan.load(store, args.tenant, args.run_id)
    try:
        train(plan, args.cloud, store)
    except Stopped as exc:
        print(f"stopping: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
