"""Answering the grid: shed a share of one cloud's power within a deadline, cheaply, and give it back.

Machines cannot move, work can. For each run training on the cloud the
planner weighs two actions by the training progress they cost per watt shed:

- **shift**: the cloud's share of the global batch moves to the run's other
  clouds, which hold the same latest global checkpoint (they train on it every
  round); the cloud's devices fall to idle power. It costs the run that
  cloud's throughput.
- **throttle**: the cloud's devices run under a lower power cap; throughput
  follows the measured DVFS curve (``energy.power.PowerCurve``), so a 29 % cut in
  drawn power keeps about 90 % of the throughput.

Both take effect at the run's next round (the clouds' record of a round fixes them with
the next global checkpoint; workers read them when they start a round), so a
request is feasible only if the run's round time fits its ``within_s``. Power
is modelled (``energy.power``); a cloud with ``power_metrics`` is metered as well
(``energy.metered``: Prometheus, e.g. DCGM), and there the cut holds only
when the meter shows it. The directive and its effect are recorded in the
run's store, where the verification reads them back.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from crosscloud.core.federation import Federation
from crosscloud.core.keys import RunKeys
from crosscloud.energy.metered import measured_power_w
from crosscloud.energy.power import DEFAULT_PUE, PowerCurve, device_power
from crosscloud.grid.hold import give_back, hold_free, is_grid
from crosscloud.ledger import Ledger
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectNotFound, ObjectStore
from crosscloud.store.commit import read_commit
from crosscloud.store.open_store import open_store


@dataclass(frozen=True)
class RunOnCloud:
    """One run's sub-task on the cloud asked to shed."""

    tenant: str
    run_id: str
    accelerator: str
    devices: int
    share: int  # of the global batch, now
    global_batch: int
    round_s: float  # seconds until a directive takes effect: rounds, measured, times the rounds it travels
    others: tuple[str, ...]  # the run's other clouds, which could take the share
    cap: float = 1.0


@dataclass(frozen=True)
class Action:
    tenant: str
    run_id: str
    kind: str  # "shift" or "throttle"
    cap: float  # the cap the cloud's devices run at afterwards (1.0 for shift: they idle)
    throughput: float  # of full throughput kept under the cap (1.0 for shift)
    saved_w: float
    progress_lost: float  # fraction of the run's throughput given up while the request lasts


@dataclass
class ShedPlan:
    cloud: str
    reduce_pct: float
    within_s: float
    before_w: float
    target_w: float
    actions: list[Action] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    measured_before_w: float | None = None  # from the cloud's power_metrics, where it has one
    held_devices: int = 0  # free devices held from the queue while the request lasts (``grid.hold``)

    @property
    def after_w(self) -> float:
        return self.before_w - sum(a.saved_w for a in self.actions)

    @property
    def feasible(self) -> bool:
        return self.after_w <= self.target_w + 1e-9

    def to_dict(self) -> dict:
        return {**asdict(self), "after_w": self.after_w, "feasible": self.feasible}

    @classmethod
    def from_dict(cls, d: dict) -> ShedPlan:
        return cls(d["cloud"], d["reduce_pct"], d["within_s"], d["before_w"], d["target_w"],
                   [Action(**a) for a in d["actions"]], list(d["refused"]), d.get("measured_before_w"),
                   d.get("held_devices", 0))


def busy_w(accelerator: str, full_w: float, cap: float, curve: PowerCurve) -> float:
    """One training device's draw under ``cap``."""
    p = device_power(accelerator, full_w)
    return p.idle_w + (p.full_w - p.idle_w) * curve.power_at(cap)


def cloud_power_w(fed: Federation, cloud: str, runs: list[RunOnCloud], curve: PowerCurve) -> float:
    """Modelled draw at the meter: busy devices at their caps, the others idle, times PUE."""
    c = fed.cloud(cloud)
    pue = c.grid.pue if c.grid else DEFAULT_PUE
    total = 0.0
    for pool in c.pools:
        mine = [r for r in runs if r.accelerator == pool.accelerator]
        busy = sum(r.devices for r in mine)
        idle = max(pool.count - busy, 0) * device_power(pool.accelerator, pool.power_w).idle_w
        total += idle + sum(r.devices * busy_w(pool.accelerator, pool.power_w, r.cap, curve) for r in mine)
    return total * pue


