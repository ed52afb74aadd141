"""The pieces of a round on a cloud: waiting for a global, folding a late global in, and the round's record."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

from crosscloud.store.base import ObjectStore, StoreError
from crosscloud.store.commit import read_commit
from crosscloud.training.exchange.transfer import Poll
from crosscloud.training.stopped import Stopped


def wait_for_commit(store: ObjectStore, step: str, stop_key: str, timeout_s: float) -> dict:
    """Poll until ``step`` is committed; give up when the run is stopped or stalls."""
    deadline, poll = time.monotonic() + timeout_s, Poll()
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
            raise Stopped(f"no commit of {step} within {timeout_s:.0f} s")
        poll.sleep(requests=2)  # the commit and the stop marker, both in this store


class DelayedGlobal:
    """Folds each global checkpoint into a model that has trained on without it.

    Round r's exchange runs while round r + 1 computes, so global r + 1 (every cloud's round r)
    arrives while this cloud is already past it: its model is global r plus its own progress
    of rounds r, r + 1, ... . Global r + 1 is folded in the moment it is ready, usually a
    few steps into round r + 1, by swapping this cloud's own round-r progress for what the
    outer step made of all clouds' (``correct``, tensor by tensor). Waiting only happens when
    it is still missing a whole round later.
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

    def begin(self) -> None:
        """Global ``self.round + 1`` arrived: its tensors follow through ``correct``, then ``end``."""
        self._own = self.own.pop(self.round)
        self._drift: dict[str, torch.Tensor] = {}

    def correct(self, name: str, new: torch.Tensor) -> torch.Tensor:
        """What to add to the model's ``name`` (and to its round base) for its new global value ``new``.

        The whole correction puts the model where blocking rounds would have it (the global
        plus the running round's progress). With ``mix`` (Streaming DiLoCo's mixing factor)
        the model keeps that share of its distance from there, so the steps it already took
        from its own unaveraged point are not undone at once; the globals, built only from
        progress, do not change.
        """
        fix = new - self.params[name] - self._own[name]
        self.params[name] = new
        if self.mix:
            gap = fix - self.drift[name] if name in self.drift else fix
            self._drift[name] = gap * -self.mix
            fix = gap * (1.0 - self.mix)
        return fix

    def end(self, meta: dict) -> None:
        self.round += 1
        if self.mix:
            self.drift = self._drift
        self.metas = {r: m for r, m in self.metas.items() if r >= self.round - 1}
        self.metas[self.round] = meta


def throttle(step_s: float, throughput: float) -> None:
    """Run at ``throughput`` of full speed: how a power cap shows on a local cloud, whose power is modelled."""
    if throughput < 1.0:
        time.sleep(step_s * (1.0 / throughput - 1.0))


@dataclass
class RoundWork:
    """What one round's inner steps did, as the round's commit reports it."""

    started_at: float  # wall clock, for the timeline
    losses: list = field(default_factory=list)  # detached loss tensors (or floats): read once, at the round's end
    step_s: list[float] = field(default_factory=list)
    fold_s: float = 0.0  # spent looking for and folding in a global while training (overlap)
    folded_at: int | None = None  # the step a global was folded in before, if one was
    compute_s: float = 0.0  # the round's training time, folding left out
    train_cpu_s: float = 0.0  # the program's CPU on the training thread between diloco.step calls
    state_s: float = 0.0  # snapshotting the cloud's own state, which a restart resumes from (written beside)


def round_line(r: int, losses: list[float], work: RoundWork, cap: dict, ready: dict, inner_steps: int) -> str:
    """The sub-task's log line for round ``r``."""
    if not losses:
        return f"round {r}: idle, its work shifted to the other clouds"
    capped = "" if cap["cap"] == 1.0 else f" under a {cap['cap']:.0%} power cap"
    folded = "" if work.folded_at is None else f", global {r} folded in after {work.folded_at} steps"
    return (f"round {r}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, {1000 * work.compute_s / inner_steps:.1f} "
            f"ms/step{capped}, waited {ready['wait_s']:.2f} s{folded}")
