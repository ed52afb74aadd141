"""Each cloud's share of a tenant's inference traffic for one hour: the cheapest that keeps the latency goal.

Why an LP: the cost of an hour is linear in the shares, and so is the latency
goal once it is written as a tail probability. The p99 of a request mix
served by several clouds is at most the goal ``L`` exactly when

    sum_c  share_c x P(latency at c > L)  <=  1 %

so the goal is one linear constraint, not a per-cloud cut-off that would
either allow a slow cloud all the traffic or none. Each cloud's share is
bounded below by the warm-standby minimum and above by its capacity at a
utilisation cap (``utilisation_cap``: the highest utilisation whose p99
queueing wait, M/M/c with Erlang C, stays within ``wait_share`` of the goal).
A cloud outside the tenant's jurisdictions, or not warm yet, is bounded to 0;
a grid request bounds its cloud to the traffic that keeps its modelled power
under the cut (``shed_limit``). Solved with scipy's ``linprog`` (HiGHS);
without the latency row the same bounds are solved exactly by filling the
cheapest clouds first, which ``fill_cheapest`` does and the tests compare.
Every cloud's bounds and outcome are reported as ``Considered`` reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from crosscloud.pool.placement import Considered

TAIL = 0.01  # p99


@dataclass(frozen=True)
class CloudOffer:
    """One cloud as a placement hour sees it."""

    name: str
    accelerator: str
    jurisdiction: str
    capacity_tps: float  # tokens/s of all its serving devices at full utilisation
    price_per_token: float  # USD, electricity + rental (``energy.price_per_token``)
    rtt_ms: float  # network round trip from the tenant's users
    service_s: np.ndarray  # service times of a sample of the tenant's requests there (no queueing)
    devices: int
    devices_per_replica: int
    batch: int  # sequences a replica serves together: the M/M/c servers of a replica
    busy_w: float  # one busy device's draw
    idle_w: float
    pue: float
    warm: bool = True
    electricity_per_token: float | None = None  # the electricity part of the price, shown in the reasons

    @property
    def replica_tps(self) -> float:
        return self.capacity_tps * self.devices_per_replica / self.devices

    @property
    def max_replicas(self) -> int:
        return self.devices // self.devices_per_replica


@dataclass(frozen=True)
class Goal:
    """What the tenant asks: demand, latency, residency and warm standby."""

    tokens_per_s: float
    p99_goal_s: float
    allowed_jurisdictions: frozenset[str] | None = None  # None: anywhere
    min_share: float = 0.0  # of the traffic, on every usable cloud (warm standby)
    max_utilisation: float = 0.9
    wait_share: float = 0.1  # of the goal that queueing may take at the p99


@dataclass(frozen=True)
class GridCut:
    """A grid request: cut ``reduce_pct`` of the cloud's power within ``within_s`` (``grid.demand_response``'s form).

    The plan aims ``margin_pct`` points beyond the cut: the router splits requests
    by weighted random, so over a short window the cloud answers a few percent
    more or less than its share, and a grid operator counts what was delivered.
    """

    cloud: str
    reduce_pct: float
    within_s: float
    margin_pct: float = 2.0


@dataclass(frozen=True)
class Shed:
    cloud: str
    reduce_pct: float
    before_w: float
    after_w: float
    replicas_before: int
    replicas_after: int
    hold_s: float  # until the cut holds: requests in flight finish where they started (their p99 service time)
    within_s: float
    limit_tps: float  # the most traffic the cloud keeps while the request lasts

    @property
    def achieved_pct(self) -> float:
        return 100 * (1 - self.after_w / self.before_w) if self.before_w > 0 else 100.0

    @property
    def held(self) -> bool:
        return self.achieved_pct >= self.reduce_pct - 1e-9 and self.hold_s <= self.within_s


@dataclass
class TrafficPlan:
    shares: dict[str, float]  # sum to 1 (of the traffic served)
    tokens_per_s: dict[str, float]
    replicas: dict[str, int]
    utilisation: dict[str, float]  # of the running replicas
    considered: list[Considered] = field(default_factory=list)
    preheat_first: list[str] = field(default_factory=list)
    unserved_tps: float = 0.0
    latency_goal_met: bool = True
    sheds: list[Shed] = field(default_factory=list)
    cost_usd_per_s: float = 0.0

    def explain(self) -> str:
        return "; ".join(f"{c.cloud}: {c.reason}" for c in self.considered)


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival waits in M/M/c with ``servers`` and offered ``load`` (Erlangs)."""
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):  # Erlang B by its stable recursion
        b = load * b / (k + load * b)
    rho = load / servers
    return b / (1 - rho * (1 - b))


def p99_wait_s(servers: int, rho: float, mean_service_s: float) -> float:
    """p99 queueing wait of M/M/c at utilisation ``rho``: P(W > t) = C e^{-c(1-rho)t/s}."""
    if rho >= 1:
        return math.inf
    c = erlang_c(servers, rho * servers)
    return 0.0 if c <= TAIL else math.log(c / TAIL) * mean_service_s / (servers * (1 - rho))


