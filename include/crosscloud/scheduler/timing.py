"""Deferrable runs wait for cheap or clean hours, within their deadlines, and never so long that one is lost.

A run submitted ``deferrable`` with a ``deadline`` is planned by the pass:
over every pool it may use and every start hour from now to the last one that
still meets its deadline, the hour and pool where its run costs least by its
``objective`` (``cost``: rental plus energy at the hourly price; ``carbon``:
kg CO2 at the hourly intensity; a weight between them mixes the two, each
measured against its mean). When that is now, it is decided as any run is,
on that pool first. When it is later, it is deferred (decision ``plan``): it
holds no device meanwhile, and each pass plans it again with what is known
then, so a better forecast moves it and a worse one never breaks its deadline:

**The deadline guard.** A run is deferred only if an earliest-deadline-first
schedule of every deferred run, from the next hour on, each at its earliest
fit on the devices the running work leaves free, still meets every deadline
(``deadlines.witness``). Prices never enter that rule, so a wrong forecast
costs money, never a deadline. A run the schedule cannot defer is decided now.
A deadline no schedule can meet (the run is longer than the time left) is
named in the decision's reason, and the run starts as soon as it can.

Prices and carbon come from ``Rates``: the service builds them from the
federation's grid sections and the price feeds (``energy.prices``: known
hours, then the seasonal-naive forecast); the benchmarks build them from
their own price views. A pool without a price is never chosen to wait for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from crosscloud.core.job import carbon_weight
from crosscloud.scheduler import joint
from crosscloud.scheduler.deadlines import Guard, Item, witness
from crosscloud.scheduler.entry import Decision, Entry

Key = tuple[str, str]
MAX_HOURS = 7 * 24  # the farthest a run is planned ahead


@dataclass(frozen=True)
class Rates:
    """Per pool, USD and kg CO2 of one device-hour for each hour from ``first_hour`` (epoch hours) on."""

    first_hour: int
    usd: dict[Key, np.ndarray]
    co2: dict[Key, np.ndarray] = field(default_factory=dict)
    # hours from ``known`` on are forecast: a run waits for one only when it is cheaper by more than the
    # forecast usually misses by there (``band``: USD per device-hour, per pool)
    known: int = MAX_HOURS
    band: dict[Key, float] = field(default_factory=dict)

    def expected_usd(self, key: Key) -> np.ndarray:
        """The pool's USD per device-hour, forecast hours with their usual error on top."""
        usd = self.usd[key]
        if key not in self.band or self.known >= len(usd):
            return usd
        out = usd.copy()
        out[max(self.known, 0):] += self.band[key]
        return out


def occupancy(runtime_h: float) -> np.ndarray:
    """The share of each hour a run of ``runtime_h`` holds its devices (1, 1, ..., partial)."""
    n = max(1, math.ceil(runtime_h - 1e-9))
    occ = np.ones(n)
    occ[-1] = runtime_h - (n - 1)
    return occ


def window_sums(rate: np.ndarray, occ: np.ndarray) -> np.ndarray:
    """sums[s] = sum_k occ[k] * rate[s + k], for every start s whose run fits in ``rate``."""
    if len(rate) < len(occ):
        return np.zeros(0)
    return np.convolve(rate, occ[::-1], mode="valid")


@dataclass
class Choice:
    """The cheapest pools and start hour of a deferrable run, and what it and starting now would cost."""

    keys: tuple[Key, ...]  # one pool (placement auto), or one per cloud (spread: they start together)
    start: int  # hours from the current one
    value: float
    value_now: float
    usd: float
    usd_now: float
    kg: float | None
    kg_now: float | None


def _options(entry: Entry, priced: list[Key]) -> list[tuple[Key, ...]]:
    """What the run may wait for: each priced pool alone, or for a spread run all its clouds at once (a paused run:
    the pools it trained on, all priced, or nothing)."""
    if entry.parts is not None:
        keys = tuple((c, a) for c, a, _ in entry.parts)
        return [keys] if set(keys) <= set(priced) else []
    if entry.spread is None:
        return [(k,) for k in priced]
    first: dict[str, Key] = {}
    for k in priced:
        first.setdefault(k[0], k)
    return [tuple(first.values())]


