"""Policies on an offline replay, what each costs and how long its requests take, and the offline optimum.

Why offline: the cost of a placement rule over days of real prices and a
real trace is measured here in seconds, on the same hours for every
policy; the live part (a real router and servers) checks what a model
cannot. Policies give each hour's shares of the traffic:

- ``price_unaware``: shares in proportion to the capacity of the usable clouds;
- ``nearest``: the nearest clouds first, each up to its utilisation cap;
- ``crosscloud``: ``traffic.place_traffic`` at the start of each hour with the
  price it sees then (day-ahead, else forecast) and the demand it expects (the
  same hour the day before, else the hour before);
- ``optimum``: an LP per hour with the actual prices and demand and the same
  bounds, including crosscloud's grid-request limits: a lower bound.

The cost figure charges each request's context and generated tokens at the
energy per token of the cloud that served it, that hour's price and the
cloud's PUE. The router splits by weight, so a request is charged in
expectation (its share on each cloud). Latency: network round trip +
service time of the request on the cloud's accelerator + an M/M/c wait at the
replicas' utilisation (replicas scaled to the utilisation cap every hour).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from crosscloud.serving.demand import DAY_H, seasonal_naive
from crosscloud.serving.energy import ServedModel, TokenRates, electricity_usd, price_per_token
from crosscloud.serving.replay import Replay, ReplayCloud
from crosscloud.serving.traffic import (CloudOffer, Goal, GridCut, TrafficPlan, bounds, erlang_c, fill_cheapest,
                                        place_traffic, replicas_for, sized_ahead, solve_shares, tail_at,
                                        utilisation_cap)

GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class TimedCut:
    """A grid request from replay hour ``start_h`` for ``hours``."""

    cut: GridCut
    start_h: int
    hours: int

    def active(self, h: int) -> bool:
        return self.start_h <= h < self.start_h + self.hours


@dataclass
class Scenario:
    replay: Replay
    clouds: list[ReplayCloud]
    rates: list[TokenRates]
    model: ServedModel
    goal: Goal  # its tokens_per_s is set each hour
    prices: np.ndarray  # [hour, cloud] actual USD/MWh
    seen: Callable[[int], np.ndarray]  # prices of hour h as a decision at its start sees them
    rental: np.ndarray  # USD per device-hour, per cloud
    sample: tuple[np.ndarray, np.ndarray]  # context and generated tokens of requests, for service times
    cuts: list[TimedCut] = field(default_factory=list)

    def __post_init__(self):
        r = self.replay
        self.ctx_h = r.per_hour(r.context.astype(float))
        self.gen_h = r.per_hour(r.generated.astype(float))
        self.demand = (self.ctx_h + self.gen_h) / 3600
        self.mix = (float(self.sample[0].mean()), float(self.sample[1].mean()))
        self.service = [rt.service_s(*self.sample) for rt in self.rates]

    def offers(self, h: int, prices: np.ndarray) -> list[CloudOffer]:
        """The clouds at replay hour ``h`` with prices ``prices`` (USD/MWh)."""
        out = []
        for c, rt, p, rent, svc in zip(self.clouds, self.rates, prices, self.rental, self.service):
            tps = c.devices * rt.mix_tps(*self.mix)
            price = price_per_token(rt, *self.mix, p, c.pue, rent, self.goal.max_utilisation)
            out.append(CloudOffer(c.name, c.accelerator, c.jurisdiction, tps, price.total, c.rtt_ms, svc, c.devices,
                                  rt.devices_per_replica, self.model.batch, rt.busy_w, rt.idle_w, c.pue,
                                  warm=h >= c.warm_from_h, electricity_per_token=price.electricity))
        return out

    def cuts_at(self, h: int) -> list[GridCut]:
        return [t.cut for t in self.cuts if t.active(h)]

    def coefficients(self, h: int) -> np.ndarray:
        """USD of electricity if all of hour ``h``'s requests went to each cloud (actual price)."""
        return np.array([electricity_usd(float(rt.energy_j(self.ctx_h[h], self.gen_h[h])), self.prices[h, i], c.pue)
                         for i, (c, rt) in enumerate(zip(self.clouds, self.rates))])


