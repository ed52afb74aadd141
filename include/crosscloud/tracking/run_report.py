"""One run as a person looks at it: its plan, why each cloud, its rounds split into compute / communication / waiting.

Read from the run's own objects in the home cloud's store (``plan.json``,
``history.json`` written after every round, ``summary.json`` once finished),
so a running run shows its rounds so far. The UI page and the MLflow plots
both read this; neither recomputes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from crosscloud.core.federation import Federation
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.store.open_store import open_store


@dataclass(frozen=True)
class RoundSlice:
    """One cloud's share of one round's wall time."""

    round: int
    compute_s: float
    comm_s: float  # upload of its pseudo-gradient + download of the global checkpoint
    wait_s: float  # waiting for the slowest cloud and the outer step

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s + self.wait_s


@dataclass
class RunView:
    run_id: str
    tenant: str
    mode: str
    state: str  # "finished" once summary.json exists, else "running"
    rounds: int
    tokens_per_round: int
    clouds: list[dict]  # name, accelerator, devices, share, method
    candidates: list[dict]  # cloud, accelerator, chosen, reason
    timeline: dict[str, list[RoundSlice]]
    rounds_done: int
    eval_loss: list[tuple[int, float]]  # (round, eval loss after it), for the rounds whose global was evaluated
    metrics: dict = field(default_factory=dict)  # the summary's whole-run metrics once finished
    baseline: dict | None = None
    tracking: dict = field(default_factory=dict)  # experiment_id, parent_run_id, child_run_ids


def slice_of(round_: int, rec: dict) -> RoundSlice:
    """Compute / communication / waiting of one cloud's round record (the history's or the summary's)."""
    return RoundSlice(round_, rec["compute_s"], rec["upload_s"] + rec["download_s"], rec["wait_s"])


def tokens_per_round(plan: Plan) -> int:
    """Tokens the whole job trains on in one round: global batch x inner steps x sequence length."""
    spec = plan.spec
    return spec.global_batch * spec.inner_steps * plan.model.seq_len


def find_tenant(fed: Federation, run_id: str) -> str | None:
    """The tenant whose store holds run ``run_id``; None when no tenant has it."""
    for t in fed.tenants:
        store = open_store(fed.local_cloud, t.name)
        if store.exists(f"{t.name}/runs/{run_id}/plan.json"):
            return t.name
    return None


def load_run(fed: Federation, tenant: str, run_id: str) -> RunView:
    store = open_store(fed.local_cloud, tenant)
    plan = Plan.load(store, tenant, run_id)
    history = load_history(store, plan)
    summary = json.loads(store.get(plan.keys.summary)) if store.exists(plan.keys.summary) else None
    timeline = {c.name: [slice_of(r["round"], r["clouds"][c.name]) for r in history if c.name in r["clouds"]]
                for c in plan.clouds}
    return RunView(
        run_id=run_id,
        tenant=tenant,
        mode=plan.spec.mode,
        state="finished" if summary else "running",
        rounds=plan.spec.rounds,
        tokens_per_round=tokens_per_round(plan),
        clouds=[{"name": c.name, "accelerator": c.accelerator, "devices": c.devices, "share": c.share, "method": c.method}
                for c in plan.clouds],
        candidates=[c.model_dump() for c in plan.candidates],
        timeline=timeline,
        rounds_done=len(history),
        eval_loss=[(r["round"], r["eval_loss"]) for r in history if r.get("eval_loss") is not None],
        metrics=summary["metrics"] if summary else {},
        baseline=summary["baseline"] if summary else None,
        tracking=plan.tracking,
    )


def list_runs(fed: Federation, tenant: str) -> list[tuple[float, str]]:
    """(admitted at, run id) of every run of ``tenant`` with a plan, newest first."""
    store = open_store(fed.local_cloud, tenant)
    found = []
    for key in store.list(f"{tenant}/runs"):
        parts = key.split("/")
        if len(parts) == 4 and parts[3] == "plan.json":
            found.append((json.loads(store.get(key)).get("created_at", 0.0), parts[2]))
    return sorted(found, reverse=True)
