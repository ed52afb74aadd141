"""Deadlines kept by construction: a schedule that meets every admitted deadline must always exist.

Why a witness and not a tuned margin: a price-aware policy wins by waiting for
cheap hours, and every wait spends slack. The rule here is the invariant the
rolling policy keeps after each of its decisions (defer, start, hold a later
hour, pause, reserve): an **earliest-deadline-first** schedule of all admitted
work that is not running yet, from the next hour on, at each job's earliest
start where its devices are free, meets every deadline. That schedule assumes
no price luck: it is what would happen if from now on every job started as
soon as it could. A decision that would leave no such schedule is not taken;
when waiting itself would break it, the work the schedule starts now is started
now (``Guard.due_now``). EDF with earliest fit is a witness, not an exact test:
when it finds a schedule one exists, when it does not the policy acts as if
none did, which can only make it start work earlier.

Work arriving later is accounted for by **pausing**: the schedule that admits
it may pause running work that was not paused before and still finishes in
time when resumed. Optionally (``urgent_slack_h`` > 0) also by **capacity
held back from measured arrivals**: urgent work (slack below ``urgent_slack_h``) arriving at the rate
it arrived over the last ``window_h`` hours is kept room for in the schedule's
future hours, as much as such work would hold by then (``Guard.holdback``), so
the deferred work leaves room for the urgent work the recent past says will
come. The rate is measured on the run's own arrivals, never set per data set.

A job whose deadline no schedule can meet is **infeasible at arrival**, with
the reason: it cannot finish by its deadline even started at once
(``runtime > deadline - arrival``), no cloud it may use has its devices, or the
work admitted before it leaves no schedule that meets its deadline as well as
theirs. It still runs, as best effort, but is not protected by the invariant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

EPS = 1e-9


@dataclass(frozen=True)
class Item:
    """One piece of admitted work the witness schedules: a training job (whole) or a batch's rest (divisible)."""

    name: str
    deadline: float
    clouds: tuple[int, ...]
    devices: float = 0.0  # training: devices held while it runs
    occ: np.ndarray | None = None  # training: share of each hour it holds them (``price_timing.occupancy``)
    device_hours: float = 0.0  # batch: work left
    arrival: int = 0

    @property
    def is_batch(self) -> bool:
        return self.occ is None

    @property
    def last_start(self) -> int:
        if self.occ is None:
            return int(self.deadline) - 1
        return math.floor(self.deadline - (len(self.occ) - 1) - float(self.occ[-1]) + 1e-9)  # it ends by its deadline


@dataclass
class Witness:
    """An EDF schedule from ``first``: each item's (cloud, start) or, for batches, its (cloud, hour, amount) fills."""

    ok: bool
    starts: dict[str, tuple[int, int]] = field(default_factory=dict)
    fills: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    failed: str | None = None


def earliest_fit(free: np.ndarray, first: int, last: int, devices: float, occ: np.ndarray) -> int | None:
    """The first start in [first, last] where ``devices x occ`` fits under ``free`` (one cloud's row), or None."""
    last = min(last, len(free) - len(occ))
    if last < first:
        return None
    ok = np.ones(last - first + 1, dtype=bool)
    for k, o in enumerate(occ):
        ok &= free[first + k:last + k + 1] >= devices * o - EPS
        if not ok.any():
            return None
    return first + int(np.argmax(ok))


def _place(free: np.ndarray, item: Item, first: int, w: Witness) -> bool:
    if item.is_batch:
        need, fills = item.device_hours, []
        for h in range(first, min(int(item.deadline), free.shape[1])):
            for c in item.clouds:
                take = min(need, free[c, h])
                if take > EPS:
                    free[c, h] -= take
                    need -= take
                    fills.append((c, h, take))
            if need <= EPS:
                w.fills[item.name] = fills
                return True
        return False
    best = None
    for c in item.clouds:
        s = earliest_fit(free[c], first, item.last_start, item.devices, item.occ)
        if s is not None and (best is None or s < best[1]):
            best = (c, s)
    if best is None:
        return False
    free[best[0], best[1]:best[1] + len(item.occ)] -= item.devices * item.occ
    w.starts[item.name] = best
    return True


def edf(items: Sequence[Item], first: int) -> list[Item]:
    """Earliest deadline first, the work that must start at ``first`` (its last start) before the rest: placed later
    in deadline order, it would find the hour taken by work that could have waited."""
    return sorted(items, key=lambda i: (not (i.occ is not None and i.last_start <= first), i.deadline, i.arrival,
                                        i.name))


def witness(free: np.ndarray, items: Sequence[Item], first: int) -> Witness:
    """In ``edf`` order, each at its earliest fit from hour ``first``; ``free`` (clouds x hours) is not changed."""
    free, w = free.copy(), Witness(True)
    for item in edf(items, first):
        if not _place(free, item, first, w):
            return Witness(False, w.starts, w.fills, item.name)
    return w