def plan_shed(fed: Federation, cloud: str, runs: list[RunOnCloud], reduce_pct: float, within_s: float,
              curve: PowerCurve) -> ShedPlan:
    """The actions that shed ``reduce_pct`` of the cloud's draw within ``within_s`` at the least progress lost."""
    c = fed.cloud(cloud)
    pue = c.grid.pue if c.grid else DEFAULT_PUE
    full = {p.accelerator: p.power_w for p in c.pools}
    before = cloud_power_w(fed, cloud, runs, curve)
    plan = ShedPlan(cloud, reduce_pct, within_s, before, before * (1 - reduce_pct / 100))
    options: list[Action] = []
    for r in runs:
        if r.round_s > within_s:
            plan.refused.append(f"{r.run_id}: its rounds take an action {r.round_s:.0f} s to land, longer than the "
                                f"{within_s:.0f} s allowed")
            continue
        now_w = busy_w(r.accelerator, full[r.accelerator], r.cap, curve)
        idle_w = device_power(r.accelerator, full[r.accelerator]).idle_w
        weight = r.share / r.global_batch  # the part of the run's throughput this cloud carries
        if r.others:
            options.append(Action(r.tenant, r.run_id, "shift", 1.0, 1.0, r.devices * (now_w - idle_w) * pue, weight))
        else:
            plan.refused.append(f"{r.run_id}: no other cloud of the run can take its share")
        for cap in (0.9, 0.8, 0.7, 0.625, 0.5):  # the caps the DVFS sweep measured, as fractions
            if cap >= r.cap or cap < curve.min_cap:
                continue
            saved = r.devices * (now_w - busy_w(r.accelerator, full[r.accelerator], cap, curve)) * pue
            lost = weight * (1 - curve.throughput_at(cap) / curve.throughput_at(r.cap))
            options.append(Action(r.tenant, r.run_id, "throttle", cap, curve.throughput_at(cap), saved, lost))
    need = plan.before_w - plan.target_w
    # the cheapest single action that sheds enough; else the best progress-per-watt actions, one per run
    enough = [a for a in options if a.saved_w >= need]
    if enough:
        plan.actions = [min(enough, key=lambda a: (a.progress_lost, -a.saved_w))]
        return plan
    taken: set[str] = set()
    for a in sorted(options, key=lambda a: a.progress_lost / max(a.saved_w, 1e-9)):
        if a.run_id not in taken and plan.after_w > plan.target_w:
            plan.actions.append(a)
            taken.add(a.run_id)
    return plan


def control_key(root: str) -> str:
    return f"{root}/control.json"


def write_directive(store: ObjectStore, root: str, cloud: str, action: Action | None, request: dict) -> dict:
    """Tell a run's clouds what ``cloud`` does from its next round; None restores it."""
    try:
        control = json.loads(store.get(control_key(root)))
    except ObjectNotFound:
        control = {"clouds": {}}
    if action is None:
        control["clouds"].pop(cloud, None)
    else:
        control["clouds"][cloud] = {"kind": action.kind, "cap": action.cap, "throughput": action.throughput,
                                    "issued_at": time.time(), "request": request}
    store.put(control_key(root), json.dumps(control, indent=2).encode())
    return control


def read_directives(store: ObjectStore, root: str) -> dict[str, dict]:
    """The directives in force for a run, by cloud (empty when there are none)."""
    try:
        return json.loads(store.get(control_key(root)))["clouds"]
    except ObjectNotFound:
        return {}


# -- carrying a request out on the runs training now ------------------------------------------


def _home(fed: Federation, tenant: str) -> ObjectStore:
    return open_store(fed.local_cloud, tenant)


def runs_on(fed: Federation, cloud: str, ledger: Ledger | None = None) -> list[RunOnCloud]:
    """Every run holding devices on ``cloud`` now (the ledger), with its current share, cap and round time."""
    held: dict[tuple[str, str], int] = {}
    for r in (ledger or Ledger()).active():
        if r.cloud == cloud and not is_grid(r.tenant):
            held[(r.tenant, r.run_id)] = held.get((r.tenant, r.run_id), 0) + r.devices
    runs = []
    for (tenant, run_id), _ in sorted(held.items()):
        home = _home(fed, tenant)
        plan = Plan.load(home, tenant, run_id)
        if cloud not in {c.name for c in plan.clouds}:
            continue
        history = load_history(home, plan)
        recent = [h["wall_s"] for h in history[-3:]]
        shares = (history[-1].get("next_shares") if history else None) or {c.name: c.share for c in plan.clouds}
        directives = read_directives(home, plan.keys.root)
        shifted = {c for c, d in directives.items() if d["kind"] == "shift"}
        me = plan.cloud(cloud)
        # with overlapping rounds a directive lands up to three rounds later (workers run a round ahead)
        travel = 3 if plan.overlap else 1
        runs.append(RunOnCloud(
            tenant, run_id, me.accelerator, me.devices, shares.get(cloud, me.share), plan.spec.global_batch,
            travel * (sum(recent) / len(recent) if recent else plan.spec.round_timeout_s),
            tuple(c.name for c in plan.clouds if c.name not in shifted | {cloud}), directives.get(cloud, {}).get("cap", 1.0),
        ))
    return runs


