"""Price-aware placement and timing of deferrable work, a price-unaware reference, and the offline optimum.

Time is in whole hours, indexed ``0 .. horizon-1`` from a start hour; each
cloud has a fixed number of devices, a PUE, a full power per device and a
rental. A **training job** needs ``devices`` for ``runtime_h`` hours (possibly
fractional), run contiguously on one cloud from a whole-hour start ``s`` with
``arrival <= s`` and ``s + runtime_h <= deadline``; in its last, partial hour
it holds its devices for the fraction it runs (capacity is fluid within an
hour: two half-hour jobs share a device-hour). A **batch inference job** is
``device_hours`` of work, divisible over clouds and hours in
``[arrival, deadline)``. ``allowed`` (residency) limits the clouds.

Energy cost of a device-hour on cloud c at hour t:
``power_w/1000 x price[c, t]/1000 x PUE`` (``crosscloud.energy.power``), i.e. the
device at full power while it works; idle devices are not charged to the work.

Policies (``schedule``):

* ``"price"`` -- online and price-aware. Jobs are decided in arrival order at
  their arrival hour, each seeing only what is known then
  (``PriceOracle.view``: day-ahead prices known through the end of the next
  UTC day after 12:00 UTC, else through the end of today; a seasonal-naive
  forecast beyond; see ``crosscloud.energy.prices``). A training job takes the
  (cloud, start) of least expected *effective* cost (rental + energy) whose
  devices are free for its whole run and which meets its deadline; a batch
  fills the cheapest free (cloud, hour) device-hours before its deadline.
  Decisions are reservations: capacity is never oversubscribed. When a job
  can meet its deadline nowhere, reservations that have not started yet (on
  the clouds it may use) give way: they are released, the job is placed, and
  they are decided again, earliest deadline first. ``headroom`` (default 0)
  keeps that share of each cloud's devices out of reach of deferrable jobs
  (slack >= ``deferrable_slack_h``) unless nothing else fits. With
  ``replan=True``, reservations that have not started yet are reconsidered
  each time new day-ahead prices are published (released and decided again,
  earliest deadline first, with the then-known prices).
* ``"least-loaded"`` -- the price-unaware reference: as soon as possible, on
  the allowed cloud that is least loaded at the job's arrival among those
  that can start it earliest; batches fill the least-loaded clouds hour by
  hour from arrival.

A job that can meet its deadline nowhere is still run as early as possible and
counted as a deadline miss.

``optimum`` solves the offline problem with perfect knowledge of the actual
prices as a linear program (``scipy.optimize.linprog``, HiGHS): variables are
the fraction of each training job started at each (cloud, start) and the
device-hours of each batch at each (cloud, hour), with the same capacities,
deadlines and residency. Fractions may split a training job over several
starts/clouds (the LP relaxation of the integral problem), so its cost is a
lower bound on the cost of any schedule, online or not: the fraction of the
optimum's saving that a policy achieves is not flattered.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from crosscloud.energy.power import DEFAULT_PUE, energy_price_per_device_hour


@dataclass(frozen=True)
class CloudSpec:
    name: str
    region: str
    devices: float
    pue: float = DEFAULT_PUE
    power_w: float = 300.0
    rental: float = 0.0  # USD per device-hour
    jurisdiction: str = ""


@dataclass(frozen=True)
class TrainingJob:
    name: str
    devices: int
    runtime_h: float
    arrival: int
    deadline: float  # hour by which it must have finished
    allowed: frozenset[str] | None = None  # cloud names; None = any
    home: str = ""

    @property
    def last_start(self) -> int:
        """The last whole hour it can start and still meet its deadline."""
        return math.floor(self.deadline - self.runtime_h + 1e-9)


@dataclass(frozen=True)
class BatchJob:
    name: str
    device_hours: float
    arrival: int
    deadline: int  # work in hours arrival .. deadline-1
    allowed: frozenset[str] | None = None
    requests: int = 0
    home: str = ""


@dataclass
class Placement:
    job: str
    cloud: str
    start: int  # training: start hour; batch: hour of this slice
    device_hours: float
    end: float  # training: start + runtime; batch: start + 1
    devices: float = 0.0


@dataclass
class Schedule:
    policy: str
    placements: list[Placement] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # batch work that found no capacity at all
    preempted: list[str] = field(default_factory=list)  # training jobs paused (checkpointed) to make room


def occupancy(runtime_h: float) -> np.ndarray:
    """Fraction of each hour a job of ``runtime_h`` holds its devices (1, 1, ..., partial)."""
    n = max(1, math.ceil(runtime_h - 1e-9))
    occ = np.ones(n)
    occ[-1] = runtime_h - (n - 1)
    return occ


def _allowed(clouds: Sequence[CloudSpec], allowed: frozenset[str] | None) -> list[int]:
    return [i for i, c in enumerate(clouds) if allowed is None or c.name in allowed]


_EXPECTED = -(10**9)  # owner of a plan's variables for work expected but not yet arrived: planned, never run
PriceView = Callable[[str, int, int, int], Sequence[float]]  # (region, decision_hour, start, hours) -> USD/MWh


class _Calendar:
    def __init__(self, clouds: Sequence[CloudSpec], horizon: int):
        self.cap = np.array([c.devices for c in clouds], dtype=float)
        self.used = np.zeros((len(clouds), horizon))
        self.horizon = horizon

    def fits(self, c: int, start: int, devices: float, occ: np.ndarray) -> bool:
        end = start + len(occ)
        if end > self.horizon:
            return False
        return bool(np.all(self.used[c, start:end] + devices * occ <= self.cap[c] + 1e-9))

    def feasible_starts(self, c: int, first: int, last: int, devices: float, occ: np.ndarray, share: float = 1.0) -> list[int]:
        """Starts in [first, last] where the job fits within ``share`` of the capacity (vectorised over starts)."""
        last = min(last, self.horizon - len(occ))
        if last < first or devices > self.cap[c] + 1e-9:
            return []
        free = self.cap[c] * share - self.used[c] + 1e-9
        ok = np.ones(last - first + 1, dtype=bool)
        for k, o in enumerate(occ):
            ok &= free[first + k: last + k + 1] >= devices * o
        return [first + int(i) for i in np.nonzero(ok)[0]]

    def reserve(self, c: int, start: int, devices: float, occ: np.ndarray, sign: float = 1.0) -> None:
        self.used[c, start:start + len(occ)] += sign * devices * occ


def _window_cost(prices: np.ndarray, occ: np.ndarray) -> np.ndarray:
    """cost[s] = sum_k occ[k] * prices[s + k] for every s with s + len(occ) <= len(prices)."""
    n = len(prices) - len(occ) + 1
    if n <= 0:
        return np.zeros(0)
    return np.convolve(prices, occ[::-1], mode="valid")[:n]


def schedule(policy: str, jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec],
             horizon: int, view: PriceView | None = None, t0: int = 0, replan: bool = False,
             publish_hour_utc: int = 12, headroom: float = 0.0, deferrable_slack_h: float = 6.0) -> Schedule:
    """Run ``policy`` ("price" or "least-loaded") online over the jobs; see the module docstring.

    ``view(region, decision_hour, start, hours)`` gives the prices (USD/MWh)
    a decision at absolute hour ``decision_hour`` sees for absolute hours
    ``start .. start+hours-1``; the schedule's hours are relative to ``t0``.
    """
    if policy not in ("price", "price-lp", "least-loaded"):
        raise ValueError(f"unknown policy {policy!r}; expected 'price', 'price-lp' or 'least-loaded'")
    if policy == "price-lp":
        if view is None:
            raise ValueError("the price-aware policy needs a price view")
        return schedule_rolling(jobs, batches, clouds, horizon, view, t0)
    if policy == "price" and view is None:  # greedy
        raise ValueError("the price-aware policy needs a price view")
    cal = _Calendar(clouds, horizon)
    out = Schedule(policy)
    events = sorted([(j.arrival, 0, i) for i, j in enumerate(jobs)] + [(b.arrival, 1, i) for i, b in enumerate(batches)])
    pending: dict[str, tuple[TrainingJob, int, int]] = {}  # reserved, not started: name -> (job, cloud, start)
    placed_training: dict[str, Placement] = {}

    def energy_rates(decision: int) -> np.ndarray:
        """Expected USD per device-hour (rental + energy) per cloud over the horizon, as seen at ``decision``."""
        rates = np.empty((len(clouds), horizon))
        for ci, c in enumerate(clouds):
            p = np.asarray(view(c.region, t0 + decision, t0, horizon), dtype=float)
            rates[ci] = c.rental + energy_price_per_device_hour(c.power_w, 1.0, c.pue) * p
        return rates

    rate_cache: dict[int, np.ndarray] = {}

    def rates_at(decision: int) -> np.ndarray:
        # knowledge changes only at publication and at midnight: cache per decision hour
        if decision not in rate_cache:
            rate_cache[decision] = energy_rates(decision)
        return rate_cache[decision]

    def place_training(job: TrainingJob, now: int, bump: bool = True) -> None:
        occ = occupancy(job.runtime_h)
        last_ok = job.last_start
        cands = _allowed(clouds, job.allowed)
        best = None
        if policy == "price":
            rates = rates_at(now)
            deferrable = job.deadline - job.arrival - job.runtime_h >= deferrable_slack_h
            share = 1.0 - headroom if deferrable and now < last_ok else 1.0
            for c in cands:
                starts = cal.feasible_starts(c, now, last_ok, job.devices, occ, share)
                if not starts and share < 1.0:
                    starts = cal.feasible_starts(c, now, last_ok, job.devices, occ)
                if not starts:
                    continue
                cost = _window_cost(rates[c], occ)
                for s in starts:
                    key = (cost[s] * job.devices, s, c)
                    if best is None or key < best[0]:
                        best = (key, c, s)
        else:
            for c in cands:
                starts = cal.feasible_starts(c, now, horizon - 1, job.devices, occ)
                if not starts:
                    continue
                s = starts[0]
                load = cal.used[c, now] / cal.cap[c]
                key = (s > last_ok, s, load, c)
                if best is None or key < best[0]:
                    best = (key, c, s)
        if best is None and policy == "price" and bump and pending:
            # no room before the deadline: reservations that have not started yet give way (and are
            # decided again, earliest deadline first, right after this job)
            released = [pending.pop(n) for n in list(pending) if pending[n][2] > now and pending[n][1] in cands]
            if released:
                for other, c, s in released:
                    cal.reserve(c, s, other.devices, occupancy(other.runtime_h), sign=-1.0)
                    placed_training.pop(other.name)
                place_training(job, now, bump=False)
                for other, _, _ in sorted(released, key=lambda x: (x[0].deadline, x[0].name)):
                    place_training(other, now, bump=False)
                return
        if best is None:  # meets no deadline: as early as possible anywhere allowed
            for c in cands:
                starts = cal.feasible_starts(c, now, horizon - 1, job.devices, occ)
                if starts and (best is None or starts[0] < best[2]):
                    best = ((), c, starts[0])
        if best is None:
            out.misses.append(job.name)
            out.unplaced.append(job.name)
            return
        _, c, s = best
        cal.reserve(c, s, job.devices, occ)
        placed_training[job.name] = Placement(job.name, clouds[c].name, s, job.devices * job.runtime_h,
                                              s + job.runtime_h, job.devices)
        if s > now:
            pending[job.name] = (job, c, s)

    def place_batch(b: BatchJob, now: int) -> None:
        need = b.device_hours
        cands = _allowed(clouds, b.allowed)
        if policy == "price":
            rates = rates_at(now)
            slots = sorted((rates[c, t], t, c) for c in cands for t in range(now, min(b.deadline, horizon)))
            for _, t, c in slots:
                if need <= 1e-9:
                    break
                take = min(need, cal.cap[c] - cal.used[c, t])
                if take > 1e-9:
                    cal.used[c, t] += take
                    out.placements.append(Placement(b.name, clouds[c].name, t, take, t + 1, take))
                    need -= take
        else:
            for t in range(now, horizon):
                if need <= 1e-9:
                    break
                for c in sorted(cands, key=lambda c: (cal.used[c, t] / cal.cap[c], c)):
                    take = min(need, cal.cap[c] - cal.used[c, t])
                    if take > 1e-9:
                        cal.used[c, t] += take
                        out.placements.append(Placement(b.name, clouds[c].name, t, take, t + 1, take))
                        need -= take
                    if need <= 1e-9:
                        break
        if need > 1e-6:
            out.misses.append(b.name)
            out.unplaced.append(b.name)
        elif any(p.job == b.name and p.start >= b.deadline for p in out.placements):
            out.misses.append(b.name)

    def replan_pending(now: int) -> None:
        if not pending:
            return
        todo = [pending.pop(n) for n in list(pending) if pending[n][2] > now]
        for job, c, s in todo:
            cal.reserve(c, s, job.devices, occupancy(job.runtime_h), sign=-1.0)
            placed_training.pop(job.name)
        for job, _, _ in sorted(todo, key=lambda x: (x[0].deadline, x[0].name)):
            place_training(job, now)

    last_time = None
    for arrival, kind, i in events:
        if arrival >= horizon:
            raise ValueError(f"job arrives at hour {arrival}, beyond the horizon of {horizon} h")
        if replan and policy == "price" and last_time is not None:
            # every publication of day-ahead prices since the last decision re-plans what has not started
            for h in range(last_time + 1, arrival + 1):
                if (t0 + h) % 24 == publish_hour_utc:
                    for n in [n for n, (_, _, s) in pending.items() if s <= h]:
                        pending.pop(n)  # started already: stays where it is
                    replan_pending(h)
        last_time = arrival
        for n in [n for n, (_, _, s) in pending.items() if s <= arrival]:
            pending.pop(n)
        if kind == 0:
            place_training(jobs[i], arrival)
        else:
            place_batch(batches[i], arrival)
    out.placements = list(placed_training.values()) + out.placements
    by_name = {j.name: j for j in jobs}
    for p in placed_training.values():
        if p.end > by_name[p.job].deadline + 1e-9 and p.job not in out.misses:
            out.misses.append(p.job)
    return out


@dataclass
class Accounting:
    energy_mwh: float
    electricity_usd: float
    rental_usd: float
    carbon_kg: float | None
    energy_without_carbon_mwh: float  # energy in regions with no carbon signal
    device_hours: float

    @property
    def total_usd(self) -> float:
        return self.electricity_usd + self.rental_usd


def account(placements: Sequence[Placement], clouds: Sequence[CloudSpec], prices: dict[str, np.ndarray],
            carbon: dict[str, np.ndarray] | None = None) -> Accounting:
    """Actual energy, electricity cost, rental and carbon of placements; ``prices``/``carbon`` per region over the horizon."""
    by_name = {c.name: c for c in clouds}
    carbon = carbon or {}
    e = usd = rent = co2 = e_nc = dh = 0.0
    for p in placements:
        c = by_name[p.cloud]
        occ = occupancy(p.end - p.start)
        devs = p.devices
        hours = np.arange(p.start, p.start + len(occ))
        kwh = devs * occ * c.power_w / 1000.0 * c.pue  # per hour
        e += kwh.sum() / 1000.0
        usd += float((kwh / 1000.0 * prices[c.region][hours]).sum())
        rent += devs * occ.sum() * c.rental
        dh += devs * occ.sum()
        if c.region in carbon:
            co2 += float((kwh * carbon[c.region][hours]).sum()) / 1000.0
        else:
            e_nc += kwh.sum() / 1000.0
    return Accounting(e, usd, rent, co2, e_nc, dh)


@dataclass
class Optimum:
    electricity_usd: float  # objective: energy cost (plus rental when include_rental)
    status: str
    fractional_jobs: int  # training jobs split over more than one (cloud, start)
    x: np.ndarray | None = None


def optimum(jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec], horizon: int,
            prices: dict[str, np.ndarray], include_rental: bool = False) -> Optimum:
    """Offline LP optimum with perfect knowledge of ``prices`` (region -> USD/MWh over the horizon)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    nC = len(clouds)
    rate = np.empty((nC, horizon))  # USD per device-hour
    for ci, c in enumerate(clouds):
        rate[ci] = energy_price_per_device_hour(c.power_w, 1.0, c.pue) * np.asarray(prices[c.region][:horizon], dtype=float)
        if include_rental:
            rate[ci] += c.rental
    cost: list[float] = []
    rows: list[int] = []  # capacity rows: c * horizon + t
    cols: list[int] = []
    vals: list[float] = []
    eq_rows: list[int] = []
    eq_cols: list[int] = []
    eq_vals: list[float] = []
    b_eq: list[float] = []
    owner: list[int] = []
    nvar = 0
    infeasible = []
    for j, job in enumerate(jobs):
        occ = occupancy(job.runtime_h)
        last = min(job.last_start, horizon - len(occ))
        before = nvar
        for c in _allowed(clouds, job.allowed):
            if job.devices > clouds[c].devices + 1e-9:
                continue
            wc = _window_cost(rate[c], occ)
            for s in range(job.arrival, last + 1):
                cost.append(job.devices * wc[s])
                for k, o in enumerate(occ):
                    rows.append(c * horizon + s + k)
                    cols.append(nvar)
                    vals.append(job.devices * o)
                eq_rows.append(len(b_eq))
                eq_cols.append(nvar)
                eq_vals.append(1.0)
                owner.append(j)
                nvar += 1
        if nvar == before:
            infeasible.append(job.name)
        b_eq.append(1.0)
    for b in batches:
        before = nvar
        for c in _allowed(clouds, b.allowed):
            for t in range(b.arrival, min(b.deadline, horizon)):
                cost.append(rate[c, t])
                rows.append(c * horizon + t)
                cols.append(nvar)
                vals.append(1.0)
                eq_rows.append(len(b_eq))
                eq_cols.append(nvar)
                eq_vals.append(1.0)
                owner.append(-1)
                nvar += 1
        if nvar == before:
            infeasible.append(b.name)
        b_eq.append(b.device_hours)
    if infeasible:
        return Optimum(math.inf, f"infeasible: no (cloud, start) meets the deadline of {', '.join(infeasible[:5])}", 0)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(nC * horizon, nvar)).tocsr()
    b_ub = np.repeat([c.devices for c in clouds], horizon).astype(float)
    a_eq = coo_matrix((eq_vals, (eq_rows, eq_cols)), shape=(len(b_eq), nvar)).tocsr()
    res = linprog(np.asarray(cost), A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.asarray(b_eq), bounds=(0, None), method="highs")
    if res.status != 0:
        return Optimum(math.inf, f"LP {res.message}", 0)
    own = np.asarray(owner)
    x = res.x
    split = 0
    if len(jobs):
        counts = np.bincount(own[(own >= 0) & (x > 1e-6)], minlength=len(jobs))
        split = int((counts > 1).sum())
    return Optimum(float(res.fun), "optimal", split, x)