@dataclass
class PolicyRun:
    name: str
    shares: np.ndarray  # [hour, cloud], each row sums to the share served (1 unless capacity is short)
    plans: list[TrafficPlan | None] = field(default_factory=list)
    limits: list[dict[str, float]] = field(default_factory=list)  # grid-request limits (tokens/s) per hour
    replicas: list[dict[str, int]] = field(default_factory=list)  # run through each hour (sized ahead, as placed)


def _goal(sc: Scenario, demand: float) -> Goal:
    return replace(sc.goal, tokens_per_s=demand)


def expected_demand(demand: np.ndarray, h: int) -> float:
    """Demand of hour ``h`` as the production forecast knows it before the hour (``demand.seasonal_naive`` over the
    hours served before it); the first hour, with nothing served yet, is given as the DAG's Param would give it."""
    got = seasonal_naive({i: float(demand[i]) for i in range(max(0, h - DAY_H), h)}, h).tokens_per_s
    return float(demand[0]) if got is None else got


def expected_next(demand: np.ndarray, h: int) -> float:
    """Demand of hour ``h + 1`` as the production forecast knows it at hour ``h``'s start (the hours before ``h``)."""
    got = seasonal_naive({i: float(demand[i]) for i in range(max(0, h - DAY_H), h)}, h + 1).tokens_per_s
    return float(demand[0]) if got is None else got


def forecast_mape(demand: np.ndarray) -> float | None:
    """The production forecast's mean absolute percentage error over the replay, each hour from the ones before."""
    return seasonal_naive({i: float(d) for i, d in enumerate(demand)}, len(demand)).mape


def crosscloud(sc: Scenario) -> PolicyRun:
    """``place_traffic`` every hour with the prices it sees and the demand it expects."""
    run = PolicyRun("crosscloud", np.zeros((sc.replay.hours, len(sc.clouds))))
    for h in range(sc.replay.hours):
        expected = expected_demand(sc.demand, h)
        plan = place_traffic(_goal(sc, expected), sc.offers(h, sc.seen(h)), sc.cuts_at(h))
        served = 1 - plan.unserved_tps / max(expected, 1e-12)
        run.shares[h] = [plan.shares[c.name] * served for c in sc.clouds]
        run.plans.append(plan)
        run.limits.append({s.cloud: s.limit_tps for s in plan.sheds})
        run.replicas.append(sized_ahead(plan.replicas, _next_hour_replicas(sc, h, expected)))
    return run


def _next_hour_replicas(sc: Scenario, h: int, expected: float) -> dict[str, int] | None:
    """Where the next hour's forecast rises above this hour's: the replicas its plan (its prices) wants, as
    ``placement.hour_and_next`` sizes them; else None."""
    ahead = expected_next(sc.demand, h) if h + 1 < sc.replay.hours else 0.0
    if ahead <= expected:
        return None
    return place_traffic(_goal(sc, ahead), sc.offers(h + 1, sc.seen(h + 1)), sc.cuts_at(h + 1)).replicas


def _hour_bounds(sc: Scenario, h: int, limits: dict[str, float] | None = None):
    goal = _goal(sc, sc.demand[h])
    offers = sc.offers(h, sc.prices[h])
    lo, hi, caps, _, _ = bounds(goal, offers, {}, None)
    for i, o in enumerate(offers):
        if limits and o.name in limits:
            hi[i] = min(hi[i], limits[o.name] / max(sc.demand[h], 1e-12))
            lo[i] = 0.0
    return goal, offers, lo, hi, caps


def optimum(sc: Scenario, limits: list[dict[str, float]]) -> PolicyRun:
    """Per hour, the least electricity cost within the same bounds, the actual prices and demand known."""
    run = PolicyRun("optimum", np.zeros((sc.replay.hours, len(sc.clouds))))
    for h in range(sc.replay.hours):
        goal, offers, lo, hi, caps = _hour_bounds(sc, h, limits[h] if limits else None)
        tails = np.array([tail_at(o, goal.p99_goal_s, rho) for o, rho in zip(offers, caps)])
        run.shares[h], _ = solve_shares(sc.coefficients(h), lo, hi, tails)
    return run


