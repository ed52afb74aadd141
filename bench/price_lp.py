"""The electricity benchmark's reference policies: the rolling price LP (``--policy price-lp``) and the offline optimum.

Kept in ``bench/`` for comparison with the production scheduler
(``crosscloud.scheduler.timing`` and ``crosscloud.scheduler.deadlines``); no
DAG or package module imports it. Jobs with deadlines (training: devices for a
run time on one cloud; batch inference: device-hours divisible over clouds and
hours) are placed by what each device-hour would cost, rental plus energy at
the price known or forecast then, never oversubscribing a cloud and never past
a deadline it can meet. The price-unaware (least-loaded) reference and the LP
optimum (a lower bound on any schedule's cost) run on the same model, so the
benchmark compares like with like. The model and the policies are described in
``docs/energy-and-grid.md``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from crosscloud.energy.power import DEFAULT_PUE, energy_price_per_device_hour
from crosscloud.scheduler.deadlines import Guard, Item, infeasible_alone, witness


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
    infeasible: dict[str, str] = field(default_factory=dict)  # work no schedule could finish in time: name -> why
    at_risk: dict[str, int] = field(default_factory=dict)  # admitted work the guard could no longer protect: hour

    @property
    def missed_feasible(self) -> list[str]:
        """Misses of work that was feasible at arrival: what the policy itself lost."""
        return [m for m in self.misses if m not in self.infeasible]


def occupancy(runtime_h: float) -> np.ndarray:
    """Fraction of each hour a job of ``runtime_h`` holds its devices (1, 1, ..., partial)."""
    n = max(1, math.ceil(runtime_h - 1e-9))
    occ = np.ones(n)
    occ[-1] = runtime_h - (n - 1)
    return occ


def _allowed(clouds: Sequence[CloudSpec], allowed: frozenset[str] | None) -> list[int]:
    return [i for i, c in enumerate(clouds) if allowed is None or c.name in allowed]


def job_item(job: TrainingJob, clouds: Sequence[CloudSpec]) -> Item:
    """A training job as the deadline guard schedules it."""
    return Item(job.name, job.deadline, tuple(_allowed(clouds, job.allowed)), devices=job.devices,
                occ=occupancy(job.runtime_h), arrival=job.arrival)


def batch_item(batch: BatchJob, clouds: Sequence[CloudSpec], device_hours: float) -> Item:
    """A batch's ``device_hours`` still to run, as the deadline guard schedules it."""
    return Item(batch.name, batch.deadline, tuple(_allowed(clouds, batch.allowed)), device_hours=device_hours,
                arrival=batch.arrival)


def infeasible_work(jobs: Sequence[TrainingJob], batches: Sequence[BatchJob],
                    clouds: Sequence[CloudSpec]) -> dict[str, str]:
    """The work no policy could finish in time even on empty clouds, with why."""
    cap = np.array([c.devices for c in clouds], dtype=float)
    items = [(job_item(j, clouds), j.arrival) for j in jobs] + [(batch_item(b, clouds, b.device_hours), b.arrival)
                                                                 for b in batches]
    return {item.name: why for item, arrival in items if (why := infeasible_alone(cap, item, arrival))}


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


def _expected_rates(clouds: Sequence[CloudSpec], view: PriceView, decision: int, start: int, hours: int) -> np.ndarray:
    """Expected USD per device-hour (rental + energy) per cloud for absolute hours ``start ..``, as seen at ``decision``."""
    rates = np.empty((len(clouds), hours))
    for ci, c in enumerate(clouds):
        p = np.asarray(view(c.region, decision, start, hours), dtype=float)
        rates[ci] = c.rental + energy_price_per_device_hour(c.power_w, 1.0, c.pue) * p
    return rates