def schedule_rolling(jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec], horizon: int,
                     view: PriceView, t0: int = 0, start_threshold: float = 0.5, miss_penalty: float = 1e3,
                     margin_h: int = 1, preempt: bool = True, preempt_overhead_h: float = 0.25,
                     preempt_min_slack_h: float = 12.0, big_share: float = 0.5, hold_headroom: float = 0.25,
                     milp_time_limit_s: float = 10.0, expect_arrivals: bool = True,
                     last_resort_slack_h: float = 3.0) -> Schedule:
    """The online price-aware policy as a rolling linear program (``policy="price-lp"`` of ``schedule``).

    Every hour ``now``, the work that has arrived and not started -- training
    jobs and the rest of each batch -- is planned by an LP over the hours from
    ``now`` on, with the prices a decision at ``now`` sees (``view``: day-ahead
    prices already published, a forecast beyond), the devices left by the work
    already started, and the deadlines (each job may also stay unserved at a
    large penalty, so the LP is always feasible). The starts at ``now`` are
    whole (a mixed-integer program: a job starts now on one cloud or not at
    all, within the free devices; later hours stay fractional), because a
    relaxed plan splits jobs over the cheap devices and rounding it started
    the remainder on dearer clouds. Only the plan for ``now`` is carried out:
    a training job starts now on the cloud the plan gives it at ``now`` (a
    job not yet due never on another one), or, when it is due, on the
    cheapest cloud where it fits; the batches' device-hours planned for
    ``now`` run.
    Everything else waits for the next hour, when it is planned again with
    what is known then. With ``expect_arrivals``, the plan also holds the
    work expected in the next 24 h, forecast seasonal-naively like the
    prices (the training jobs that arrived in the last 24 h, a day later):
    it is never run, but it keeps the room on the cheap clouds that urgent
    arrivals will need, instead of filling them with work that could wait. Work not started holds no devices (but for the
    holds below), so urgent arrivals are seldom blocked by deferrable work
    that has not started.

    A job due soon (``now`` within ``margin_h`` of its last start that meets
    the deadline) that the plan puts in a later hour has that (cloud, start)
    reserved now, so that the cheap hour it waited for stays its own, if that
    leaves ``hold_headroom`` of the cloud's devices free in those hours for
    urgent work still to come; otherwise it takes the cheapest of starting
    now and holding another start before its last one that leaves that
    room (``milp_time_limit_s`` bounds each hour's solve; past it, the
    relaxation's plan is used). Starting every such job ``margin_h`` before its last start
    gave up the cheapest hours of most deferrable jobs (the LP tends to plan
    them at the end of their windows); holding them all filled the cheap
    hours so that urgent arrivals missed their deadlines. With
    ``preempt``, a job that must start now and finds no room may pause
    running jobs whose deadlines leave at least ``preempt_min_slack_h`` of
    slack (they checkpoint; the rest of their run, plus
    ``preempt_overhead_h`` of redone work, is planned again like new work);
    when that is not enough, as a last resort, it may also pause jobs with at
    least ``last_resort_slack_h`` of slack. Pausing only the jobs with a lot
    of slack missed big urgent jobs on clouds full of work running late in its
    window. With that last resort, a due job can wait until ``margin_h`` = 1 h
    before its last start (rather than 2 h) for the plan's cheap hour: over
    six weeks of 2023 that saved more with no more misses.
    Paused jobs run in two or more pieces, which the contiguous-start LP of
    ``optimum`` does not model; pauses are few and cost the redone work.

    A job that must start and finds no room even after pausing others holds
    the earliest start where its devices are free (a reservation later work
    cannot take) when that start meets its deadline; otherwise it tries again
    next hour (work ends, pausing may then make room) until its last start,
    when it takes that hold anyway. A job needing at least ``big_share`` of the devices of every cloud it may
    use is hard to fit later (a cloud must drain for it): it is reserved at
    arrival instead, at the (cloud, start) of least expected cost before its
    deadline where its devices are free, and that reservation is kept.
    """
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp
    from scipy.sparse import coo_matrix

    nC = len(clouds)
    cal = _Calendar(clouds, horizon)
    out = Schedule("price-lp")
    arrivals = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
    b_arrivals = sorted(range(len(batches)), key=lambda i: (batches[i].arrival, i))
    pending: list[TrainingJob] = []
    remaining: dict[int, float] = {}
    ji = bi = 0
    first = min([j.arrival for j in jobs] + [b.arrival for b in batches], default=0)
    placed: list[Placement] = []
    running: dict[str, tuple[Placement, TrainingJob, int]] = {}
    paused: set[str] = set()  # paused once: not paused again

    def _make_room(job: TrainingJob, occ: np.ndarray, now: int, cands: list[int], rates: np.ndarray,
                   min_slack_h: float) -> int | None:
        """Pause running jobs with ``min_slack_h`` of slack (they checkpoint and are planned again) to start ``job`` now."""
        for c in sorted(cands, key=lambda c: rates[c, 0]):
            victims = []
            for name, (p, other, oc) in running.items():
                if oc != c or p.end <= now + 1e-9 or p.start >= now or name in paused:
                    continue
                left = p.end - now + preempt_overhead_h
                slack = other.deadline - now - left
                if slack >= min_slack_h:
                    victims.append((-slack, name))
            if not victims:
                continue
            trial = cal.used[c].copy()
            chosen_victims = []
            for _, name in sorted(victims):
                p, other, _ = running[name]
                tail = occupancy(other.runtime_h)[now - p.start:]
                trial[now:now + len(tail)] -= p.devices * tail
                chosen_victims.append(name)
                end = now + len(occ)
                if end <= horizon and np.all(trial[now:end] + job.devices * occ <= cal.cap[c] + 1e-9):
                    break
            else:
                continue
            for name in chosen_victims:
                p, other, _ = running.pop(name)
                tail = occupancy(other.runtime_h)[now - p.start:]
                cal.reserve(c, now, p.devices, tail, sign=-1.0)
                left = p.end - now
                p.end, p.device_hours = float(now), p.devices * (now - p.start)
                out.preempted.append(name)
                paused.add(name)
                pending_extra.append(TrainingJob(other.name, other.devices, left + preempt_overhead_h, now, other.deadline,
                                                 other.allowed, other.home))
            return c
        return None

    def _take(job: TrainingJob, c: int, st: int, occ: np.ndarray, kept: bool = False) -> None:
        """Run (or hold) ``job`` on cloud ``c`` from ``st``; a ``kept`` reservation is never paused or released."""
        cal.reserve(c, st, job.devices, occ)
        placed.append(Placement(job.name, clouds[c].name, st, job.devices * job.runtime_h, st + job.runtime_h, job.devices))
        if not kept:
            running[job.name] = (placed[-1], job, c)

    def _cheapest_slot(job: TrainingJob, occ: np.ndarray, now: int, last_ok: int, rates: np.ndarray,
                       later_share: float) -> tuple[int, int] | None:
        """(cloud, start) of least expected cost: now where the devices are free, or a later start by
        ``last_ok`` that leaves ``1 - later_share`` of the cloud free."""
        best = None
        for c in _allowed(clouds, job.allowed):
            if len(occ) > rates.shape[1]:
                continue
            wc = _window_cost(rates[c], occ)
            starts = ([now] if cal.fits(c, now, job.devices, occ) else []) + cal.feasible_starts(
                c, now + 1, min(last_ok, now + len(wc) - 1), job.devices, occ, later_share)
            for st in starts:
                if best is None or wc[st - now] < best[0]:
                    best = (wc[st - now], c, st)
        return None if best is None else best[1:]

    def reserve_big(job: TrainingJob, now: int, rates: np.ndarray) -> bool:
        cands = _allowed(clouds, job.allowed)
        if not cands or job.devices < big_share * max(cal.cap[c] for c in cands):
            return False
        occ = occupancy(job.runtime_h)
        best = _cheapest_slot(job, occ, now, job.last_start, rates, 1.0)
        if best is None:
            return False  # planned hourly like the rest (and may pause others when it must start)
        _take(job, *best, occ, kept=True)
        return True

    pending_extra: list[TrainingJob] = []
    arrival_hours = [jobs[i].arrival for i in arrivals]
    for now in range(first, horizon):
        pending.extend(pending_extra)
        pending_extra.clear()
        span = horizon - now
        rates = np.empty((nC, span))  # expected USD per device-hour, as seen now
        for ci, c in enumerate(clouds):
            p = np.asarray(view(c.region, t0 + now, t0 + now, span), dtype=float)
            rates[ci] = c.rental + energy_price_per_device_hour(c.power_w, 1.0, c.pue) * p
        while ji < len(arrivals) and jobs[arrivals[ji]].arrival <= now:
            j = jobs[arrivals[ji]]
            ji += 1
            if not reserve_big(j, now, rates):
                pending.append(j)
        while bi < len(b_arrivals) and batches[b_arrivals[bi]].arrival <= now:
            remaining[b_arrivals[bi]] = batches[b_arrivals[bi]].device_hours
            bi += 1
        if not pending and not any(v > 1e-9 for v in remaining.values()):
            if ji >= len(arrivals) and bi >= len(b_arrivals):
                break
            continue
        free = np.maximum(cal.cap[:, None] - cal.used[:, now:], 0.0)
        cost, rows, cols, vals, eq_r, eq_c, b_eq = [], [], [], [], [], [], []
        var_job: list[tuple[int, int, int]] = []  # (pending index or -1-batch, cloud, start offset)
        # the work expected in the next 24 h (the jobs of the last 24 h, a day later) is planned too, never run
        recent = (jobs[i] for i in arrivals[bisect.bisect_right(arrival_hours, now - 24):ji])
        expected = [TrainingJob(j.name, j.devices, j.runtime_h, j.arrival + 24, j.deadline + 24, j.allowed, j.home)
                    for j in recent] if expect_arrivals else []
        for pj, job in [*enumerate(pending), *((_EXPECTED, j) for j in expected)]:
            occ = occupancy(job.runtime_h)
            last = min(job.last_start, horizon - len(occ)) - now
            for c in _allowed(clouds, job.allowed):
                if job.devices > clouds[c].devices + 1e-9 or last < 0:
                    continue
                wc = _window_cost(rates[c], occ)
                for s in range(max(0, job.arrival - now), last + 1):
                    v = len(cost)
                    cost.append(job.devices * wc[s])
                    for k, o in enumerate(occ):
                        rows.append(c * span + s + k)
                        cols.append(v)
                        vals.append(job.devices * o)
                    eq_r.append(len(b_eq))
                    eq_c.append(v)
                    var_job.append((pj, c, s))
            v = len(cost)  # unserved
            cost.append(miss_penalty * job.devices * max(job.runtime_h, 1.0))
            eq_r.append(len(b_eq))
            eq_c.append(v)
            var_job.append((pj, -1, -1))
            b_eq.append(1.0)
        batch_ids = [b for b, r in remaining.items() if r > 1e-9]
        for b in batch_ids:
            bj = batches[b]
            for c in _allowed(clouds, bj.allowed):
                for t in range(now, min(bj.deadline, horizon)):
                    v = len(cost)
                    cost.append(rates[c, t - now])
                    rows.append(c * span + t - now)
                    cols.append(v)
                    vals.append(1.0)
                    eq_r.append(len(b_eq))
                    eq_c.append(v)
                    var_job.append((-1 - b, c, t - now))
            v = len(cost)
            cost.append(miss_penalty)
            eq_r.append(len(b_eq))
            eq_c.append(v)
            var_job.append((-1 - b, -1, -1))
            b_eq.append(remaining[b])
        n = len(cost)
        a_ub = coo_matrix((vals, (rows, cols)), shape=(nC * span, n)).tocsr()
        a_eq = coo_matrix((np.ones(len(eq_c)), (eq_r, eq_c)), shape=(len(b_eq), n)).tocsr()
        # this hour's starts are whole (a job starts now on one cloud, or not); the future stays fractional
        now_starts = np.array([owner >= 0 and c >= 0 and s == 0 for owner, c, s in var_job], dtype=int)
        res = milp(np.asarray(cost), integrality=now_starts, bounds=Bounds(0, np.inf),
                   constraints=[LinearConstraint(a_ub, -np.inf, free.reshape(-1)),
                                LinearConstraint(a_eq, np.asarray(b_eq), np.asarray(b_eq))],
                   options={"time_limit": milp_time_limit_s, "mip_rel_gap": 1e-3})
        if res.x is None:  # no whole solution in time: the relaxation's plan, rounded below
            res = linprog(np.asarray(cost), A_ub=a_ub, b_ub=free.reshape(-1), A_eq=a_eq, b_eq=np.asarray(b_eq),
                          bounds=(0, None), method="highs")
        x = res.x if res.x is not None else np.zeros(n)
        share_now: dict[int, np.ndarray] = {}
        planned: dict[int, tuple[float, int, int]] = {}  # pending job -> its largest (share, cloud, start offset)
        batch_now: list[tuple[int, int, float]] = []
        for v, (owner, c, s) in enumerate(var_job):
            if owner >= 0 and c >= 0 and x[v] > planned.get(owner, (1e-9,))[0]:
                planned[owner] = (x[v], c, s)
            if c < 0 or s != 0 or x[v] <= 1e-9:
                continue
            if owner >= 0:
                share_now.setdefault(owner, np.zeros(nC))[c] += x[v]
            else:
                batch_now.append((-1 - owner, c, x[v]))
        # batches: run what the plan gives this hour
        for b, c, amount in batch_now:
            take = min(amount, remaining[b], cal.cap[c] - cal.used[c, now])
            if take > 1e-9:
                cal.used[c, now] += take
                remaining[b] -= take
                placed.append(Placement(batches[b].name, clouds[c].name, now, take, now + 1, take))
        # training jobs: start now where the plan says so (or must), largest share first
        still: list[TrainingJob] = []
        order = sorted(range(len(pending)), key=lambda pj: (now < pending[pj].last_start - margin_h,
                                                            -share_now.get(pj, np.zeros(1)).sum(), pending[pj].deadline))
        for pj in order:
            job = pending[pj]
            occ = occupancy(job.runtime_h)
            last_ok = job.last_start
            sh = share_now.get(pj)
            must = now >= last_ok - margin_h
            if not must and (sh is None or sh.sum() < start_threshold):
                still.append(job)
                continue
            if (sh is None or sh.sum() < start_threshold) and pj in planned and planned[pj][2] > 0:
                # due soon but planned for a later (cheaper) hour: reserve that hour rather than start now
                _, c, later = planned[pj]
                if cal.feasible_starts(c, now + later, now + later, job.devices, occ, 1.0 - hold_headroom):
                    _take(job, c, now + later, occ)
                    continue
                # that slot is gone: the cheapest of starting now anywhere and holding another start in time
                best = _cheapest_slot(job, occ, now, last_ok, rates, 1.0 - hold_headroom)
                if best is not None:
                    _take(job, *best, occ)
                    continue
            cands = _allowed(clouds, job.allowed)
            # a job not yet due starts only where the plan puts it now; a due one anywhere, cheapest first
            prefs = [int(c) for c in np.argsort(-sh) if sh[c] > 1e-9 and c in cands] if sh is not None else []
            rest = sorted((c for c in cands if c not in prefs), key=lambda c: _window_cost(rates[c], occ)[0] if len(occ) <= span else 0) if must else []
            chosen = None
            for c in prefs + rest:
                if cal.fits(c, now, job.devices, occ):
                    chosen = c
                    break
            if chosen is None and must and preempt:
                chosen = _make_room(job, occ, now, cands, rates, preempt_min_slack_h)
                if chosen is None:  # the last resort: jobs with less slack
                    chosen = _make_room(job, occ, now, cands, rates, last_resort_slack_h)
            if chosen is None and must:
                # no room now even after pausing: hold the earliest start where its devices are free, so that
                # later work cannot starve it; one that misses the deadline only once no later hour can do better
                early = None
                for c in cands:
                    st = cal.feasible_starts(c, now + 1, horizon - 1, job.devices, occ)
                    if st and (early is None or st[0] < early[1]):
                        early = (c, st[0])
                late = early is not None and early[1] + job.runtime_h > job.deadline + 1e-9
                if early is not None and (not late or now >= last_ok):
                    _take(job, *early, occ, kept=True)
                    if late and job.name not in out.misses:
                        out.misses.append(job.name)
                    continue
            if chosen is None:  # no room now: tried again next hour (a miss once past its last start)
                if now > last_ok and job.name not in out.misses:
                    out.misses.append(job.name)
                still.append(job)
                continue
            _take(job, chosen, now, occ)
            if now + job.runtime_h > job.deadline + 1e-9 and job.name not in out.misses:
                out.misses.append(job.name)
        pending = still
    for job in pending:
        if job.name not in out.misses:
            out.misses.append(job.name)
        out.unplaced.append(job.name)
    for b, r in remaining.items():
        if r > 1e-6:
            out.misses.append(batches[b].name)
            out.unplaced.append(batches[b].name)
    by_b = {b.name: b for b in batches}
    for p in placed:
        if p.job in by_b and p.start >= by_b[p.job].deadline and p.job not in out.misses:
            out.misses.append(p.job)
    out.placements = placed
    return out
