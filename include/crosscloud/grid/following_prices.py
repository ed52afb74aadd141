"""Compute follows price inside a running run: between rounds, a dear cloud's share of the batch moves to cheaper ones.

A run holds its devices on each of its clouds whether they train or not, so
moving work is worth it only when what the whole run pays per unit of work
falls: every held device's rental plus its draw (full power where it trains,
idle where its share went) at the cloud's electricity price now x PUE
(``energy.power.effective_price``), over the throughput of the clouds that still
train. Taking a cloud's share away saves its energy but slows the run, and
the rest of the devices' rental and draw lasts longer; with rental dominating
it seldom pays, with owned devices (rental 0) and a price spike it does.

The move uses the directives the coordinator already honours (see
``demand_response``): a ``shift`` directive gives the cloud share 0 from the
run's next round and its share to the run's other clouds by throughput;
withdrawing it gives the share back. Directives written here carry
``request.source = "prices"``; a grid request's directive on a cloud is never
touched (a cloud it shifted counts as away). A decision needs every cloud's price:
with one unknown, nothing changes and the reason is returned.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from crosscloud.core.federation import Federation
from crosscloud.energy.power import DEFAULT_PUE, device_power, effective_price
from crosscloud.grid.demand_response import Action, read_directives, write_directive
from crosscloud.grid.hold import is_grid
from crosscloud.ledger import Ledger
from crosscloud.pool.inventory import electricity_now
from crosscloud.run.plan import Plan
from crosscloud.scheduler.entry import decision_from_json
from crosscloud.store.open_store import open_store

SOURCE = "prices"


@dataclass(frozen=True)
class CloudRate:
    """What one of the run's clouds costs per hour and gives in throughput."""

    name: str
    devices: int
    throughput: float  # the plan's effective throughput (devices x relative speed)
    rental: float  # USD per device-hour
    busy_w: float
    idle_w: float
    pue: float
    price_usd_mwh: float


def cost_per_work(clouds: list[CloudRate], away: frozenset[str]) -> float:
    """USD per throughput-hour of the run when the clouds in ``away`` train nothing (``inf`` when none trains)."""
    speed = sum(c.throughput for c in clouds if c.name not in away)
    if speed <= 0:
        return float("inf")
    usd_h = sum(c.devices * effective_price(c.rental, c.idle_w if c.name in away else c.busy_w, c.price_usd_mwh, c.pue)
                for c in clouds)
    return usd_h / speed


def choose_away(clouds: list[CloudRate], current: frozenset[str] = frozenset(), fixed: frozenset[str] = frozenset(),
                held: frozenset[str] = frozenset(), max_slowdown: float = 1.5, min_gain: float = 0.02) -> frozenset[str]:
    """The clouds whose share should go elsewhere: the cheapest per unit of work within ``max_slowdown``.

    ``held`` clouds are a grid request's (never chosen); of them, ``fixed``
    are away whatever this decides. The choice changes from ``current`` only
    when it is at least ``min_gain`` cheaper, so that hourly price noise does
    not move shares back and forth every round.
    """
    full = sum(c.throughput for c in clouds if c.name not in fixed)
    free = [c.name for c in clouds if c.name not in held | fixed]
    options = []
    for k in range(len(free)):  # never all of them: the run keeps training
        for combo in itertools.combinations(free, k):
            away = frozenset(combo)
            speed = full - sum(c.throughput for c in clouds if c.name in away)
            if speed > 0 and full / speed <= max_slowdown + 1e-9:
                options.append((cost_per_work(clouds, away | fixed), sorted(away), away))
    keep = current - fixed
    if not options:
        return keep
    cost, _, best = min(options)
    return best if cost < cost_per_work(clouds, keep | fixed) * (1 - min_gain) else keep