class _Greedy:
    """The greedy online policies (``"price"``, ``"least-loaded"``) deciding jobs one at a time, in arrival order.

    Holds the device calendar, the schedule being built and the training
    reservations that have not started yet: those may still give way to a job
    that fits nowhere else, or be re-planned when new prices are published.
    """

    def __init__(self, policy: str, clouds: Sequence[CloudSpec], horizon: int, view: PriceView | None, t0: int,
                 headroom: float, deferrable_slack_h: float):
        self.policy = policy
        self.clouds = clouds
        self.horizon = horizon
        self.view = view
        self.t0 = t0
        self.headroom = headroom
        self.deferrable_slack_h = deferrable_slack_h
        self.cal = _Calendar(clouds, horizon)
        self.out = Schedule(policy)
        self.pending: dict[str, tuple[TrainingJob, int, int]] = {}  # reserved, not started: name -> (job, cloud, start)
        self.placed_training: dict[str, Placement] = {}
        self._rates: dict[int, np.ndarray] = {}

    def rates_at(self, decision: int) -> np.ndarray:
        """Expected USD per device-hour per cloud over the horizon, as seen at ``decision``.

        Knowledge changes only at publication and at midnight, so the rates are cached per decision hour.
        """
        if decision not in self._rates:
            self._rates[decision] = _expected_rates(self.clouds, self.view, self.t0 + decision, self.t0, self.horizon)
        return self._rates[decision]

    def place_training(self, job: TrainingJob, now: int, bump: bool = True) -> None:
        """Reserve the (cloud, start) the policy picks for ``job``, deciding at hour ``now``.

        With ``bump``, when no start meets the deadline, unstarted reservations give way (``_give_way``).
        """
        occ = occupancy(job.runtime_h)
        cands = _allowed(self.clouds, job.allowed)
        if self.policy == "price":
            best = self._cheapest_start(job, now, occ, cands)
        else:
            best = self._least_loaded_start(job, now, occ, cands)
        if best is None and self.policy == "price" and bump and self.pending and self._give_way(job, now, cands):
            return
        if best is None:  # meets no deadline: as early as possible anywhere allowed
            best = self._earliest_start(job, now, occ, cands)
        if best is None:
            self.out.misses.append(job.name)
            self.out.unplaced.append(job.name)
            return
        self._reserve(job, now, occ, *best)

    def _cheapest_start(self, job: TrainingJob, now: int, occ: np.ndarray, cands: list[int]) -> tuple[int, int] | None:
        """(cloud, start) of least expected cost whose devices are free and which meets the deadline.

        A deferrable job first looks only within ``1 - headroom`` of each cloud, keeping room for urgent work.
        """
        rates = self.rates_at(now)
        last_ok = job.last_start
        deferrable = job.deadline - job.arrival - job.runtime_h >= self.deferrable_slack_h
        share = 1.0 - self.headroom if deferrable and now < last_ok else 1.0
        best = None
        for c in cands:
            starts = self.cal.feasible_starts(c, now, last_ok, job.devices, occ, share)
            if not starts and share < 1.0:
                starts = self.cal.feasible_starts(c, now, last_ok, job.devices, occ)
            if not starts:
                continue
            cost = _window_cost(rates[c], occ)
            for s in starts:
                key = (cost[s] * job.devices, s, c)
                if best is None or key < best[0]:
                    best = (key, c, s)
        return None if best is None else best[1:]

    def _least_loaded_start(self, job: TrainingJob, now: int, occ: np.ndarray, cands: list[int]) -> tuple[int, int] | None:
        """(cloud, start) as soon as possible, preferring a start that meets the deadline, then the least-loaded cloud now."""
        best = None
        for c in cands:
            starts = self.cal.feasible_starts(c, now, self.horizon - 1, job.devices, occ)
            if not starts:
                continue
            s = starts[0]
            load = self.cal.used[c, now] / self.cal.cap[c]
            key = (s > job.last_start, s, load, c)
            if best is None or key < best[0]:
                best = (key, c, s)
        return None if best is None else best[1:]

    def _earliest_start(self, job: TrainingJob, now: int, occ: np.ndarray, cands: list[int]) -> tuple[int, int] | None:
        """(cloud, start) of the earliest start anywhere allowed, deadline or not."""
        best = None
        for c in cands:
            starts = self.cal.feasible_starts(c, now, self.horizon - 1, job.devices, occ)
            if starts and (best is None or starts[0] < best[1]):
                best = (c, starts[0])
        return best

    def _give_way(self, job: TrainingJob, now: int, cands: list[int]) -> bool:
        """Release the unstarted reservations on ``cands``, place ``job``, then decide them again (earliest deadline first).

        False, with nothing changed, when there is no such reservation.
        """
        released = self._release_unstarted(now, cands)
        if not released:
            return False
        self.place_training(job, now, bump=False)
        self._decide_again(released, now, bump=False)
        return True

    def _release_unstarted(self, now: int, cands: list[int] | None = None) -> list[tuple[TrainingJob, int, int]]:
        """Take back the reservations starting after ``now`` (on ``cands`` when given): their devices are free again."""
        released = [self.pending.pop(n) for n in list(self.pending)
                    if self.pending[n][2] > now and (cands is None or self.pending[n][1] in cands)]
        for job, c, s in released:
            self.cal.reserve(c, s, job.devices, occupancy(job.runtime_h), sign=-1.0)
            self.placed_training.pop(job.name)
        return released

    def _decide_again(self, released: list[tuple[TrainingJob, int, int]], now: int, bump: bool) -> None:
        for job, _, _ in sorted(released, key=lambda x: (x[0].deadline, x[0].name)):
            self.place_training(job, now, bump=bump)

    def _reserve(self, job: TrainingJob, now: int, occ: np.ndarray, c: int, s: int) -> None:
        self.cal.reserve(c, s, job.devices, occ)
        self.placed_training[job.name] = Placement(job.name, self.clouds[c].name, s, job.devices * job.runtime_h,
                                                   s + job.runtime_h, job.devices)
        if s > now:
            self.pending[job.name] = (job, c, s)

    def place_batch(self, b: BatchJob, now: int) -> None:
        """Spread batch ``b`` over free device-hours from ``now``; a miss when some is left or runs past its deadline."""
        cands = _allowed(self.clouds, b.allowed)
        if self.policy == "price":
            need = self._fill_cheapest(b, now, cands)
        else:
            need = self._fill_least_loaded(b, now, cands)
        if need > 1e-6:
            self.out.misses.append(b.name)
            self.out.unplaced.append(b.name)
        elif any(p.job == b.name and p.start >= b.deadline for p in self.out.placements):
            self.out.misses.append(b.name)

    def _fill_cheapest(self, b: BatchJob, now: int, cands: list[int]) -> float:
        """Fill the cheapest free (cloud, hour) device-hours before the deadline; returns the work left."""
        need = b.device_hours
        rates = self.rates_at(now)
        slots = sorted((rates[c, t], t, c) for c in cands for t in range(now, min(b.deadline, self.horizon)))
        for _, t, c in slots:
            if need <= 1e-9:
                break
            need = self._fill(b, c, t, need)
        return need

    def _fill_least_loaded(self, b: BatchJob, now: int, cands: list[int]) -> float:
        """Fill hour by hour from ``now``, least-loaded cloud first, deadline or not; returns the work left."""
        need = b.device_hours
        for t in range(now, self.horizon):
            if need <= 1e-9:
                break
            for c in sorted(cands, key=lambda c: (self.cal.used[c, t] / self.cal.cap[c], c)):
                need = self._fill(b, c, t, need)
                if need <= 1e-9:
                    break
        return need

    def _fill(self, b: BatchJob, c: int, t: int, need: float) -> float:
        """Run as much of ``need`` as cloud ``c`` has free at hour ``t``; returns what is left."""
        take = min(need, self.cal.cap[c] - self.cal.used[c, t])
        if take > 1e-9:
            self.cal.used[c, t] += take
            self.out.placements.append(Placement(b.name, self.clouds[c].name, t, take, t + 1, take))
            need -= take
        return need

    def replan_at_publications(self, since: int, until: int, publish_hour_utc: int) -> None:
        """Each publication of day-ahead prices in hours ``since+1 .. until`` re-plans what has not started."""
        for h in range(since + 1, until + 1):
            if (self.t0 + h) % 24 == publish_hour_utc:
                self.forget_started(h)
                self._replan_pending(h)

    def _replan_pending(self, now: int) -> None:
        if not self.pending:
            return
        self._decide_again(self._release_unstarted(now), now, bump=True)

    def forget_started(self, now: int) -> None:
        """Reservations started by ``now`` stay where they are: they are no longer pending."""
        for n in [n for n, (_, _, s) in self.pending.items() if s <= now]:
            self.pending.pop(n)

    def finish(self, jobs: Sequence[TrainingJob]) -> Schedule:
        """The schedule: training placements first, then the batches'; a training job ending past its deadline is a miss."""
        out = self.out
        out.placements = list(self.placed_training.values()) + out.placements
        by_name = {j.name: j for j in jobs}
        for p in self.placed_training.values():
            if p.end > by_name[p.job].deadline + 1e-9 and p.job not in out.misses:
                out.misses.append(p.job)
        return out


