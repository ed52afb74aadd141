"""The soak's checker: every invariant judged over the whole history, and the benchmark's figures.

Each invariant is one small function from the events to the violations it finds, so a planted violation
is named by its invariant and subject. Times are epoch seconds; the end of the history is its
``HistoryEnded`` (the latest, or the latest time any event mentions when the harness died before it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from crosscloud.soak.history import (
    BaselineLoss,
    CloudCapacity,
    Event,
    FaultInjected,
    FinalLoss,
    GlobalCommitted,
    HistoryEnded,
    ObjectCommitted,
    ObjectObserved,
    ObjectRetired,
    ReservationHeld,
    RoundSpent,
    RunEnded,
    RunSubmitted,
    SubtaskLived,
)

INVARIANTS = (
    "run_ends", "committed_unchanged", "devices_exclusive", "reservation_bounded", "subtask_bounded",
    "globals_agree", "loss_close",
)


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which one, about what (a run, an object, a cloud), what was seen, and when."""

    invariant: str
    subject: str
    detail: str
    t: float

    def __str__(self) -> str:
        return f"{self.invariant} {self.subject} at t={self.t:.3f}: {self.detail}"


@dataclass
class Report:
    """What the checker found: the violations and the figures of the benchmark's line."""

    violations: list[Violation] = field(default_factory=list)
    faults_injected: int = 0
    runs_submitted: int = 0
    runs_completed: int = 0
    committed_bytes_lost: int = 0
    leaked_reservations: int = 0
    orphan_subtasks: int = 0
    goodput: float = 0.0

    @property
    def invariant_violations(self) -> int:
        return len(self.violations)

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        """The benchmark's last line."""
        return (
            f"faults_injected={self.faults_injected} runs_submitted={self.runs_submitted} "
            f"runs_completed={self.runs_completed} committed_bytes_lost={self.committed_bytes_lost} "
            f"invariant_violations={self.invariant_violations} leaked_reservations={self.leaked_reservations} "
            f"orphan_subtasks={self.orphan_subtasks} goodput={self.goodput:.3f}"
        )


def _of(events: list[Event], cls: type | tuple[type, ...]) -> list:
    """The events of a kind (or kinds), in history order."""
    return [e for e in events if isinstance(e, cls)]


def history_end(events: list[Event]) -> float:
    """The latest ``HistoryEnded``, or else the latest time any event mentions (the harness died first)."""
    ends = [e.t for e in _of(events, HistoryEnded)]
    if ends:
        return max(ends)
    times = [x for e in events for x in (e.t, getattr(e, "start", None), getattr(e, "end", None)) if x is not None]
    return max(times, default=0.0)


def run_ends_at(events: list[Event]) -> dict[str, float]:
    """Each ended run's first end: a later, conflicting end is ``run_ends``'s business."""
    out: dict[str, float] = {}
    for e in sorted(_of(events, RunEnded), key=lambda e: e.t):
        out.setdefault(e.run, e.t)
    return out


def run_ends(events: list[Event], end: float) -> list[Violation]:
    """Every submitted run ends, succeeded or failed with a stated reason; none hangs or ends twice apart."""
    out = []
    endings: dict[str, list[RunEnded]] = defaultdict(list)
    for e in sorted(_of(events, RunEnded), key=lambda e: e.t):
        endings[e.run].append(e)
    for s in sorted({s.run: s for s in _of(events, RunSubmitted)}.values(), key=lambda s: s.t):
        ended = endings.get(s.run)
        if not ended:
            out.append(Violation("run_ends", s.run, f"hangs: submitted at t={s.t:.3f}, no end by the end of "
                                 f"the history at t={end:.3f}", end))
            continue
        first = ended[0]
        if first.state not in ("succeeded", "failed"):
            out.append(Violation("run_ends", s.run, f"ended in unknown state {first.state!r}", first.t))
        elif first.state == "failed" and not first.reason.strip():
            out.append(Violation("run_ends", s.run, "failed without a stated reason", first.t))
        for later in ended[1:]:
            if later.state != first.state:
                out.append(Violation("run_ends", s.run, f"ended {first.state} at t={first.t:.3f}, then "
                                     f"{later.state} at t={later.t:.3f}", later.t))
    return out