def utilisation_cap(offer: CloudOffer, goal: Goal) -> float:
    """Highest utilisation (<= ``max_utilisation``) whose p99 wait in one replica stays within ``wait_share`` of the goal."""
    budget = goal.wait_share * goal.p99_goal_s
    mean_s = float(np.mean(offer.service_s))
    lo, hi = 0.0, goal.max_utilisation
    if p99_wait_s(offer.batch, hi, mean_s) <= budget:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99_wait_s(offer.batch, mid, mean_s) <= budget else (lo, mid)
    return lo


def tail_at(offer: CloudOffer, goal_s: float, rho: float) -> float:
    """P(latency > goal) at the cloud: network + service + M/M/c wait at ``rho``, over the request sample."""
    room = goal_s - offer.rtt_ms / 1000 - offer.service_s
    mean_s = float(np.mean(offer.service_s))
    c = erlang_c(offer.batch, rho * offer.batch)
    theta = offer.batch * (1 - rho) / mean_s if rho < 1 else 0.0
    return float(np.mean(np.where(room <= 0, 1.0, c * np.exp(-theta * np.maximum(room, 0)))))


def sized_ahead(this_hour: dict[str, int], next_hour: dict[str, int] | None) -> dict[str, int]:
    """Replicas to run through an hour: on each cloud the larger of this hour's plan and the next hour's, so a
    rise is met by replicas already up (one takes minutes to load); a fall waits for the next hour's own plan."""
    if not next_hour:
        return dict(this_hour)
    return {c: max(this_hour.get(c, 0), next_hour.get(c, 0)) for c in sorted(set(this_hour) | set(next_hour))}


def replicas_for(offer: CloudOffer, tps: float, rho_cap: float) -> int:
    """Replicas that serve ``tps`` at no more than ``rho_cap``; one stays up for warm standby."""
    if offer.replica_tps <= 0:
        return 0
    return min(offer.max_replicas, max(1, math.ceil(tps / (offer.replica_tps * rho_cap) - 1e-9)))


def power_w(offer: CloudOffer, replicas: int, tps: float) -> float:
    """Modelled draw at the meter: the running replicas' devices idle, plus the work's busy share, x PUE.

    Devices of replicas not running are released (drawing nothing for this tenant).
    """
    per_device_tps = offer.capacity_tps / offer.devices
    return offer.pue * (replicas * offer.devices_per_replica * offer.idle_w
                        + (offer.busy_w - offer.idle_w) * tps / per_device_tps)


def shed_limit(offer: CloudOffer, tps_now: float, cut: GridCut, rho_cap: float) -> tuple[float, int, Shed]:
    """Most traffic the cloud may keep, and its replicas, so that its power falls by ``cut.reduce_pct``."""
    r0 = replicas_for(offer, tps_now, rho_cap) if offer.warm else 0
    before = power_w(offer, r0, tps_now)
    aim = min(100.0, cut.reduce_pct + cut.margin_pct)
    target = before * (1 - aim / 100) * (1 - 1e-9)  # at least the cut, not a rounding short of it
    per_device_tps = offer.capacity_tps / offer.devices
    best_t, best_r = 0.0, 0
    for r in range(r0, 0, -1):
        room = target / offer.pue - r * offer.devices_per_replica * offer.idle_w
        t = min(r * offer.replica_tps * rho_cap, tps_now, room / (offer.busy_w - offer.idle_w) * per_device_tps)
        if t >= 0 and t > best_t - 1e-12:
            best_t, best_r = t, r
    hold = float(np.quantile(offer.service_s, 1 - TAIL)) if tps_now > 0 else 0.0
    after = power_w(offer, best_r, best_t)
    return best_t, best_r, Shed(cut.cloud, cut.reduce_pct, before, after, r0, best_r, hold, cut.within_s, best_t)


def bounds(goal: Goal, offers: list[CloudOffer], cuts: dict[str, GridCut],
           in_force: dict[str, float] | None) -> tuple[np.ndarray, np.ndarray, list[float], list[str], list[Shed]]:
    """Lower and upper share of each cloud, its utilisation cap, why, and the grid sheds."""
    lo, hi, caps, why, sheds = [], [], [], [], []
    demand = max(goal.tokens_per_s, 1e-12)
    for o in offers:
        rho = utilisation_cap(o, goal)
        caps.append(rho)
        if goal.allowed_jurisdictions is not None and o.jurisdiction not in goal.allowed_jurisdictions:
            lo.append(0.0), hi.append(0.0), why.append(f"refused: jurisdiction {o.jurisdiction} is outside the "
                                                        f"tenant's {sorted(goal.allowed_jurisdictions)}")
            continue
        if not o.warm:
            lo.append(0.0), hi.append(0.0), why.append("preheat first: the model is not warm there")
            continue
        upper = min(1.0, o.capacity_tps * rho / demand)
        reason = f"capacity {o.capacity_tps:.0f} tokens/s at utilisation <= {rho:.2f}"
        if o.name in cuts:
            t, r, shed = shed_limit(o, (in_force or {}).get(o.name, upper * demand), cuts[o.name], rho)
            sheds.append(shed)
            upper = min(upper, t / demand)
            reason += (f"; grid request -{cuts[o.name].reduce_pct:g}% power: at most {t:.0f} tokens/s on "
                       f"{r} replica(s) ({shed.replicas_before - r} removed)")
        lower = min(goal.min_share, upper) if o.name not in cuts else 0.0
        lo.append(lower), hi.append(upper), why.append(reason)
    return np.array(lo), np.array(hi), caps, why, sheds