class Timing:
    """One pass's plan of the deferrable runs: their choices and the guard's calendar."""

    def __init__(self, rates: Rates, totals: dict[Key, int], releases: dict[Key, list[tuple[float, int]]], now: float):
        self.rates, self.now = rates, now
        self.h0 = int(now // 3600)
        self.keys = sorted(totals)
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.free = np.array([[float(totals[k])] * MAX_HOURS for k in self.keys]).reshape(len(self.keys), MAX_HOURS)
        for key, got in releases.items():
            for until, n in got:
                self.hold(key, n, until)
        self.totals = [totals[k] for k in self.keys]
        self.items: dict[tuple[str, str], list[Item]] = {}  # the protected deadlines: every waiting deferrable run
        self.due: set[tuple[str, str]] = set()
        self.lost: set[tuple[str, str]] = set()  # protected runs no schedule fits any more (``_prune``)
        self.named: dict[tuple[str, str], str] = {}  # runs named infeasible when submitted (``arrive``)
        self.planned = np.zeros_like(self.free)  # devices the runs deferred in this pass will take, per hour
        self.joint: dict[tuple[str, str], tuple[tuple[Key, ...], int]] = {}  # run -> (pools, start): ``plan_jointly``
        self.expected = 0  # runs expected to arrive that the joint plan left room for

    def hold(self, key: Key, devices: int, until: float) -> None:
        """``devices`` of pool ``key`` are busy from now until ``until`` (epoch seconds)."""
        if key in self.index:
            self.free[self.index[key], :self._end(until)] -= devices

    def _end(self, until: float) -> int:
        """The calendar's first hour free again for devices busy until ``until`` (epoch seconds)."""
        return min(MAX_HOURS, max(1, math.ceil((until - self.h0 * 3600) / 3600)))

    def _deadline_h(self, entry: Entry) -> float:
        return (entry.deadline - self.h0 * 3600) / 3600

    def infeasible(self, entry: Entry) -> str:
        """Why no schedule could meet the run's deadline even had it started when it was submitted, or why none can
        any more with the work admitted before it (``settle``), or ""."""
        if entry.key in self.named:
            return self.named[entry.key]
        if entry.key in self.lost:
            return ("its deadline is at risk: no schedule of the work admitted before it meets it any more "
                    "(it no longer holds other runs back)")
        return self.hopeless(entry)

    def hopeless(self, entry: Entry) -> str:
        """Why the run's deadline could not be met even had it started alone when it was submitted, or ""."""
        left = (entry.deadline - entry.submitted_at) / 3600
        need = entry.runtime_s / 3600
        if need <= left + 1e-6:
            return ""
        return f"its deadline cannot be met: it needs {need:.1f} h and had {max(left, 0):.1f} h when it was submitted"

    @staticmethod
    def _counts(entry: Entry, option: tuple[Key, ...]) -> list[int]:
        """Devices the run takes on each pool of ``option``."""
        if entry.parts is not None:
            held = {(c, a): n for c, a, n in entry.parts}
            return [held[k] for k in option]
        return [_per_pool(entry)] * len(option)

    def _costs(self, entry: Entry, eligible: list[Key]) -> dict[tuple[Key, ...], tuple[np.ndarray, ...]] | None:
        """Per option, for each start from now to the last that meets the deadline: its value by the entry's
        objective (in USD at the entry's own mean rate), USD and kg CO2 (None without carbon); room not looked at."""
        occ = occupancy(entry.runtime_s / 3600)
        last = min(math.floor(self._deadline_h(entry) - entry.runtime_s / 3600 + 1e-9), MAX_HOURS - len(occ))
        w = carbon_weight(entry.objective)
        priced = [k for k in eligible if k in self.rates.usd and (w == 0 or k in self.rates.co2)]
        if not priced or last < 0:
            return None
        counts = {o: self._counts(entry, o) for o in _options(entry, priced)}
        usd = {o: sum(window_sums(self.rates.expected_usd(k), occ)[: last + 1] * n for k, n in zip(o, ns))
               for o, ns in counts.items()}
        kg = {o: sum(window_sums(self.rates.co2[k], occ)[: last + 1] * n for k, n in zip(o, counts[o])) for o in usd
              if all(k in self.rates.co2 for k in o)}
        scale_usd, scale_kg = _scale(usd.values()), _scale(kg.values())
        return {o: ((1 - w) * cost + (w * kg[o] * scale_usd / scale_kg if w else 0.0), cost, kg.get(o))
                for o, cost in usd.items()}

    def choose(self, entry: Entry, eligible: list[Key]) -> Choice | None:
        """The cheapest pools and start within the deadline by the entry's objective, where the running and planned
        runs leave room: the joint plan's (``joint``) when it has one there, else the entry's own; None unpriced."""
        costs = self._costs(entry, eligible)
        if costs is None:
            return None
        occ = occupancy(entry.runtime_s / 3600)
        value = {}
        for o, (v, _, _) in costs.items():
            value[o] = v + self._full(o, self._counts(entry, o), occ, len(v) - 1)
            value[o][~np.isfinite(v)] = np.inf
        best = None
        joint = self.joint.get(entry.key)
        if joint is not None and joint[0] in value and joint[1] < len(value[joint[0]]) \
                and np.isfinite(value[joint[0]][joint[1]]):
            best = (float(value[joint[0]][joint[1]]), joint[1], joint[0])
        for o, v in value.items() if best is None else ():
            s = int(np.argmin(v)) if len(v) else None  # the earliest of equals
            if s is not None and np.isfinite(v[s]) and (best is None or (v[s], s) < (best[0], best[1])):
                best = (float(v[s]), s, o)
        if best is None:
            return None
        _, s, o = best
        v, usd, kg = costs[o]
        return Choice(o, s, float(v[s]), float(v[0]), float(usd[s]), float(usd[0]),
                      None if kg is None else float(kg[s]), None if kg is None else float(kg[0]))

    def cheapest_now(self, entry: Entry, eligible: list[Key]) -> list[tuple[Key, ...]]:
        """The run's options by what starting on them now costs (its objective), cheapest first; priced ones only."""
        costs = self._costs(entry, eligible) or {}
        now = {o: float(v[0]) for o, (v, _, _) in costs.items() if len(v) and np.isfinite(v[0])}
        return sorted(now, key=lambda o: (now[o], o))

    def plan_jointly(self, entries: list[tuple[Entry, list[Key]]], expected: list[tuple[Entry, list[Key]]] = ()) -> None:
        """Plan the waiting deferrable runs together (``joint``): each later ``choose`` of one takes its share of
        the plan. The runs due now may only start now; at most ``joint.MAX_RUNS``, the earliest deadlines.
        ``expected``: the runs expected to arrive (``expected``), planned from their arrival on and never started,
        so that the runs deferred now leave them the devices they will need; at most ``joint.MAX_EXPECTED``."""
        runs = [r for entry, eligible in sorted(entries, key=lambda x: x[0].deadline)[: joint.MAX_RUNS]
                if (r := self._joint_run(entry, eligible, 0, 1 if self.is_due(entry) else math.inf)) is not None]
        for entry, eligible in sorted(expected, key=lambda x: x[0].submitted_at)[: joint.MAX_EXPECTED]:
            arrives = max(0, math.floor((entry.submitted_at - self.h0 * 3600) / 3600))
            if (r := self._joint_run(entry, eligible, arrives)) is not None:
                runs.append(r)
                self.expected += 1
        plan = joint.solve([r for _, _, r in runs], self.free - self.planned)
        names = {key: opts for key, opts, _ in runs}
        waiting = {e.key for e, _ in entries}  # an expected run's plan only shaped theirs
        self.joint = {key: (names[key][i], s) for key, (i, s) in plan.items() if key in waiting}

    def _joint_run(self, entry: Entry, eligible: list[Key], since: int, until: float = math.inf):
        """(key, options, ``joint.Run``) of ``entry`` for the joint plan, starting in hours [since, until); None when
        it has no priced option."""
        costs = self._costs(entry, eligible)
        if not costs:
            return None
        options = []
        for o, (v, _, _) in costs.items():
            hours = np.arange(len(v))
            v = np.where((hours >= since) & (hours < until), v, np.inf)
            options.append((o, joint.Option(tuple(self.index.get(k, -1) for k in o), tuple(self._counts(entry, o)), v)))
        options = [(o, opt) for o, opt in options if -1 not in opt.pools and np.isfinite(opt.cost).any()]
        if not options:
            return None
        return entry.key, [o for o, _ in options], joint.Run(entry.key, tuple(opt for _, opt in options),
                                                              occupancy(entry.runtime_s / 3600))

    def _full(self, option: tuple[Key, ...], counts: list[int], occ: np.ndarray, last: int) -> np.ndarray:
        """0 for each start (0 .. last) where the running runs and the runs planned before this one leave
        ``option`` room, inf elsewhere: a run never plans for hours that others have taken already."""
        out = np.zeros(last + 1)
        for k, devices in zip(option, counts):
            if k not in self.index:
                continue
            room = self.free[self.index[k]] - self.planned[self.index[k]]
            ok = np.ones(last + 1, dtype=bool)
            for j, o in enumerate(occ):
                ok &= room[j: j + last + 1] >= devices * o - 1e-9
            out[~ok] = np.inf
        return out

    def admit(self, entry: Entry, eligible: list[Key]) -> None:
        """``entry`` waits: its deadline is protected (unless no schedule could ever meet it)."""
        if self.infeasible(entry):
            return
        occ = occupancy(entry.runtime_s / 3600)
        pools = [self.index[k] for k in eligible if k in self.index]
        if entry.parts is not None:  # each part where it is, with its own devices
            self.items[entry.key] = [Item(f"{entry.tenant}/{entry.run_id}/{i}", self._deadline_h(entry),
                                          (self.index[(c, a)],), devices=n, occ=occ)
                                     for i, (c, a, n) in enumerate(entry.parts) if (c, a) in self.index]
            return
        n = _per_pool(entry)
        if entry.spread is None:
            parts = [tuple(pools)]
        else:  # each cloud's part on the first of its pools (a relaxation of starting them together)
            first: dict[str, int] = {}
            for k in eligible:
                if k in self.index:
                    first.setdefault(k[0], self.index[k])
            parts = [(i,) for i in first.values()]
        self.items[entry.key] = [Item(f"{entry.tenant}/{entry.run_id}/{i}", self._deadline_h(entry), c, devices=n,
                                      occ=occ) for i, c in enumerate(parts)]

    def arrive(self, arrivals: list[tuple[Entry, list[Key]]], pausable: list[tuple[Entry, float]] = ()) -> None:
        """The runs submitted since the last pass, in order: each is protected only if an EDF schedule of it and the
        work admitted before it meets every deadline; else it is named (``named``) and runs as best effort, so a
        late arrival never takes the hours an admitted run was counting on. ``pausable``: the running runs a pass may
        pause to make room (each resumed, and when its devices are due back): a schedule that pauses them counts."""
        self._prune()
        for entry, eligible in arrivals:
            self.admit(entry, eligible)
            if entry.key not in self.items or witness(np.maximum(self.free, 0.0), self.protected(), 0).ok \
                    or self._fits_pausing(pausable):
                continue
            self.items.pop(entry.key)
            self.named[entry.key] = ("its deadline cannot be met with the work admitted before it (no schedule of "
                                     "both meets every deadline)")

    def _fits_pausing(self, pausable: list[tuple[Entry, float]]) -> bool:
        """Whether every protected deadline has a schedule with the ``pausable`` runs paused and waiting again."""
        if not pausable:
            return False
        saved, free = dict(self.items), self.free.copy()
        for entry, until in pausable:
            for cloud, accelerator, n in entry.parts:
                self.hold((cloud, accelerator), -n, until)
            self.admit(entry, [(c, a) for c, a, _ in entry.parts])
        ok = witness(np.maximum(self.free, 0.0), self.protected(), 0).ok
        self.items, self.free = saved, free
        return ok

    def protected(self, without: tuple[str, str] | None = None) -> list[Item]:
        return [i for key, items in self.items.items() if key != without for i in items]

    def settle(self) -> None:
        """Which runs must start now for every protected deadline to keep a schedule from the next hour on."""
        self._prune()
        used = np.array(self.totals, dtype=float).reshape(-1, 1) - self.free
        due = Guard(np.array(self.totals, dtype=float)).due_now(np.maximum(used, 0.0), self.protected(), 0)
        self.due = {key for key, items in self.items.items() if any(i.name in due.starts for i in items)}

    def _prune(self) -> None:
        """A protected run that no EDF schedule from now fits by its deadline any more leaves the protection and
        runs as soon as it can: otherwise one lost deadline would let every start through, and lose more."""
        names = {i.name: key for key, items in self.items.items() for i in items}
        while self.items:
            w = witness(np.maximum(self.free, 0.0), self.protected(), 0)
            if w.ok:
                return
            key = names[w.failed]
            self.items.pop(key, None)
            self.lost.add(key)

    def is_due(self, entry: Entry) -> bool:
        return entry.key in self.due

    def may_start(self, entry: Entry, parts, hold_s: float) -> bool:
        """Whether starting ``entry`` now on ``parts`` leaves every other protected deadline a schedule."""
        trial = self.free.copy()
        end = self._end(self.now + hold_s)
        for cloud, accelerator, n in parts:
            if (cloud, accelerator) in self.index:
                trial[self.index[(cloud, accelerator)], :end] -= n
        others = self.protected(without=entry.key)
        if witness(np.maximum(trial, 0.0), others, 1).ok:
            return True
        return not witness(np.maximum(self.free, 0.0), others, 1).ok  # already lost without it: it changes nothing

    def keeps_deadlines(self) -> bool:
        """Whether an EDF schedule from the next hour on meets every protected deadline."""
        return witness(np.maximum(self.free, 0.0), self.protected(), 1).ok

    def started(self, entry: Entry) -> None:
        self.items.pop(entry.key, None)

    def defer(self, entry: Entry, choice: Choice) -> None:
        """``entry`` waits for ``choice``: the runs planned after it in this pass leave it those hours."""
        occ = occupancy(entry.runtime_s / 3600)
        for k, n in zip(choice.keys, self._counts(entry, choice.keys)):
            if k in self.index:
                self.planned[self.index[k], choice.start:choice.start + len(occ)] += n * occ

    def cost_now(self, entry: Entry, parts) -> tuple[float, float | None] | None:
        """USD and kg CO2 (None without a carbon signal) of running ``entry`` from now on ``parts``; None unpriced."""
        occ = occupancy(entry.runtime_s / 3600)
        keys = [(c, a, n) for c, a, n in parts if (c, a) in self.rates.usd]
        if len(keys) != len(parts):
            return None
        usd = sum(float(window_sums(self.rates.usd[(c, a)], occ)[0]) * n for c, a, n in keys)
        if not all((c, a) in self.rates.co2 for c, a, _ in keys):
            return usd, None
        return usd, sum(float(window_sums(self.rates.co2[(c, a)], occ)[0]) * n for c, a, n in keys)

    def plan(self, entry: Entry, choice: Choice) -> Decision:
        """The decision to defer ``entry`` to ``choice``'s hour."""
        at = (self.h0 + choice.start) * 3600
        saving = 100 * (1 - choice.value / choice.value_now) if choice.value_now > 0 else 0.0
        where = ", ".join(sorted({k[0] for k in choice.keys}))
        counts = self._counts(entry, choice.keys)
        return Decision("plan", f"deferred by {entry.objective} to {utc_hour(at)} ({choice.start} h from now) on {where}: "
                        f"{saving:.0f} % less than starting now (USD {choice.usd:.4f} vs {choice.usd_now:.4f}"
                        f"{kg_text(choice)}); every deferred deadline still has a schedule"
                        + (f"; planned leaving room for {self.expected} run(s) expected to arrive"
                           if self.expected and entry.key in self.joint else ""),
                        tuple((c, a, n) for (c, a), n in zip(choice.keys, counts)), at - self.now, planned_at=at,
                        runtime_s=entry.runtime_s)


def _per_pool(entry: Entry) -> int:
    """Devices a run not paused takes on each pool it runs on: all of them (auto), or one cloud's (spread)."""
    return entry.request.devices if entry.spread is None else entry.spread.per_cloud


def _scale(values) -> float:
    """The mean of the finite values (a unit for mixing cost and carbon), never 0."""
    got = np.concatenate(list(values)) if values else np.zeros(0)
    got = got[np.isfinite(got)]
    return max(float(got.mean()), 1e-12) if len(got) else 1.0


def utc_hour(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:00 UTC", time.gmtime(t))


def kg_text(c: Choice) -> str:
    return "" if c.kg is None else f", {c.kg:.3f} vs {c.kg_now:.3f} kg CO2"