@dataclass
class Guard:
    """The invariant of the module docstring over one device calendar (``cap`` per cloud, ``used`` clouds x hours)."""

    cap: np.ndarray
    urgent_slack_h: float = 0.0  # 0: no room held back (later arrivals are served by pausing)
    window_h: int = 24
    arrivals: list[tuple[int, float, float, tuple[int, ...]]] = field(default_factory=list)  # hour, devices, run time, clouds
    infeasible: dict[str, str] = field(default_factory=dict)

    def observe(self, hour: int, devices: float, runtime_h: float, slack_h: float, clouds: tuple[int, ...]) -> None:
        """An arrival: urgent work counts toward the capacity held back for the urgent work still to come."""
        if slack_h < self.urgent_slack_h and clouds:
            self.arrivals.append((hour, devices, runtime_h, clouds))

    @property
    def holds_back(self) -> bool:
        """Whether any room is kept for urgent work to come (``urgent_slack_h`` > 0)."""
        return self.urgent_slack_h > 0

    def holdback(self, now: int, hours: int) -> np.ndarray:
        """Devices per cloud (clouds x ``hours`` from ``now + 1``) kept free for urgent work still to arrive.

        Urgent work arriving at the rate of the last ``window_h`` hours, each job
        ``d`` devices for ``r`` hours, holds ``d x min(r, k)`` per window-hour at
        ``k`` hours from now: the jobs that will have arrived by then and still
        run. Work that arrived already is in the calendar, not here.
        """
        held = np.zeros((len(self.cap), hours))
        span = self.window_h  # early on the rate is underestimated, never blown up by one arrival
        k = np.arange(1, hours + 1, dtype=float)
        for hour, devices, runtime_h, clouds in self.arrivals:
            if now - self.window_h < hour <= now:
                row = devices * np.minimum(runtime_h, k) / span / len(clouds)
                held[list(clouds)] += row
        return np.minimum(np.floor(held + EPS), self.cap[:, None])  # whole devices: a fraction would bar whole jobs

    def free(self, used: np.ndarray, now: int, hold: bool = True) -> np.ndarray:
        free = self.cap[:, None] - used
        if hold and now + 1 < free.shape[1]:
            free[:, now + 1:] -= self.holdback(now, free.shape[1] - now - 1)
        return np.maximum(free, 0.0)

    def admissible(self, used: np.ndarray, items: Sequence[Item], new: Item, now: int) -> str | None:
        """Why ``new`` is infeasible at arrival, or None: alone, or with the admitted ``items`` (no capacity held back)."""
        alone = infeasible_alone(self.cap, new, now)
        if alone is not None:
            return alone
        w = witness(self.free(used, now, hold=False), [*items, new], now)
        if not w.ok:
            return (f"with the work admitted before it no schedule meets every deadline ({w.failed} would miss): "
                    "it runs as best effort")
        return None

    def keeps(self, used: np.ndarray, items: Sequence[Item], now: int, hold: bool = True) -> bool:
        """Whether the work in ``items`` (none running) still has a schedule from ``now + 1`` under ``used``."""
        return witness(self.free(used, now, hold), items, now + 1).ok

    def due_now(self, used: np.ndarray, items: Sequence[Item], now: int) -> Witness:
        """What must start now so that waiting breaks nothing: the fewest of the EDF schedule's starts at ``now``.

        Returned as a witness whose ``starts``/``fills`` hold only the work to run this hour; ``ok`` False when even
        starting all of it leaves no schedule (a deadline is at risk whatever is done: then the EDF schedule's own
        starts at ``now`` are returned, the best there is).
        """
        free = self.free(used, now)
        if witness(free, items, now + 1).ok:
            return Witness(True)
        full = witness(self.free(used, now, hold=False), items, now)
        chosen = Witness(True)
        trial = free.copy()
        by_name = {i.name: i for i in items}
        for item in edf(items, now):
            if item.name in full.starts and full.starts[item.name][1] == now:
                c, s = full.starts[item.name]
                trial[c, s:s + len(item.occ)] -= item.devices * item.occ
                chosen.starts[item.name] = (c, s)
            elif item.name in full.fills and any(h == now for _, h, _ in full.fills[item.name]):
                now_fills = [(c, h, a) for c, h, a in full.fills[item.name] if h == now]
                for c, h, a in now_fills:
                    trial[c, h] -= a
                chosen.fills[item.name] = now_fills
            else:
                continue
            rest = [by_name[n] for n in by_name if n not in chosen.starts]
            rest = [_less(i, chosen.fills.get(i.name)) for i in rest]
            if witness(trial, [i for i in rest if i is not None], now + 1).ok:
                return chosen
        chosen.ok = False
        return chosen


def infeasible_alone(cap: np.ndarray, item: Item, now: int) -> str | None:
    """Why no policy could meet ``item``'s deadline even on empty clouds (arriving at ``now``), or None."""
    if not item.clouds:
        return "no cloud may run it"
    if item.is_batch:
        if item.device_hours > sum(cap[c] for c in item.clouds) * max(0.0, item.deadline - now) + EPS:
            return "more device-hours than its clouds hold before its deadline"
        return None
    if item.devices > max(cap[c] for c in item.clouds) + EPS:
        return f"no cloud it may use has {item.devices:g} devices"
    if now + len(item.occ) - 1 + float(item.occ[-1]) > item.deadline + EPS:
        return "its run time is longer than the time to its deadline"
    return None


def _less(item: Item, fills: list[tuple[int, int, float]] | None) -> Item | None:
    """A batch item less the work filled now; None when nothing is left."""
    if not fills:
        return item
    left = item.device_hours - sum(a for _, _, a in fills)
    return None if left <= EPS else Item(item.name, item.deadline, item.clouds, device_hours=left, arrival=item.arrival)