def rates_of(fed: Federation, plan: Plan, now: float | None = None) -> tuple[list[CloudRate], list[str]]:
    """Each of the run's clouds at the electricity price now; the reasons for the clouds whose price is unknown."""
    rates, unknown = [], []
    for a in plan.clouds:
        cloud = fed.cloud(a.name)
        pool = next(p for p in cloud.pools if p.accelerator == a.accelerator)
        price, hour, note = electricity_now(cloud, now)
        if price is None:
            unknown.append(f"{a.name}: no electricity price{' for ' + hour if hour else ''} ({note})")
            continue
        power = device_power(a.accelerator, pool.power_w)
        rates.append(CloudRate(a.name, a.devices, a.throughput, pool.price_per_device_hour, power.full_w, power.idle_w,
                               cloud.grid.pue if cloud.grid else DEFAULT_PUE, price))
    return rates, unknown


def follow_prices(fed: Federation, tenant: str, run_id: str, now: float | None = None, max_slowdown: float = 1.5,
                  min_gain: float = 0.02) -> dict:
    """Write or withdraw the run's price-driven shift directives for its next round; returns the decision."""
    home = open_store(fed.local_cloud, tenant)
    plan = Plan.load(home, tenant, run_id)
    root = plan.keys.root
    directives = read_directives(home, root)
    mine = frozenset(c for c, d in directives.items() if d.get("request", {}).get("source") == SOURCE)
    held = frozenset(directives) - mine
    grid = frozenset(c for c in held if directives[c]["kind"] == "shift")
    rates, unknown = rates_of(fed, plan, now)
    decision = {"run_id": run_id, "tenant": tenant, "away": sorted(mine), "changed": [], "unknown": unknown}
    if unknown:
        return decision
    away = choose_away(rates, mine, grid, held, max_slowdown, min_gain)
    costs = {"cost_now": cost_per_work(rates, mine | grid), "cost_chosen": cost_per_work(rates, away | grid)}
    request = {"source": SOURCE, "issued_at": time.time(), **costs,
               "prices_usd_mwh": {r.name: r.price_usd_mwh for r in rates}}
    by_name = {r.name: r for r in rates}
    speed = sum(r.throughput for r in rates if r.name not in grid)
    for name in sorted(away - mine):
        r = by_name[name]
        action = Action(tenant, run_id, "shift", 1.0, 1.0, r.devices * (r.busy_w - r.idle_w) * r.pue, r.throughput / speed)
        write_directive(home, root, name, action, request)
    for name in sorted(mine - away):
        write_directive(home, root, name, None, request)
    return {**decision, "away": sorted(away), "changed": sorted(away ^ mine), **costs}


def follow_prices_all(fed: Federation, ledger: Ledger | None = None, now: float | None = None) -> list[dict]:
    """``follow_prices`` for every run holding devices now whose job asked for it (``JobSpec.follow_prices``).

    A run the queue's pass is pausing for prices or room (``scheduler.pauses``) is left to it: the whole run
    stops after its round, and shifting a share for that round would only slow the round it stops at."""
    ledger = ledger or Ledger()
    out = []
    for tenant, run_id in sorted({(r.tenant, r.run_id) for r in ledger.active() if not is_grid(r.tenant)}):
        plan = Plan.load(open_store(fed.local_cloud, tenant), tenant, run_id)
        if not (plan.spec.follow_prices and len(plan.clouds) > 1):
            continue
        pausing = _pausing(ledger, tenant, run_id)
        out.append({"run_id": run_id, "tenant": tenant, "away": [], "changed": [], "unknown": [pausing]} if pausing
                   else follow_prices(fed, tenant, run_id, now))
    return out


def _pausing(ledger: Ledger, tenant: str, run_id: str) -> str:
    """Why the queue is stopping the run (its pass decided to pause it), or ""."""
    row = ledger.queue.get(tenant, run_id)
    decision = decision_from_json(row.decision) if row is not None and row.state == "running" else None
    return f"left to the queue: {decision.reason}" if decision is not None and decision.kind == "pause" else ""
