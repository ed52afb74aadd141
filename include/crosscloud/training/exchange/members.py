"""Who is in a round: one write-once record in the run's home store that every cloud reduces by.

Each cloud, once it has committed its pseudo-gradient, polls the other clouds'
commits. The first cloud to see every expected cloud committed, or a cloud
past its patience while others have committed, proposes the round's record
with a conditional write; whoever loses the race reads the winner's. The
record names each contribution by its committed object (key, size, sha256),
so every cloud reduces exactly the same bytes, and it fixes the round's
decisions (lost clouds, the next shares and power caps), so nothing that
differs between the clouds' clocks or reads can make their globals differ.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from crosscloud.grid.demand_response import read_directives
from crosscloud.pool.partition import apportion, rebalance_shares
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectNotFound, ObjectStore, StoreError
from crosscloud.store.commit import read_commit
from crosscloud.training.exchange.transfer import Poll
from crosscloud.training.stopped import Stopped

DELTAS = ("delta.int8.safetensors", "delta.safetensors")
# a cloud is lost when it has not committed a round PATIENCE x the slowest of the last rounds after the
# round began while others have; never sooner than PATIENCE_FLOOR_S: a loaded machine's noise, or a store
# outage that every cloud's exchange waits out with retries, is not a loss (a dead sub-task is, at once: the
# watcher says so)
PATIENCE, PATIENCE_FLOOR_S = 4.0, 30.0
# a sub-task started again after it died needs its start-up (interpreter, torch, program, resume) on top of that
RESTART_GRACE_S = 60.0
WATCH_EVERY_S = 2.0


@dataclass
class Members:
    """Round ``round``'s contributions and decisions, as every cloud reduces it."""

    round: int
    contributions: dict[str, dict]  # cloud -> {"name", "entry" (key, size, sha256), "meta" (its commit's record)}
    shares: dict[str, int]  # the shares of the global batch the clouds trained this round with
    lost: dict[str, str]  # clouds lost in this round, with why
    gone: dict[str, str]  # every cloud lost so far in the run
    next_shares: dict[str, int]
    caps: dict[str, dict]
    evaluator: str  # the cloud that evaluates the round's global, where one is due
    decided_at: float
    decided_by: str
    walls: list[float] = field(default_factory=list)  # the last rounds' wall times, for patience
    pause: str = ""  # the run pauses after this round: the pause's id (the watcher's notes ask for it)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Members:
        return cls(**json.loads(raw))

    @property
    def wall_s(self) -> float:
        return self.walls[-1] if self.walls else 0.0


def read_members(home: ObjectStore, plan: Plan, round_: int) -> Members | None:
    try:
        return Members.from_bytes(home.get(plan.keys.members(round_)))
    except ObjectNotFound:
        return None


def read_watch(home: ObjectStore, plan: Plan) -> dict:
    """The watcher's notes: ``lost`` {cloud: why}, ``draining`` [clouds], ``restarted_at`` {cloud: time}."""
    try:
        return json.loads(home.get(plan.keys.watch))
    except ObjectNotFound:
        return {}


def planned_shares(plan: Plan) -> dict[str, int]:
    return {c.name: c.share for c in plan.clouds}


def shares_source(plan: Plan, round_: int) -> int:
    """The round whose record set the shares ``round_`` trains with: a worker takes them from the global it starts from."""
    return round_ - (2 if plan.overlap else 1)


def patience_s(walls: list[float], round_timeout_s: float) -> float:
    """How long a cloud may stay behind the others in a round before it counts as lost, from measured rounds."""
    if not walls:  # nothing measured yet: only the job's own limit
        return round_timeout_s
    return min(round_timeout_s, max(PATIENCE_FLOOR_S, PATIENCE * max(walls[-3:])))


def cloud_record(meta: dict) -> dict:
    """What a round's record keeps of a cloud's commit."""
    steps = meta.get("step_s") or [0.0]  # a cloud whose work was shifted away trains no step
    keep = ("wait_s", "download_s", "compute_s", "upload_s", "losses", "step_s", "started_at", "folded_at_step",
            "exchange", "samples", "peak_memory_gb", "batch", "commit_s",  # commit_s: state and delta, written beside
            "eval_s", "eval_cpu_s", "cpu_s", "train_cpu_s")  # what the program and the SDK cost
    return {**{k: meta.get(k) for k in keep}, "mean_step_s": sum(steps) / len(steps), "cap": meta.get("cap", 1.0)}


def global_report(meta: dict) -> dict:
    """What a cloud's commit of a global says of the exchange that made it: its figures, digest and refusals."""
    return {**meta.get("exchange", {}), "digest": meta.get("digest"), "refused": meta.get("refused", {})} if meta else {}