def price_unaware(sc: Scenario) -> PolicyRun:
    """Shares in proportion to capacity among the usable clouds; a grid request caps its cloud, the rest share the excess."""
    run = PolicyRun("price-unaware", np.zeros((sc.replay.hours, len(sc.clouds))))
    for h in range(sc.replay.hours):
        goal, offers, _, hi, _ = _hour_bounds(sc, h)
        weight = np.array([o.capacity_tps for o in offers]) * (hi > 0)
        x = weight / weight.sum()
        for cut in sc.cuts_at(h):
            i = [o.name for o in offers].index(cut.cloud)
            _, bound_hi, *_ = bounds(goal, offers, {cut.cloud: cut}, {cut.cloud: x[i] * sc.demand[h]})
            cap = bound_hi[i]
            if x[i] > cap:
                others = weight * (np.arange(len(x)) != i)
                x = x + (x[i] - cap) * others / others.sum()
                x[i] = cap
        run.shares[h] = x
    return run


def nearest(sc: Scenario) -> PolicyRun:
    """The nearest usable clouds first, each up to its utilisation cap (the standby minimum kept)."""
    run = PolicyRun("nearest", np.zeros((sc.replay.hours, len(sc.clouds))))
    for h in range(sc.replay.hours):
        _, offers, lo, hi, _ = _hour_bounds(sc, h)
        run.shares[h] = fill_cheapest(np.array([o.rtt_ms for o in offers]), lo, hi)
    return run


@dataclass(frozen=True)
class Outcome:
    policy: str
    electricity_usd: float
    tokens: float
    p50_s: float
    p99_s: float
    failed: int
    tokens_by_cloud: dict[str, float]

    @property
    def usd_per_mtoken(self) -> float:
        return self.electricity_usd / self.tokens * 1e6


def assign(sc: Scenario, shares: np.ndarray) -> np.ndarray:
    """The cloud of each request: the router's weights applied in order (a low-discrepancy split)."""
    r = sc.replay
    u = np.mod((np.arange(len(r)) + 1) * GOLDEN, 1.0)
    cum = np.cumsum(shares / np.maximum(shares.sum(axis=1, keepdims=True), 1e-12), axis=1)
    return np.minimum((u[:, None] >= cum[r.hour]).sum(axis=1), len(sc.clouds) - 1)


def evaluate(sc: Scenario, run: PolicyRun) -> Outcome:
    """Cost, latency and failed requests of a policy's shares on the replay (see the module docstring)."""
    r = sc.replay
    cost = sum(float(run.shares[h] @ sc.coefficients(h)) for h in range(r.hours))
    where = assign(sc, run.shares)
    latency = np.zeros(len(r))
    failed = 0
    u2 = np.mod((np.arange(len(r)) + 1) * GOLDEN ** 2 * 7, 1.0)
    for i, (c, rt) in enumerate(zip(sc.clouds, sc.rates)):
        mine = where == i
        svc = rt.service_s(r.context[mine], r.generated[mine])
        offer = sc.offers(0, np.zeros(len(sc.clouds)))[i]
        rho_cap = utilisation_cap(offer, sc.goal)
        mean_s = float(np.mean(sc.service[i]))
        wait = np.zeros(mine.sum())
        hours = r.hour[mine]
        for h in np.unique(hours):
            tps = run.shares[h, i] * sc.demand[h]
            reps = replicas_for(offer, tps, rho_cap)
            rho = tps / (reps * offer.replica_tps)
            at = hours == h
            if rho >= 1:
                failed += int(round(at.sum() * (1 - 1 / rho)))
                rho = 0.999
            cw = erlang_c(offer.batch, rho * offer.batch)
            theta = offer.batch * (1 - rho) / mean_s
            uu = u2[mine][at]
            wait[at] = np.where(uu < cw, np.log(np.maximum(cw, 1e-300) / np.maximum(uu, 1e-300)) / theta, 0.0)
        latency[mine] = c.rtt_ms / 1000 + svc + wait
    unserved = 1 - np.minimum(run.shares.sum(axis=1), 1.0)  # capacity short of the hour's demand
    failed += int(np.round(unserved * np.bincount(r.hour, minlength=r.hours)).sum())
    tokens = float(r.tokens.sum())
    by_cloud = {c.name: float(np.sum(run.shares[:, i] * (sc.ctx_h + sc.gen_h))) for i, c in enumerate(sc.clouds)}
    p50, p99 = np.quantile(latency, [0.5, 0.99]) if len(r) else (0.0, 0.0)
    return Outcome(run.name, cost, tokens, float(p50), float(p99), failed, by_cloud)
