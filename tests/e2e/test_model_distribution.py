"""A real run of the DAG ``model_distribution`` under ``dag.test()``: plan, apply per cloud, verify warm."""

from __future__ import annotations

import json

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import admit_stage, preheat_stage, release_stage
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e]


def test_distribution_pins_fetches_and_verifies(dagbag):
    ref = admit_stage(JobSpec(tenant="team-b", rounds=1, inner_steps=1, model_size="tiny", seed=3), "distribution-run")
    preheat_stage(ref)
    release_stage(ref)
    _, plan = ref.load()
    run = dagbag.get_dag("model_distribution").test(
        run_conf={"tenant": "team-b", "clouds": ["beijing", "singapore"], "budget_gb": 1.0,
                  "artifacts": [plan.program.code.sha256]}
    )
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert all(s == "success" for s in states.values()), states
    assert sum(1 for t, _ in states if t == "apply_distribution") == 2
    home = open_store(load_federation().local_cloud, "team-b")
    stored = [k for k in home.list("team-b/distribution") if k.endswith(".json")]
    shown = json.loads(home.get(stored[-1]))
    assert plan.program.code.sha256 in shown["clouds"]["singapore"]["pinned"]  # the pinned artifact went where asked
    check = next(ti for ti in run.get_task_instances() if ti.task_id == "check_warm")
    assert check.xcom_pull(task_ids="check_warm")["singapore"] >= 1