class RoundDecider:
    """One cloud's side of agreeing on each round's members; ``stores`` are every run cloud's, as this cloud reaches them."""

    def __init__(self, plan: Plan, cloud: str, stores: dict[str, ObjectStore], log=print):
        self.plan, self.cloud, self.stores, self.log = plan, cloud, stores, log
        self.home = stores[plan.coordinator_cloud]
        self.known: dict[int, Members] = {}

    def record(self, round_: int) -> Members | None:
        """The record of ``round_`` (None before round 0 or while undecided), read once and kept."""
        if round_ < 0:
            return None
        if round_ not in self.known:
            found = read_members(self.home, self.plan, round_)
            if found is None:
                return None
            self.known[round_] = found
            self.known = {r: m for r, m in self.known.items() if r >= round_ - 2}
        return self.known[round_]

    def shares(self, round_: int) -> dict[str, int]:
        source = self.record(shares_source(self.plan, round_))
        return source.next_shares if source else planned_shares(self.plan)

    def decide(self, round_: int) -> Members:
        """Wait until round ``round_``'s record exists, proposing it when this cloud can; returns it."""
        before = self.record(round_ - 1)
        gone = dict(before.gone) if before else {}
        expected = [c.name for c in self.plan.clouds if c.name not in gone]
        started = before.decided_at if before else time.time()
        walls = before.walls if before else []
        pending, commits, watch, watched_at = set(expected), {}, None, time.monotonic()
        poll, timeout = Poll(), self.plan.spec.round_timeout_s
        while True:
            if (found := self.record(round_)) is not None:
                return found
            for c in sorted(pending):
                if (commit := self._commit(c, round_)) is not None:
                    commits[c] = commit
                    pending.discard(c)
                    poll.progress()
            read_now = bool(pending) and time.monotonic() - watched_at > WATCH_EVERY_S
            if read_now:
                watch, watched_at = read_watch(self.home, self.plan), time.monotonic()
                if self.stores[self.cloud].exists(self.plan.keys.stop):
                    raise Stopped(f"run stopped while round {round_}'s members were awaited")
            away = self._away(pending, watch or {}, started, patience_s(walls, timeout)) if commits else {}
            if commits and not pending - set(away):
                if watch is None:  # every commit came before the watcher's notes (draining) were read
                    watch = read_watch(self.home, self.plan)
                return self._propose(round_, commits, away, gone, walls, watch)
            if time.time() - started > timeout:
                raise Stopped(f"round {round_}: no pseudo-gradient from {sorted(pending)} within {timeout:.0f} s")
            # the home store's requests of this look: the record, a pending commit there, the watcher's notes
            poll.sleep(requests=1 + (self.plan.coordinator_cloud in pending) + read_now)

    def _commit(self, cloud: str, round_: int) -> dict | None:
        try:
            return read_commit(self.stores[cloud], self.plan.keys.cloud_step(cloud, round_))
        except StoreError as exc:  # a store failing past its retry deadline is a slow cloud, not a crash
            self.log(f"round {round_}: cloud {cloud}: {exc}; polling on")
            return None

    @staticmethod
    def _away(pending: set[str], watch: dict, started: float, patience: float) -> dict[str, str]:
        """Pending clouds that will not commit: ended for good (the watcher says so) or past their patience."""
        now, away = time.time(), {}
        for c in sorted(pending):
            if c in watch.get("lost", {}):
                away[c] = watch["lost"][c]
                continue
            restarted = watch.get("restarted_at", {}).get(c, 0.0)
            since, grace = (restarted, RESTART_GRACE_S) if restarted > started else (started, 0.0)
            if now - since > patience + grace:
                away[c] = (f"no pseudo-gradient {now - started:.1f} s after the round began while others committed "
                           f"(patience {patience:.1f} s from measured rounds)")
        return away

    def _propose(self, round_: int, commits: dict[str, dict], away: dict[str, str], gone: dict[str, str],
                 walls: list[float], watch: dict) -> Members:
        now = time.time()
        before = self.record(round_ - 1)
        gone = {**gone, **away}
        shares = self.shares(round_)
        contributions = {}
        for c, commit in sorted(commits.items()):
            name = next((n for n in DELTAS if n in commit["objects"]), None)
            contributions[c] = {"name": name, "entry": commit["objects"].get(name), "meta": cloud_record(commit["meta"])}
        evaluator = self.plan.coordinator_cloud if self.plan.coordinator_cloud in contributions else min(contributions)
        nxt, caps = self._next_round(shares, contributions, set(gone), set(watch.get("draining", [])))
        members = Members(round=round_, contributions=contributions, shares=shares, lost=away, gone=gone,
                          next_shares=nxt, caps=caps, evaluator=evaluator, decided_at=now, decided_by=self.cloud,
                          walls=(walls + [now - before.decided_at])[-3:] if before else [],
                          pause=(watch.get("pause") or {}).get("id", ""))
        if not self.home.put_if_absent(self.plan.keys.members(round_), members.to_bytes()):
            members = read_members(self.home, self.plan, round_)  # another cloud decided first: its record holds
        self.known[round_] = members
        return members

    def _next_round(self, shares: dict[str, int], contributions: dict[str, dict], lost: set[str],
                    draining: set[str]) -> tuple[dict[str, int], dict[str, dict]]:
        """Shares and power caps for the next round: measured speeds (``adapt_shares``), grid directives, departures.

        A cloud told to shift, draining or lost trains nothing (share 0: its
        devices idle) and its share goes to the run's other clouds by
        throughput; a throttled cloud runs under the cap, at the throughput the
        DVFS curve keeps. With no directive left, a cloud gets its planned share back.
        """
        plan, spec, planned = self.plan, self.plan.spec, planned_shares(self.plan)
        directives = read_directives(self.home, plan.keys.root)
        away = {c for c, d in directives.items() if d["kind"] == "shift" and c in planned} | (draining & set(planned))
        if away and not set(planned) - away - lost:  # work cannot leave every cloud: the run keeps training
            self.log(f"grid directives and draining would move the work away from every cloud of the run; ignoring {sorted(away)}")
            away = set()
        away |= lost
        if away:
            keep = [c.name for c in plan.clouds if c.name not in away]
            nxt = {**dict(zip(keep, apportion(spec.global_batch, [plan.cloud(c).throughput for c in keep]))),
                   **{c: 0 for c in away}}
        elif spec.adapt_shares and all(n > 0 for n in shares.values()) and set(contributions) >= set(shares):
            nxt = rebalance_shares(shares, {c: contributions[c]["meta"]["mean_step_s"] for c in shares}, spec.global_batch)
        else:
            nxt = planned
        caps = {c: {"cap": d["cap"], "throughput": d["throughput"]} for c, d in directives.items() if d["kind"] == "throttle"}
        return nxt, caps