def schedule(policy: str, jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec],
             horizon: int, view: PriceView | None = None, t0: int = 0, replan: bool = False,
             publish_hour_utc: int = 12, headroom: float = 0.0, deferrable_slack_h: float = 6.0,
             **rolling) -> Schedule:
    """Run ``policy`` ("price", "price-lp" or "least-loaded") online over the jobs; see the module docstring.

    ``view(region, decision_hour, start, hours)`` gives the prices (USD/MWh)
    a decision at absolute hour ``decision_hour`` sees for absolute hours
    ``start .. start+hours-1``; the schedule's hours are relative to ``t0``.
    ``rolling``: settings of ``schedule_rolling`` (policy "price-lp").
    """
    if policy not in ("price", "price-lp", "least-loaded"):
        raise ValueError(f"unknown policy {policy!r}; expected 'price', 'price-lp' or 'least-loaded'")
    if policy in ("price", "price-lp") and view is None:
        raise ValueError("the price-aware policy needs a price view")
    if policy == "price-lp":
        return schedule_rolling(jobs, batches, clouds, horizon, view, t0, **rolling)
    state = _Greedy(policy, clouds, horizon, view, t0, headroom, deferrable_slack_h)
    events = sorted([(j.arrival, 0, i) for i, j in enumerate(jobs)] + [(b.arrival, 1, i) for i, b in enumerate(batches)])
    last_time = None
    for arrival, kind, i in events:
        if arrival >= horizon:
            raise ValueError(f"job arrives at hour {arrival}, beyond the horizon of {horizon} h")
        if replan and policy == "price" and last_time is not None:
            state.replan_at_publications(last_time, arrival, publish_hour_utc)
        last_time = arrival
        state.forget_started(arrival)
        if kind == 0:
            state.place_training(jobs[i], arrival)
        else:
            state.place_batch(batches[i], arrival)
    return state.finish(jobs)

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



@dataclass(frozen=True)
class _RollingKnobs:
    """The settings of the rolling policy; each is described in ``schedule_rolling``."""

    start_threshold: float
    miss_penalty: float
    margin_h: int
    preempt: bool
    preempt_overhead_h: float
    preempt_min_slack_h: float
    last_resort_slack_h: float
    big_share: float
    hold_headroom: float
    milp_time_limit_s: float
    expect_arrivals: bool
    urgent_slack_h: float = 0.0
    holdback_window_h: int = 24