def fill_cheapest(prices: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min prices.x with sum x = 1 and lo <= x <= hi: minimums first, then the cheapest up to its bound.

    Optimal: moving any share from a cheaper cloud with room to a dearer one
    can only raise the cost (an exchange argument), so no better x exists.
    """
    x = lo.copy()
    left = 1.0 - x.sum()
    for i in np.argsort(prices, kind="stable"):
        add = min(hi[i] - x[i], max(left, 0.0))
        x[i] += add
        left -= add
    return x


def solve_shares(prices: np.ndarray, lo: np.ndarray, hi: np.ndarray, tails: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """The cheapest shares within the bounds (and the tail row when given); ``False`` when the tail row cannot hold."""
    from scipy.optimize import linprog  # here, as price_timing does: a DAG file that imports this parses fast

    serve = min(1.0, float(hi.sum()))
    if tails is None:
        return fill_cheapest(prices, lo, hi), True
    scale = float(np.abs(prices).max()) or 1.0  # HiGHS treats costs below its tolerance (1e-7) as zero
    res = linprog(prices / scale, A_ub=[tails], b_ub=[TAIL * serve], A_eq=[np.ones_like(prices)], b_eq=[serve],
                  bounds=list(zip(lo, hi)), method="highs")
    if res.status == 0:
        return np.clip(res.x, lo, hi), True
    # the goal cannot hold: the least tail first, price as a tie-break
    return fill_cheapest(tails + 1e-6 * prices / max(prices.max(), 1e-30), lo, hi), False


def place_traffic(goal: Goal, offers: list[CloudOffer], cuts: list[GridCut] = (),
                  in_force: dict[str, float] | None = None) -> TrafficPlan:
    """Each cloud's share of the hour's traffic, its replicas and the reasons (see the module docstring).

    ``in_force``: tokens/s each cloud serves under the plan now in force, from
    which a grid request's cut is measured (default: this hour's plan without it).
    """
    by_cut = {c.cloud: c for c in cuts}
    if by_cut and in_force is None:
        in_force = place_traffic(goal, offers).tokens_per_s
    lo, hi, caps, why, sheds = bounds(goal, offers, by_cut, in_force)
    if lo.sum() > 1:  # more standby than traffic: the minimums shrink together
        lo = lo / lo.sum()
    prices = np.array([o.price_per_token for o in offers])
    tails = np.array([tail_at(o, goal.p99_goal_s, rho) for o, rho in zip(offers, caps)])
    x, met = solve_shares(prices, lo, hi, tails)
    served = float(x.sum())
    shares = {o.name: (float(v) / served if served > 0 else 0.0) for o, v in zip(offers, x)}
    plan = TrafficPlan(shares, {}, {}, {}, unserved_tps=max(0.0, 1 - served) * goal.tokens_per_s,
                       latency_goal_met=met, sheds=sheds)
    for o, v, rho, reason, tail in zip(offers, x, caps, why, tails):
        tps = float(v) * goal.tokens_per_s
        usable = reason.startswith("capacity")
        plan.replicas[o.name] = replicas_for(o, tps, rho) if usable else 0
        for shed in sheds:
            if shed.cloud == o.name:
                plan.replicas[o.name] = min(plan.replicas[o.name], shed.replicas_after)
        plan.tokens_per_s[o.name] = tps
        running = plan.replicas[o.name] * o.replica_tps
        plan.utilisation[o.name] = tps / running if running > 0 else 0.0
        plan.cost_usd_per_s += tps * o.price_per_token
        if not o.warm:
            plan.preheat_first.append(o.name)
        elec = f" (electricity {o.electricity_per_token * 1e6:.4f})" if o.electricity_per_token is not None else ""
        detail = (f"{reason}; {o.price_per_token * 1e6:.4f} USD/1M tokens{elec}, rtt {o.rtt_ms:.0f} ms, "
                  f"P(latency > goal) {tail:.3f}") if usable else reason
        plan.considered.append(Considered(o.name, o.accelerator, bool(v > 1e-9),
                                          f"{detail}; share {shares[o.name]:.3f}" if usable else detail))
    return plan