def committed_unchanged(events: list[Event]) -> tuple[list[Violation], int]:
    """No committed object changes or vanishes unless retired first; returns the violations and bytes lost.

    Each object is judged once (its first loss or change), and its committed size counts as lost.
    """
    out, lost = [], 0
    committed: dict[tuple[str, str], ObjectCommitted] = {}
    broken: set[tuple[str, str]] = set()
    for e in sorted(_of(events, (ObjectCommitted, ObjectObserved, ObjectRetired)), key=lambda e: e.t):
        key = (e.store, e.key)
        if isinstance(e, ObjectRetired):
            committed.pop(key, None)
            broken.discard(key)
            continue
        was = committed.get(key)
        if isinstance(e, ObjectCommitted) and was is None:
            committed[key] = e
            continue
        if was is None or key in broken or (e.sha256, e.size) == (was.sha256, was.size):
            continue
        broken.add(key)
        lost += was.size
        seen = "missing" if e.sha256 is None else f"sha256 {e.sha256} size {e.size}"
        what = "recommitted as" if isinstance(e, ObjectCommitted) else "found"
        out.append(Violation("committed_unchanged", f"{e.store}/{e.key}", f"committed at t={was.t:.3f} as sha256 "
                             f"{was.sha256} size {was.size}, {what} {seen}", e.t))
    return out, lost


def _capacity_at(caps: list[CloudCapacity], t: float) -> int:
    """The cloud's latest declared capacity at ``t`` (its first one before any was declared)."""
    now = [c for c in caps if c.t <= t]
    return (now[-1] if now else caps[0]).devices


def _overheld(cloud: str, subs: list[SubtaskLived], caps: list[CloudCapacity], grace_s: float,
              end: float) -> list[Violation]:
    """Stretches where sub-tasks of two or more runs together hold more than the cloud has, past the grace."""
    until = {id(s): end if s.end is None else s.end for s in subs}
    points = sorted({s.start for s in subs} | set(until.values()) | {c.t for c in caps} | {end})
    out, since, runs = [], None, set()

    def close(at: float) -> None:
        if at - since > grace_s:
            out.append(Violation("devices_exclusive", cloud, f"runs {', '.join(sorted(runs))} held more than its "
                                 f"devices from t={since:.3f} for {at - since:.3f} s (grace {grace_s} s)", at))

    for a in (p for p in points if p <= end):
        live = [s for s in subs if s.start <= a < until[id(s)]]
        here = {s.run for s in live}
        if len(here) > 1 and sum(s.devices for s in live) > _capacity_at(caps, a):
            since, runs = (a, set(here)) if since is None else (since, runs | here)
        elif since is not None:
            close(a)
            since, runs = None, set()
    if since is not None:
        close(end)
    return out


def devices_exclusive(events: list[Event], grace_s: float, end: float) -> list[Violation]:
    """No device is held by two live runs for longer than the lease grace (per cloud, against its capacity)."""
    caps: dict[str, list[CloudCapacity]] = defaultdict(list)
    for c in sorted(_of(events, CloudCapacity), key=lambda c: c.t):
        caps[c.cloud].append(c)
    subs: dict[str, list[SubtaskLived]] = defaultdict(list)
    for s in _of(events, SubtaskLived):
        subs[s.cloud].append(s)
    out = []
    for cloud in sorted(subs):
        if not caps.get(cloud):
            out.append(Violation("devices_exclusive", cloud, "sub-tasks ran on a cloud whose capacity the history "
                                 "never gives", subs[cloud][0].start))
            continue
        out.extend(_overheld(cloud, subs[cloud], caps[cloud], grace_s, end))
    return out


def reservation_bounded(events: list[Event], grace_s: float, end: float) -> list[Violation]:
    """No reservation outlives its run's end plus its lease and the grace; one held at the end is a leak.

    The harness drains for a lease and a grace before it ends the history, so anything still held then leaked.
    """
    ended, out = run_ends_at(events), []
    for r in _of(events, ReservationHeld):
        if r.run not in ended:
            continue  # a run that never ended is run_ends's violation
        bound = ended[r.run] + r.lease_s + grace_s
        subject = f"{r.run}@{r.cloud}"
        if r.end is None:
            out.append(Violation("reservation_bounded", subject, f"leaked: {r.devices} devices still held at the end "
                                 f"of the history (t={end:.3f}); the run ended at t={ended[r.run]:.3f}", end))
        elif r.end > bound:
            out.append(Violation("reservation_bounded", subject, f"held until t={r.end:.3f}, past the run's end "
                                 f"t={ended[r.run]:.3f} + lease {r.lease_s} s + grace {grace_s} s", r.end))
    return out