class _HourPlan:
    """One hour's plan of the rolling policy: a mixed-integer LP, built variable by variable.

    A training variable is the share of a job started at (cloud, offset), a
    batch variable the device-hours of a batch at (cloud, offset); offsets are
    hours from ``now``. Each job and batch also has an *unserved* variable
    (cloud -1) at ``miss_penalty`` per device-hour, so the LP is always feasible.
    A variable's owner is the job's index in the pending list, ``-1 - b`` for
    batch ``b``, or ``_EXPECTED``.
    """

    def __init__(self, clouds: Sequence[CloudSpec], now: int, horizon: int, rates: np.ndarray, miss_penalty: float):
        self.clouds = clouds
        self.now = now
        self.horizon = horizon
        self.span = horizon - now
        self.rates = rates
        self.miss_penalty = miss_penalty
        self.cost: list[float] = []
        self.rows: list[int] = []  # capacity rows: cloud * span + offset
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.eq_r: list[int] = []  # one equality row per job or batch: its variables add up to its work
        self.eq_c: list[int] = []
        self.b_eq: list[float] = []
        self.var_job: list[tuple[int, int, int]] = []  # (owner, cloud, offset); (owner, -1, -1) when unserved

    def _var(self, owner: int, c: int, s: int, cost: float) -> int:
        """A new variable of ``owner``'s equality row; returns its column."""
        v = len(self.cost)
        self.cost.append(cost)
        self.eq_r.append(len(self.b_eq))
        self.eq_c.append(v)
        self.var_job.append((owner, c, s))
        return v

    def _uses(self, v: int, c: int, s: int, devices: float) -> None:
        """Variable ``v`` takes ``devices`` per unit on cloud ``c`` at offset ``s``."""
        self.rows.append(c * self.span + s)
        self.cols.append(v)
        self.vals.append(devices)

    def add_training(self, owner: int, job: TrainingJob) -> None:
        occ = occupancy(job.runtime_h)
        last = min(job.last_start, self.horizon - len(occ)) - self.now
        for c in _allowed(self.clouds, job.allowed):
            if job.devices > self.clouds[c].devices + 1e-9 or last < 0:
                continue
            wc = _window_cost(self.rates[c], occ)
            for s in range(max(0, job.arrival - self.now), last + 1):
                v = self._var(owner, c, s, job.devices * wc[s])
                for k, o in enumerate(occ):
                    self._uses(v, c, s + k, job.devices * o)
        self._var(owner, -1, -1, self.miss_penalty * job.devices * max(job.runtime_h, 1.0))
        self.b_eq.append(1.0)

    def add_batch(self, b: int, batch: BatchJob, remaining: float) -> None:
        for c in _allowed(self.clouds, batch.allowed):
            for t in range(self.now, min(batch.deadline, self.horizon)):
                v = self._var(-1 - b, c, t - self.now, self.rates[c, t - self.now])
                self._uses(v, c, t - self.now, 1.0)
        self._var(-1 - b, -1, -1, self.miss_penalty)
        self.b_eq.append(remaining)

    def solve(self, free: np.ndarray, time_limit_s: float) -> np.ndarray:
        """The plan's variables, within ``free`` devices (cloud x offset).

        The relaxation's solution when no whole one is found within ``time_limit_s``.
        """
        from scipy.optimize import Bounds, LinearConstraint, linprog, milp
        from scipy.sparse import coo_matrix

        n = len(self.cost)
        if n == 0:  # nothing left to plan this hour (the deadline guard started it all)
            return np.zeros(0)
        a_ub = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.clouds) * self.span, n)).tocsr()
        a_eq = coo_matrix((np.ones(len(self.eq_c)), (self.eq_r, self.eq_c)), shape=(len(self.b_eq), n)).tocsr()
        # this hour's starts are whole (a job starts now on one cloud, or not), so a job is not split over the
        # cheap devices with the rest left to dearer ones; the future stays fractional
        now_starts = np.array([owner >= 0 and c >= 0 and s == 0 for owner, c, s in self.var_job], dtype=int)
        res = milp(np.asarray(self.cost), integrality=now_starts, bounds=Bounds(0, np.inf),
                   constraints=[LinearConstraint(a_ub, -np.inf, free.reshape(-1)),
                                LinearConstraint(a_eq, np.asarray(self.b_eq), np.asarray(self.b_eq))],
                   options={"time_limit": time_limit_s, "mip_rel_gap": 1e-3})
        if res.x is None:  # no whole solution in time: the relaxation's plan, rounded by the caller
            res = linprog(np.asarray(self.cost), A_ub=a_ub, b_ub=free.reshape(-1), A_eq=a_eq,
                          b_eq=np.asarray(self.b_eq), bounds=(0, None), method="highs")
        return res.x if res.x is not None else np.zeros(n)

    def read(self, x: np.ndarray) -> tuple[dict[int, np.ndarray], dict[int, tuple[float, int, int]],
                                          list[tuple[int, int, float]]]:
        """What the solution ``x`` does now: each pending job's share started now per cloud, each pending job's
        largest planned (share, cloud, offset), and each batch's (batch, cloud, device-hours) now."""
        share_now: dict[int, np.ndarray] = {}
        planned: dict[int, tuple[float, int, int]] = {}
        batch_now: list[tuple[int, int, float]] = []
        for v, (owner, c, s) in enumerate(self.var_job):
            if owner >= 0 and c >= 0 and x[v] > planned.get(owner, (1e-9,))[0]:
                planned[owner] = (x[v], c, s)
            if c < 0 or s != 0 or x[v] <= 1e-9:
                continue
            if owner >= 0:
                share_now.setdefault(owner, np.zeros(len(self.clouds)))[c] += x[v]
            else:
                batch_now.append((-1 - owner, c, x[v]))
        return share_now, planned, batch_now


