"""A run whose home cloud trains no part: the home store still holds its records, and every part reads them there.

The home (coordinator) cloud keeps a run's plan, round members and history
whether or not it trains. When it is drained or full at placement, the run
trains on other clouds only; the soak (``make bench-soak``) found that the
watcher and each cloud's exchange then looked the home store up among the
training clouds' stores and failed (``KeyError: 'beijing'``), three tries, the
run lost.
"""

from __future__ import annotations

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]


def test_a_run_on_clouds_other_than_its_home_trains_and_is_recorded_in_the_home_store():
    from crosscloud.pipeline.stages import run_job

    spec = JobSpec(tenant="team-a", clouds=["shanghai", "singapore"], rounds=2, inner_steps=4, model_size="tiny",
                   global_batch=8, seed=3)
    lines: list[str] = []
    summary = run_job(spec, "away-from-home", log=lines.append, compare_baseline=False)
    fed = load_federation()
    home = open_store(fed.local_cloud, "team-a")
    plan = Plan.load(home, "team-a", "away-from-home")
    assert plan.coordinator_cloud == "beijing" and {c.name for c in plan.clouds} == {"shanghai", "singapore"}
    assert set(plan.store_clouds) == {"shanghai", "singapore", "beijing"}
    history = load_history(home, plan)
    assert [r["round"] for r in history] == [0, 1] and all(r["digests_agree"] for r in history), lines[-20:]
    assert sorted(history[-1]["clouds"]) == ["shanghai", "singapore"]
    assert summary["metrics"]["final_eval_loss"] < summary["metrics"]["eval_loss_start"]
