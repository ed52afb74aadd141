"""DiLoCo over a team's own model and inner optimizer: ``crosscloud.sdk.DiLoCo``.

The program keeps its loop; it calls ``diloco.step(loss=...)`` after each inner
optimizer step. Every ``inner_steps`` steps the cloud's pseudo-gradient
(global - local, from fp32 parameters on any device) is committed to its own
store, int8 with error feedback where the plan says so, and each new global is
folded in: the moment it lands when rounds overlap, before the next round when
they do not. The plan's shares and power caps take effect at each round's
start; a round whose share is 0 is committed empty without the loop's help.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from crosscloud.core.job import local_lr
from crosscloud.store.base import StoreError
from crosscloud.store.commit import put_object, read_commit, write_step
from crosscloud.store.tensors import to_bytes
from crosscloud.training.checkpoint import global_params
from crosscloud.training.compression import ErrorFeedback
from crosscloud.training.program import ProgramError
from crosscloud.training.resume import CloudState, save_state
from crosscloud.training.rounds import DelayedGlobal, RoundWork, round_line, throttle, wait_for_commit
from crosscloud.training.session import Run, load_params, parameters, rank_batch


def _fp32(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in parameters(model).items()}


class DiLoCo:
    """Rounds of ``inner_steps`` steps of the user's optimizer, exchanged through the cloud's store.

    Use as a context manager around the training loop; ``done`` turns true once the
    run's last round is committed, and the loop stops there.
    """

    def __init__(self, run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.run, self.model, self.opt = run, model, optimizer
        self.plan, self.spec, self.keys = run.plan, run.plan.spec, run.plan.keys
        self.feedback = ErrorFeedback() if self.plan.compression == "int8" else None
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.round, self.steps, self.done = 0, 0, False
        self.share = self.plan.cloud(run.cloud).share
        self.cap = {"cap": 1.0, "throughput": 1.0}
        self.known: DelayedGlobal
        self.base: dict[str, torch.Tensor] = {}
        self.ready = {"wait_s": 0.0, "download_s": 0.0}

    # -- the program's side --------------------------------------------------------
    def __enter__(self) -> DiLoCo:
        if not self.run.resumed:  # a program that does not resume still gets its model and optimizer back
            self.run.resume(self.model, self.opt)
        if self.run.state is None:
            self._start()
        else:
            self._restore(self.run.state)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """After each inner optimizer step: record it, fold in a global that landed, end the round after H steps."""
        if self.done:
            return
        seconds = time.perf_counter() - self._last
        throttle(seconds, self.cap["throughput"])
        self.work.step_s.append(time.perf_counter() - self._last)
        self.work.losses.append(loss.detach() if torch.is_tensor(loss) else (math.nan if loss is None else float(loss)))
        self.steps += 1
        if self.plan.overlap and self.known.pending():  # fold the global in the moment it is committed
            tf = time.perf_counter()
            if (commit := self._arrived()) is not None:
                self._fold_in(commit)
                self.work.folded_at = len(self.work.losses)
            self.work.fold_s += time.perf_counter() - tf
        if len(self.work.losses) == self.spec.inner_steps:
            self._end_round()
            self._skip_idle()
        self._last = time.perf_counter()

    # -- rounds ----------------------------------------------------------------------
    def _start(self) -> None:
        """Wait for global 0 and load it: every cloud starts from the same model."""
        t0 = time.perf_counter()
        commit = wait_for_commit(self.run.store, self.keys.global_step(0), self.keys.stop, self.spec.round_timeout_s)
        params = global_params(self.run.store, commit, {})
        load_params(self.model, params)
        self.known = DelayedGlobal(params, commit["meta"], mix=self.spec.fold_mix if self.plan.overlap else 0.0)
        self.ready = {"wait_s": time.perf_counter() - t0, "download_s": 0.0}
        self._begin_round(0)
        self._skip_idle()

    def _restore(self, state: CloudState) -> None:
        """Go on after the saved round: commit it if the commit is missing, then start the next one."""
        self.known = DelayedGlobal(state.known_params, {}, mix=self.spec.fold_mix if self.plan.overlap else 0.0)
        self.known.round, self.known.own, self.known.drift, self.known.metas = (
            state.known_round, state.own, state.drift, state.metas)
        self.round, self.steps, self.share = state.round, state.steps, state.share
        if self.feedback:
            self.feedback.residual = state.residual
        self._commit(state.round, state.own[state.round], self._restored_work(state))
        self._after_round(state.round)
        self._skip_idle()

    @staticmethod
    def _restored_work(state: CloudState) -> RoundWork:
        """A round trained before the restart: its timings are gone with the process that measured them."""
        return RoundWork(started_at=time.time())

    def _skip_idle(self) -> None:
        """Commit the rounds whose share is 0 (the work moved away; the devices idle) without the loop."""
        while not self.done and self.share == 0:
            self._end_round()

    def _begin_round(self, r: int) -> None:
        """Round ``r`` starts: its base, this rank's batch and lr, and an empty record; idle rounds pass at once."""
        self.round = r
        self.base = _fp32(self.model)
        self.run.batch_size = rank_batch(self.share, self.run.rank, self.run.world_size)
        if self.spec.local_lr_scaling != "none":  # the lr follows this cloud's part of the global batch
            factor = local_lr(self.spec, self.share) / self.spec.inner_lr
            for group, lr in zip(self.opt.param_groups, self.base_lrs):
                group["lr"] = lr * factor
        self.work = RoundWork(started_at=time.time())
        self._t_round = self._last = time.perf_counter()

    def _end_round(self) -> None:
        """Commit round ``self.round``'s pseudo-gradient, after saving the state a restart goes on from."""
        work, r = self.work, self.round
        work.compute_s = time.perf_counter() - self._t_round - work.fold_s
        params = _fp32(self.model)  # one copy of the round's end, for its progress and the saved state
        progress = {n: (p - self.base[n]).cpu() for n, p in params.items()}
        self.known.record(r, progress)
        self.ready["download_s"] += work.fold_s
        if self.run.rank == 0:
            ts = time.perf_counter()
            save_state(self.run.store, self.keys, self.run.cloud, self._state(r, params))
            work.state_s = time.perf_counter() - ts
        self._commit(r, progress, work)
        self._after_round(r)

    def _state(self, r: int, params: dict[str, torch.Tensor]) -> CloudState:
        return CloudState(
            round=r, steps=self.steps, params={n: t.cpu() for n, t in params.items()},
            optimizer=self.opt.state_dict(), known_round=self.known.round, known_params=self.known.params,
            own=dict(self.known.own), drift=self.known.drift, metas=self.known.metas,
            residual=dict(self.feedback.residual) if self.feedback else {}, share=self.share)

    def _commit(self, r: int, progress: dict[str, torch.Tensor], work: RoundWork) -> None:
        """Rank 0 commits round ``r`` unless it is committed already; a committed step is never written again."""
        step = self.keys.cloud_step(self.run.cloud, r)
        delta = {n: -p for n, p in progress.items()}
        self.run.rounds_committed = r + 1  # every rank counts it: the program's end is checked on each
        if self.run.rank != 0:
            return
        t = time.perf_counter()
        name, payload = (("delta.int8.safetensors", self.feedback.compress(delta)) if self.feedback
                         else ("delta.safetensors", delta))
        losses = [float(x) for x in (torch.stack(work.losses).tolist() if work.losses and torch.is_tensor(work.losses[0])
                                     else work.losses)]
        if read_commit(self.run.store, step) is None:
            entry = put_object(self.run.store, f"{step}/{name}", to_bytes(payload))
            write_step(self.run.store, step, {}, refs={name: entry}, meta={
                "round": r, "cloud": self.run.cloud, "samples": self.share * self.spec.inner_steps,
                "losses": losses, "step_s": work.step_s, "compute_s": work.compute_s, "folded_at_step": work.folded_at,
                "cap": self.cap["cap"], "started_at": work.started_at, **self.ready,
                "upload_s": time.perf_counter() - t + work.state_s})  # the round's writes: its state and its delta
        trained = [x for x in losses if not math.isnan(x)]
        line = (f"round {r}: trained before the restart, committed" if not trained and self.share > 0 else
                round_line(r, trained, work, self.cap, self.ready, self.spec.inner_steps))
        print(line, flush=True)

    def _after_round(self, r: int) -> None:
        if r >= self.spec.rounds - 1:
            self.done = True
            return
        self._next_round(r)

    def _next_round(self, r: int) -> None:
        """Fold in the globals round ``r + 1`` starts from, and take up the share and power cap they set.

        overlap: round r + 1 needs no more than global r (this round's exchange runs while it
        computes and is folded in when it lands); blocking: it starts from global r + 1.
        """
        t3, wait_s = time.perf_counter(), 0.0
        need = r if self.plan.overlap else r + 1
        while self.known.round < need:
            tw = time.perf_counter()
            commit = wait_for_commit(self.run.store, self.keys.global_step(self.known.round + 1), self.keys.stop,
                                     self.spec.round_timeout_s)
            wait_s += time.perf_counter() - tw
            self._fold_in(commit)
        meta = self.known.metas[need]
        self.share = meta.get("next_shares", {}).get(self.run.cloud, self.share)  # moved shares
        self.cap = meta.get("caps", {}).get(self.run.cloud, {"cap": 1.0, "throughput": 1.0})  # a grid request's cap
        self.ready = {"wait_s": wait_s, "download_s": time.perf_counter() - t3 - wait_s}
        self._begin_round(r + 1)

    def _fold_in(self, commit: dict) -> None:
        """Add the correction of a newly committed global to the model and to the round's base."""
        fix = self.known.correction(global_params(self.run.store, commit, self.known.params), commit["meta"])
        with torch.no_grad():
            for name, p in parameters(self.model).items():
                p.add_(fix[name].to(device=p.device, dtype=p.dtype))
        self.base = {n: t + fix[n].to(t.device) for n, t in self.base.items()}  # the round's progress stays its own

    def _arrived(self) -> dict | None:
        """The next global if it is committed already (rank 0 looks; every rank learns the answer)."""
        step = self.keys.global_step(self.known.round + 1)
        try:
            commit = read_commit(self.run.store, step) if self.run.rank == 0 else None
        except StoreError:  # not arrived, as far as this step can tell: asked again at the next step
            commit = None
        if self.run.world_size > 1:
            flag = torch.tensor([commit is not None], dtype=torch.int32, device=self.run.device)
            dist.broadcast(flag, 0)
            if flag.item() and commit is None:
                commit = read_commit(self.run.store, step)
        return commit


def check_finished(run: Run | None, program: str) -> None:
    """After the program returned: it must have committed every round of the run."""
    rounds = run.plan.spec.rounds if run else 0
    if run is None:
        raise ProgramError(f"program {program} returned without calling crosscloud.sdk.init()")
    if run.rounds_committed < rounds:
        raise ProgramError(f"program {program} returned after committing {run.rounds_committed} of {rounds} rounds "
                           f"on cloud {run.cloud}: its loop must call diloco.step() after every optimizer step and "
                           "stop only when diloco.done")