class _Rolling:
    """The rolling policy's state from hour to hour: the device calendar, the work waiting, running and paused."""

    def __init__(self, jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec],
                 horizon: int, view: PriceView, t0: int, knobs: _RollingKnobs, band: dict[str, float] | None = None,
                 known_until: Callable[[int], int] | None = None):
        self.band, self.known_until = band, known_until
        self.jobs = jobs
        self.batches = batches
        self.clouds = clouds
        self.horizon = horizon
        self.view = view
        self.t0 = t0
        self.k = knobs
        self.cal = _Calendar(clouds, horizon)
        self.out = Schedule("price-lp")
        self.arrivals = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
        self.b_arrivals = sorted(range(len(batches)), key=lambda i: (batches[i].arrival, i))
        self.arrival_hours = [jobs[i].arrival for i in self.arrivals]
        self.ji = self.bi = 0  # the next training job and batch to arrive, in arrival order
        self.pending: list[TrainingJob] = []  # arrived, not started
        self.pending_extra: list[TrainingJob] = []  # the rest of jobs paused this hour: pending from the next
        self.remaining: dict[int, float] = {}  # batch -> device-hours not run yet
        self.placed: list[Placement] = []
        self.running: dict[str, tuple[Placement, TrainingJob, int]] = {}  # may be paused: name -> (placement, job, cloud)
        self.paused: set[str] = set()  # paused once: not paused again
        self.guard = Guard(self.cal.cap, knobs.urgent_slack_h, knobs.holdback_window_h)
        self.now = 0

    def run(self) -> Schedule:
        """Plan and act hour by hour from the first arrival until all work is placed or the horizon ends."""
        first = min([j.arrival for j in self.jobs] + [b.arrival for b in self.batches], default=0)
        for now in range(first, self.horizon):
            self.now = now
            self.pending.extend(self.pending_extra)
            self.pending_extra.clear()
            rates = self._rates(now)
            self._admit(now, rates)
            if not self.pending and not any(v > 1e-9 for v in self.remaining.values()):
                if self.ji >= len(self.arrivals) and self.bi >= len(self.b_arrivals):
                    break
                continue
            self._prune(now)
            self._start_due(now)
            free = np.maximum(self.cal.cap[:, None] - self.cal.used[:, now:], 0.0)
            plan = self._plan(now, rates)
            share_now, planned, batch_now = plan.read(plan.solve(free, self.k.milp_time_limit_s))
            self._run_batches(now, batch_now)
            self._start_training(now, rates, share_now, planned)
        return self._finish()

    def _rates(self, now: int) -> np.ndarray:
        """Expected USD per device-hour from ``now``; hours only forecast carry the forecast's measured error on top
        (``band``), so work waits for a forecast hour only when it is cheaper by more than the forecast misses by."""
        rates = _expected_rates(self.clouds, self.view, self.t0 + now, self.t0 + now, self.horizon - now)
        if self.band and self.known_until is not None:
            known = self.known_until(self.t0 + now) - (self.t0 + now)  # the last hour known, as an offset
            for ci, c in enumerate(self.clouds):
                rates[ci, max(known + 1, 0):] += energy_price_per_device_hour(c.power_w, 1.0, c.pue) * self.band.get(c.region, 0.0)
        return rates

    def _admit(self, now: int, rates: np.ndarray) -> None:
        """The work arriving by ``now``: big training jobs are reserved at once, the rest waits to be planned."""
        while self.ji < len(self.arrivals) and self.jobs[self.arrivals[self.ji]].arrival <= now:
            j = self.jobs[self.arrivals[self.ji]]
            self.ji += 1
            item = job_item(j, self.clouds)
            self._check_arrival(item, now)
            self.guard.observe(now, j.devices, j.runtime_h, j.deadline - now - j.runtime_h, item.clouds)
            if j.name in self.out.infeasible or not self._reserve_big(j, now, rates):  # best effort waits its turn
                self.pending.append(j)
        while self.bi < len(self.b_arrivals) and self.batches[self.b_arrivals[self.bi]].arrival <= now:
            b = self.b_arrivals[self.bi]
            self.remaining[b] = self.batches[b].device_hours
            self._check_arrival(self._batch_item(b), now)
            self.bi += 1

    def _check_arrival(self, item: Item, now: int) -> None:
        """Name work no schedule can finish in time (with the work admitted before it): it runs as best effort.

        A schedule may pause running jobs not paused before (``preempt``): they checkpoint and run their rest later.
        """
        used, resumed = self.cal.used, []
        if self.k.preempt:
            used = self.cal.used.copy()
            for name, (p, other, c) in self.running.items():
                if p.start < now < p.end and name not in self.paused:
                    tail, rest = self._paused_rest(name, now)
                    if now + rest.runtime_h <= rest.deadline + 1e-9:
                        used[c, now:now + len(tail)] -= p.devices * tail
                        resumed.append(rest)
        why = self.guard.admissible(used, self._items(extra=resumed), item, now)
        if why is not None:
            self.out.infeasible[item.name] = why

    def _batch_item(self, b: int) -> Item:
        return batch_item(self.batches[b], self.clouds, self.remaining[b])

    def _items(self, without: frozenset[str] = frozenset(), extra: Sequence[TrainingJob] = ()) -> list[Item]:
        """The admitted work not running yet that the deadline guard protects (work infeasible at arrival is not)."""
        jobs = [*self.pending, *self.pending_extra, *extra]
        skip = {*self.out.infeasible, *self.out.at_risk, *without}
        items = [job_item(j, self.clouds) for j in jobs if j.name not in skip]
        items += [self._batch_item(b) for b, r in self.remaining.items() if r > 1e-9 and self.batches[b].name not in skip]
        return items

    def _prune(self, now: int) -> None:
        """Work the EDF schedule can no longer fit by its deadline (even run at once) leaves the guard's protection:
        it still runs, as best effort, and the rest stays protected. The invariant makes this rare; it is recorded."""
        while True:
            w = witness(self.guard.free(self.cal.used, now, hold=False), self._items(), now)
            if w.ok:
                return
            self.out.at_risk[w.failed] = now

    def _safe(self, now: int, trial: np.ndarray, without: frozenset[str] = frozenset(),
              extra: Sequence[TrainingJob] = (), batch_left: dict[int, float] | None = None, hold: bool = True) -> bool:
        """Whether the guard's invariant holds after a decision that leaves the calendar at ``trial``.

        ``hold``: with the capacity held back for urgent work to come (a decision to wait); without it for one
        made for work that is due (pausing to start it)."""
        items = self._items(without, extra)
        if batch_left:
            names = {self.batches[b].name: left for b, left in batch_left.items()}
            items = [i if i.name not in names else Item(i.name, i.deadline, i.clouds, device_hours=names[i.name],
                                                        arrival=i.arrival) for i in items if names.get(i.name, 1) > 1e-9]
        if hold and self.guard.holds_back and not self._holds_now(now):
            hold = False  # the room held back is already short: judge decisions by the admitted work alone
        return self.guard.keeps(trial, items, now, hold)

    def _holds_now(self, now: int) -> bool:
        """Whether the admitted work has a schedule from the next hour with the room for urgent work held back."""
        return self.guard.keeps(self.cal.used, self._items(), now, True)

    def _start_due(self, now: int) -> None:
        """Start now the work the EDF schedule must start now for every protected deadline to stay reachable."""
        due = self.guard.due_now(self.cal.used, self._items(), now)
        by_name = {j.name: j for j in self.pending}
        for name, (c, st) in due.starts.items():
            job = by_name[name]
            self.pending.remove(job)
            self._take(job, c, st, occupancy(job.runtime_h), force=True)
        by_batch = {self.batches[b].name: b for b in self.remaining}
        for name, fills in due.fills.items():
            b = by_batch[name]
            for c, h, amount in fills:
                self.cal.used[c, h] += amount
                self.remaining[b] -= amount
                self.placed.append(Placement(name, self.clouds[c].name, h, amount, h + 1, amount))

    def _reserve_big(self, job: TrainingJob, now: int, rates: np.ndarray) -> bool:
        """Reserve (for good) a job needing ``big_share`` of every cloud it may use at its cheapest free start.

        Such a job is hard to fit later (a cloud must drain for it). False when it is not big or finds no such start.
        """
        cands = _allowed(self.clouds, job.allowed)
        if not cands or job.devices < self.k.big_share * max(self.cal.cap[c] for c in cands):
            return False
        occ = occupancy(job.runtime_h)
        best = self._cheapest_slot(job, occ, now, job.last_start, rates, 1.0)
        if best is None:
            return False  # planned hourly like the rest (and may pause others when it must start)
        return self._take(job, *best, occ, kept=True)

    def _expected(self, now: int) -> list[TrainingJob]:
        """The work expected in the next 24 h, forecast seasonal-naively: the jobs of the last 24 h, a day later."""
        if not self.k.expect_arrivals:
            return []
        recent = (self.jobs[i] for i in self.arrivals[bisect.bisect_right(self.arrival_hours, now - 24):self.ji])
        return [TrainingJob(j.name, j.devices, j.runtime_h, j.arrival + 24, j.deadline + 24, j.allowed, j.home)
                for j in recent]

    def _plan(self, now: int, rates: np.ndarray) -> _HourPlan:
        """This hour's LP: the pending jobs, the expected ones (planned, never run) and the rest of each batch."""
        plan = _HourPlan(self.clouds, now, self.horizon, rates, self.k.miss_penalty)
        for pj, job in [*enumerate(self.pending), *((_EXPECTED, j) for j in self._expected(now))]:
            plan.add_training(pj, job)
        for b in [b for b, r in self.remaining.items() if r > 1e-9]:
            plan.add_batch(b, self.batches[b], self.remaining[b])
        return plan

    def _run_batches(self, now: int, batch_now: list[tuple[int, int, float]]) -> None:
        """Run the batches' device-hours the plan gives this hour, within the devices free now."""
        for b, c, amount in batch_now:
            take = min(amount, self.remaining[b], self.cal.cap[c] - self.cal.used[c, now])
            if take > 1e-9 and self.batches[b].name not in self.out.infeasible:
                trial = self.cal.used.copy()
                trial[c, now] += take
                if not self._safe(now, trial, batch_left={b: self.remaining[b] - take}):
                    continue
            if take > 1e-9:
                self.cal.used[c, now] += take
                self.remaining[b] -= take
                self.placed.append(Placement(self.batches[b].name, self.clouds[c].name, now, take, now + 1, take))

    def _start_training(self, now: int, rates: np.ndarray, share_now: dict[int, np.ndarray],
                        planned: dict[int, tuple[float, int, int]]) -> None:
        """Start or hold the jobs the plan starts now and those due; due ones first, then the largest share now."""
        order = sorted(range(len(self.pending)),
                       key=lambda pj: (now < self.pending[pj].last_start - self.k.margin_h,
                                       -share_now.get(pj, np.zeros(1)).sum(), self.pending[pj].deadline))
        still: list[TrainingJob] = []
        for pj in order:
            if not self._decide(self.pending[pj], now, rates, share_now.get(pj), planned.get(pj)):
                still.append(self.pending[pj])
        self.pending = still

    def _decide(self, job: TrainingJob, now: int, rates: np.ndarray, sh: np.ndarray | None,
                planned: tuple[float, int, int] | None) -> bool:
        """Start or hold ``job`` now, or leave it for the next hour (False).

        ``sh``: its share the plan starts now per cloud; ``planned``: its largest planned (share, cloud, offset).
        A job is due within ``margin_h`` of its last start that meets the deadline.
        """
        occ = occupancy(job.runtime_h)
        last_ok = job.last_start
        must = now >= last_ok - self.k.margin_h
        not_now = sh is None or sh.sum() < self.k.start_threshold
        if not must and not_now:
            return False
        if not_now and planned is not None and planned[2] > 0 and self._hold_planned(job, occ, now, rates, planned):
            return True
        chosen = self._cloud_now(job, occ, now, rates, sh, must)
        if chosen is None and must and self._hold_earliest(job, occ, now):
            return True
        if chosen is None:  # no room now: tried again next hour (a miss once past its last start)
            if now > last_ok:
                self._miss(job.name)
            return False
        if not self._take(job, chosen, now, occ, hold=not must):
            return False
        if now + job.runtime_h > job.deadline + 1e-9:
            self._miss(job.name)
        return True

    def _hold_planned(self, job: TrainingJob, occ: np.ndarray, now: int, rates: np.ndarray,
                      planned: tuple[float, int, int]) -> bool:
        """A due job the plan puts in a later hour reserves that (cloud, start), so the cheap hour it waited for
        stays its own, if ``hold_headroom`` of the cloud stays free for urgent work; else the cheapest of
        starting now and holding another start in time that leaves that room. False when neither is possible."""
        _, c, later = planned
        if (self.cal.feasible_starts(c, now + later, now + later, job.devices, occ, 1.0 - self.k.hold_headroom)
                and self._take(job, c, now + later, occ)):
            return True
        best = self._cheapest_slot(job, occ, now, job.last_start, rates, 1.0 - self.k.hold_headroom)
        return best is not None and self._take(job, *best, occ)

    def _cloud_now(self, job: TrainingJob, occ: np.ndarray, now: int, rates: np.ndarray, sh: np.ndarray | None,
                   must: bool) -> int | None:
        """The cloud ``job`` starts on now: one the plan puts it on now (largest share first) where it fits; when
        it is due (``must``) any other, cheapest first, and then one where pausing running jobs makes room."""
        cands = _allowed(self.clouds, job.allowed)
        span = self.horizon - now
        prefs = [int(c) for c in np.argsort(-sh) if sh[c] > 1e-9 and c in cands] if sh is not None else []
        rest = sorted((c for c in cands if c not in prefs),
                      key=lambda c: _window_cost(rates[c], occ)[0] if len(occ) <= span else 0) if must else []
        for c in prefs + rest:
            if self.cal.fits(c, now, job.devices, occ):
                return c
        if not (must and self.k.preempt):
            return None
        chosen = self._make_room(job, occ, now, cands, rates, self.k.preempt_min_slack_h)
        if chosen is None:  # the last resort: jobs with less slack
            chosen = self._make_room(job, occ, now, cands, rates, self.k.last_resort_slack_h)
        return chosen

    def _hold_earliest(self, job: TrainingJob, occ: np.ndarray, now: int) -> bool:
        """A due job with no room now, even after pausing, holds the earliest start where its devices are free
        (a reservation later work cannot take) when that meets its deadline, or anyway from its last start on.
        False when it is to try again next hour."""
        early = None
        for c in _allowed(self.clouds, job.allowed):
            st = self.cal.feasible_starts(c, now + 1, self.horizon - 1, job.devices, occ)
            if st and (early is None or st[0] < early[1]):
                early = (c, st[0])
        late = early is not None and early[1] + job.runtime_h > job.deadline + 1e-9
        if early is None or (late and now < job.last_start) or not self._take(job, *early, occ, kept=True):
            return False
        if late:
            self._miss(job.name)
        return True

    def _cheapest_slot(self, job: TrainingJob, occ: np.ndarray, now: int, last_ok: int, rates: np.ndarray,
                       later_share: float) -> tuple[int, int] | None:
        """(cloud, start) of least expected cost: now where the devices are free, or a later start by
        ``last_ok`` that leaves ``1 - later_share`` of the cloud free."""
        best = None
        for c in _allowed(self.clouds, job.allowed):
            if len(occ) > rates.shape[1]:
                continue
            wc = _window_cost(rates[c], occ)
            starts = ([now] if self.cal.fits(c, now, job.devices, occ) else []) + self.cal.feasible_starts(
                c, now + 1, min(last_ok, now + len(wc) - 1), job.devices, occ, later_share)
            for st in starts:
                if best is None or wc[st - now] < best[0]:
                    best = (wc[st - now], c, st)
        return None if best is None else best[1:]

    def _take(self, job: TrainingJob, c: int, st: int, occ: np.ndarray, kept: bool = False, force: bool = False,
              hold: bool = True) -> bool:
        """Run (or hold) ``job`` on cloud ``c`` from ``st``; a ``kept`` reservation is never paused or released.

        Refused (False) when it would leave a protected deadline with no schedule, unless ``force``d (work due now);
        ``hold``: checked with the capacity held back for urgent work to come (not for a start of work that is due).
        """
        if not force:
            trial = self.cal.used.copy()
            trial[c, st:st + len(occ)] += job.devices * occ
            if not self._safe(self.now, trial, without=frozenset({job.name}), hold=hold):
                return False
        self.cal.reserve(c, st, job.devices, occ)
        self.placed.append(Placement(job.name, self.clouds[c].name, st, job.devices * job.runtime_h,
                                     st + job.runtime_h, job.devices))
        if not kept:
            self.running[job.name] = (self.placed[-1], job, c)
        return True

    def _make_room(self, job: TrainingJob, occ: np.ndarray, now: int, cands: list[int], rates: np.ndarray,
                   min_slack_h: float) -> int | None:
        """Pause running jobs with ``min_slack_h`` of slack (they checkpoint and are planned again) to start
        ``job`` now, on the cloud cheapest now where that is enough; that cloud, or None."""
        for c in sorted(cands, key=lambda c: rates[c, 0]):
            victims = self._victims(job, occ, now, c, min_slack_h)
            if victims is None or not self._pausing_safe(job, occ, now, c, victims):
                continue
            for name in victims:
                self._pause(name, c, now)
            return c
        return None

    def _pausing_safe(self, job: TrainingJob, occ: np.ndarray, now: int, c: int, victims: list[str]) -> bool:
        """Whether pausing ``victims`` to start ``job`` on ``c`` now keeps every protected deadline reachable."""
        trial, resumed = self.cal.used.copy(), []
        for name in victims:
            tail, rest = self._paused_rest(name, now)
            trial[c, now:now + len(tail)] -= self.running[name][0].devices * tail
            resumed.append(rest)
        trial[c, now:now + len(occ)] += job.devices * occ
        return self._safe(now, trial, without=frozenset({job.name}), extra=resumed, hold=False)

    def _victims(self, job: TrainingJob, occ: np.ndarray, now: int, c: int, min_slack_h: float) -> list[str] | None:
        """The fewest running jobs on cloud ``c``, most slack first, whose pausing frees room for ``job``; None when
        pausing all with ``min_slack_h`` of slack (never paused before) is not enough."""
        pausable = []
        for name, (p, other, oc) in self.running.items():
            if oc != c or p.end <= now + 1e-9 or p.start >= now or name in self.paused:
                continue
            left = p.end - now + self.k.preempt_overhead_h
            slack = other.deadline - now - left
            if slack >= min_slack_h:
                pausable.append((-slack, name))
        trial = self.cal.used[c].copy()
        chosen = []
        for _, name in sorted(pausable):
            p, other, _ = self.running[name]
            tail = occupancy(other.runtime_h)[now - p.start:]
            trial[now:now + len(tail)] -= p.devices * tail
            chosen.append(name)
            end = now + len(occ)
            if end <= self.horizon and np.all(trial[now:end] + job.devices * occ <= self.cal.cap[c] + 1e-9):
                return chosen
        return None

    def _paused_rest(self, name: str, now: int) -> tuple[np.ndarray, TrainingJob]:
        """Running job ``name`` paused at ``now``: the occupancy it gives back from ``now``, and the rest of its run
        plus ``preempt_overhead_h`` of redone work, as a job arriving at ``now``."""
        p, other, _ = self.running[name]
        rest = TrainingJob(other.name, other.devices, p.end - now + self.k.preempt_overhead_h, now, other.deadline,
                           other.allowed, other.home)
        return occupancy(other.runtime_h)[now - p.start:], rest

    def _pause(self, name: str, c: int, now: int) -> None:
        """Pause running job ``name`` at ``now``: it checkpoints, and the rest of its run is pending from the next hour."""
        tail, rest = self._paused_rest(name, now)
        p, _, _ = self.running.pop(name)
        self.cal.reserve(c, now, p.devices, tail, sign=-1.0)
        p.end, p.device_hours = float(now), p.devices * (now - p.start)
        self.out.preempted.append(name)
        self.paused.add(name)
        self.pending_extra.append(rest)

    def _miss(self, name: str) -> None:
        if name not in self.out.misses:
            self.out.misses.append(name)

    def _finish(self) -> Schedule:
        """The schedule: work never started and batches with work left are misses (and unplaced), and so is a
        batch run past its deadline."""
        for job in self.pending:
            self._miss(job.name)
            self.out.unplaced.append(job.name)
        for b, r in self.remaining.items():
            if r > 1e-6:
                self.out.misses.append(self.batches[b].name)
                self.out.unplaced.append(self.batches[b].name)
        by_b = {b.name: b for b in self.batches}
        for p in self.placed:
            if p.job in by_b and p.start >= by_b[p.job].deadline:
                self._miss(p.job)
        self.out.placements = self.placed
        return self.out