def subtask_bounded(events: list[Event], grace_s: float, end: float) -> list[Violation]:
    """No sub-task outlives its run's end plus the grace; one alive at the end of an ended run is an orphan."""
    ended, out = run_ends_at(events), []
    for s in _of(events, SubtaskLived):
        if s.run not in ended:
            continue
        subject = f"{s.run}@{s.cloud}"
        if s.end is None:
            out.append(Violation("subtask_bounded", subject, f"orphan: still alive at the end of the history "
                                 f"(t={end:.3f}); the run ended at t={ended[s.run]:.3f}", end))
        elif s.end > ended[s.run] + grace_s:
            out.append(Violation("subtask_bounded", subject, f"alive until t={s.end:.3f}, past the run's end "
                                 f"t={ended[s.run]:.3f} + grace {grace_s} s", s.end))
    return out


def globals_agree(events: list[Event]) -> list[Violation]:
    """Every cloud's global of a run's round has the same digest."""
    rounds: dict[tuple[str, int], list[GlobalCommitted]] = defaultdict(list)
    for g in _of(events, GlobalCommitted):
        rounds[(g.run, g.round)].append(g)
    out = []
    for (run, rnd), gs in sorted(rounds.items()):
        if len({g.digest for g in gs}) > 1:
            seen = ", ".join(f"{g.cloud}={g.digest}" for g in sorted(gs, key=lambda g: (g.cloud, g.t)))
            out.append(Violation("globals_agree", f"{run} round {rnd}", f"digests differ: {seen}",
                                 max(g.t for g in gs)))
    return out


def loss_close(events: list[Event], tolerance: float) -> list[Violation]:
    """Each completed run's final loss is within ``tolerance`` (relative) of its job's fault-free baseline."""
    base = {b.job: b for b in sorted(_of(events, BaselineLoss), key=lambda b: b.t)}
    final = {f.run: f for f in sorted(_of(events, FinalLoss), key=lambda f: f.t)}
    out = []
    for done in _completed(events):
        f = final.get(done.run)
        if f is None:
            out.append(Violation("loss_close", done.run, "completed without a final loss in the history", done.t))
        elif f.job not in base:
            out.append(Violation("loss_close", done.run, f"no fault-free baseline of job {f.job!r}", f.t))
        elif abs(f.loss - base[f.job].loss) > tolerance * abs(base[f.job].loss):
            out.append(Violation("loss_close", done.run, f"final loss {f.loss:.6g} is not within {tolerance:.1%} "
                                 f"of the baseline {base[f.job].loss:.6g} of job {f.job!r}", f.t))
    return out


def _completed(events: list[Event]) -> list[RunEnded]:
    """The first end of each submitted run that succeeded."""
    submitted = {s.run for s in _of(events, RunSubmitted)}
    firsts: dict[str, RunEnded] = {}
    for e in sorted(_of(events, RunEnded), key=lambda e: e.t):
        firsts.setdefault(e.run, e)
    return [e for run, e in firsts.items() if run in submitted and e.state == "succeeded"]


def goodput(events: list[Event], end: float) -> float:
    """Device-seconds of kept rounds over all device-seconds of sub-tasks (0 when no sub-task ran)."""
    spent = sum(s.devices * ((end if s.end is None else s.end) - s.start) for s in _of(events, SubtaskLived))
    kept = sum(r.devices * (r.end - r.start) for r in _of(events, RoundSpent) if r.kept)
    return kept / spent if spent > 0 else 0.0


def check(events: Iterable[Event], grace_s: float, loss_tolerance: float = 0.05) -> Report:
    """Judge every invariant over the whole history and compute the benchmark's figures."""
    events = list(events)
    end = history_end(events)
    lost_objects, bytes_lost = committed_unchanged(events)
    reservations = reservation_bounded(events, grace_s, end)
    orphans = subtask_bounded(events, grace_s, end)
    violations = (run_ends(events, end) + lost_objects + devices_exclusive(events, grace_s, end) + reservations
                  + orphans + globals_agree(events) + loss_close(events, loss_tolerance))
    return Report(
        violations=sorted(violations, key=lambda v: (v.t, INVARIANTS.index(v.invariant), v.subject)),
        faults_injected=len(_of(events, FaultInjected)),
        runs_submitted=len({s.run for s in _of(events, RunSubmitted)}),
        runs_completed=len(_completed(events)),
        committed_bytes_lost=bytes_lost,
        leaked_reservations=len(reservations),
        orphan_subtasks=len(orphans),
        goodput=goodput(events, end),
    )