def respond(fed: Federation, cloud: str, reduce_pct: float, within_s: float, curve: PowerCurve,
            ledger: Ledger | None = None, duration_s: float | None = None) -> tuple[ShedPlan, float]:
    """Plan the cut and tell each affected run's clouds; returns the plan and when it was issued. With
    ``duration_s``, the cloud's free devices are held from the queue for as long (``hold``)."""
    ledger = ledger or Ledger()
    plan = plan_shed(fed, cloud, runs_on(fed, cloud, ledger), reduce_pct, within_s, curve)
    if duration_s is not None:
        plan.held_devices = hold_free(fed, cloud, duration_s, ledger)
    if (meter := fed.cloud(cloud).power_metrics) is not None:
        plan.measured_before_w = measured_power_w(meter)
    issued = time.time()
    request = {"cloud": cloud, "reduce_pct": reduce_pct, "within_s": within_s}
    for a in plan.actions:
        write_directive(_home(fed, a.tenant), RunKeys(a.tenant, a.run_id).root, cloud, a, request)
    return plan, issued


def _applied(fed: Federation, cloud: str, action: Action, since: float) -> float | None:
    """When the cloud's sub-task of the run first started a round under the action, if it has."""
    store = open_store(fed.cloud(cloud), action.tenant)
    keys = RunKeys(action.tenant, action.run_id)
    prefix = f"{keys.root}/clouds/{cloud}/"
    rounds = sorted({int(k[len(prefix):].split("/")[0]) for k in store.list(prefix.rstrip("/"))
                     if k.startswith(prefix) and k.endswith("COMMIT.json")})
    for r in rounds:
        meta = (read_commit(store, keys.cloud_step(cloud, r)) or {}).get("meta", {})
        if (meta.get("started_at") or 0) < since:
            continue
        if (action.kind == "shift" and meta.get("samples") == 0) or (action.kind == "throttle" and meta.get("cap") == action.cap):
            return meta["started_at"]
    return None


def verify(fed: Federation, plan: ShedPlan, issued_at: float, curve: PowerCurve, timeout_s: float,
           poll_s: float = 0.5) -> dict:
    """Wait until every action shows in its sub-task's commits; the modelled draw then, and how long it took.

    Where the cloud has ``power_metrics``, the cut holds only if the measured draw fell by ``reduce_pct`` too.
    """
    deadline = time.monotonic() + timeout_s
    applied: dict[str, float] = {}
    while len(applied) < len(plan.actions) and time.monotonic() < deadline:
        for a in plan.actions:
            if a.run_id not in applied and (at := _applied(fed, plan.cloud, a, issued_at)) is not None:
                applied[a.run_id] = at
        time.sleep(poll_s if len(applied) < len(plan.actions) else 0)
    held = len(applied) == len(plan.actions) and plan.feasible
    measured_after = measured_shed = None
    if held and (meter := fed.cloud(plan.cloud).power_metrics) is not None and plan.measured_before_w:
        time.sleep(meter.settle_s)  # the meter shows the cut a scrape after it applied
        measured_after = measured_power_w(meter)
        measured_shed = 100 * (1 - measured_after / plan.measured_before_w)
        held = measured_shed >= plan.reduce_pct - 1e-9
    return {
        "cloud": plan.cloud,
        "held": held,
        "time_to_shed_s": max(applied.values()) - issued_at if held and applied else None,
        "power_before_w": plan.before_w,
        "power_after_w": plan.after_w if held else None,
        "shed_pct": 100 * (1 - plan.after_w / plan.before_w) if held else 0.0,
        "measured_power_before_w": plan.measured_before_w,
        "measured_power_after_w": measured_after,
        "measured_shed_pct": measured_shed,
        "actions": [asdict(a) for a in plan.actions],
        "refused": plan.refused,
        "progress_lost_fraction": {a.run_id: a.progress_lost for a in plan.actions},
    }


def restore(fed: Federation, plan: ShedPlan, ledger: Ledger | None = None) -> None:
    """The request is over: the runs get their shares and full power back from their next round, and the queue
    the cloud's held devices."""
    give_back(plan.cloud, ledger)
    for a in plan.actions:
        write_directive(_home(fed, a.tenant), RunKeys(a.tenant, a.run_id).root, plan.cloud, None, {})