def schedule_rolling(jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec], horizon: int,
                     view: PriceView, t0: int = 0, start_threshold: float = 0.5, miss_penalty: float = 1e3,
                     margin_h: int = 1, preempt: bool = True, preempt_overhead_h: float = 0.25,
                     preempt_min_slack_h: float = 12.0, big_share: float = 0.5, hold_headroom: float = 0.25,
                     milp_time_limit_s: float = 10.0, expect_arrivals: bool = True,
                     last_resort_slack_h: float = 3.0, urgent_slack_h: float = 0.0,
                     holdback_window_h: int = 24, band: dict[str, float] | None = None,
                     known_until: Callable[[int], int] | None = None) -> Schedule:
    """The online price-aware policy as a rolling plan (``policy="price-lp"`` of ``schedule``).

    Every hour ``now``, the work that has arrived and not started (training
    jobs, the rest of each batch) is planned by an LP over the hours from
    ``now`` on, with the prices a decision at ``now`` sees (``view``), the
    devices left by the work already started, and the deadlines. Only the
    plan for ``now`` is carried out: the batches' device-hours planned now
    run, and a training job starts on a cloud the plan puts it on now or,
    once due, on the cheapest where it fits. The rest is planned again next
    hour with what is known then and holds no devices meanwhile, so
    deferrable work seldom blocks urgent arrivals. The exceptions are holds:
    of a due job's planned later start, of a big job's start, and of the
    earliest free start of a due job that finds no room even after pausing
    others. A paused job runs in two or more pieces, which the
    contiguous-start LP of ``optimum`` does not model.

    * ``start_threshold``: a job not yet due starts now only when the plan starts at least this share of it now.
    * ``miss_penalty``: cost (USD per device-hour) of leaving work unserved, so the LP is always feasible.
    * ``margin_h``: a job is due this many hours before its last start that meets its deadline.
    * ``hold_headroom``: a due job planned for a later hour holds that start if this share of the cloud stays free.
    * ``preempt``: a due job with no room may pause running jobs with ``preempt_min_slack_h`` of slack, then,
      as a last resort, ``last_resort_slack_h``; a paused job redoes ``preempt_overhead_h`` of work.
    * ``big_share``: a job needing this share of every cloud it may use is reserved at arrival, for good.
    * ``milp_time_limit_s``: bound on each hour's solve; past it, the relaxation's plan is used.
    * ``expect_arrivals``: the plan also holds the work expected in the next 24 h (planned, never run), to keep
      room on the cheap clouds for urgent arrivals.
    * Deadlines are kept by construction (``scheduler.deadlines``): no decision leaves an admitted deadline with
      no earliest-deadline-first schedule. Work arriving later may pause running work that can still finish in
      time; ``urgent_slack_h`` > 0 (with ``holdback_window_h``) also keeps room for the urgent work the recent
      arrivals measure (off by default: see ``docs/energy-and-grid.md``). Work no schedule could finish in time
      is named in ``Schedule.infeasible`` at arrival and runs as best effort.
    * ``band`` (USD/MWh per region) and ``known_until`` (the last hour known at a decision): hours only forecast
      cost the band more, the forecast's measured error, so a wrong forecast costs money, never a deadline.
    """
    knobs = _RollingKnobs(start_threshold, miss_penalty, margin_h, preempt, preempt_overhead_h, preempt_min_slack_h,
                          last_resort_slack_h, big_share, hold_headroom, milp_time_limit_s, expect_arrivals,
                          urgent_slack_h, holdback_window_h)
    return _Rolling(jobs, batches, clouds, horizon, view, t0, knobs, band, known_until).run()
