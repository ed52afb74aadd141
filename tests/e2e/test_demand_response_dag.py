"""A grid request answered on a real training run: the DAG ``demand_response`` under ``dag.test()``."""

from __future__ import annotations

import json
import threading
import time

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.keys import RunKeys
from crosscloud.grid.demand_response import read_directives
from crosscloud.pipeline.stages import run_job
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_cut_is_planned_applied_verified_and_restored_while_the_run_finishes(dagbag):
    # long enough (about 3 s a round) that the run still trains when the request arrives
    spec, run_id = JobSpec(rounds=12, inner_steps=20, model_size="small", seed=5), "dr-e2e"
    outcome = {}
    trainer = threading.Thread(target=lambda: outcome.update(summary=run_job(spec, run_id, log=lambda m: None,
                                                                             compare_baseline=False)))
    trainer.start()
    home = open_store(load_federation().local_cloud, "team-a")
    history_key = f"{RunKeys('team-a', run_id).root}/history.json"
    while not home.exists(history_key) and trainer.is_alive():
        time.sleep(0.1)
    run = dagbag.get_dag("demand_response").test(
        run_conf={"cloud": "beijing", "reduce_pct": 10, "within_s": 120, "duration_s": 0}
    )
    trainer.join(300)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert all(s == "success" for s in states.values()), states
    records = [k for k in home.list(f"{RunKeys('team-a', run_id).root}/demand_response") if k.endswith(".json")]
    result = json.loads(home.get(records[0]))
    assert result["held"] and result["shed_pct"] >= 10 and result["time_to_shed_s"] < 120
    assert read_directives(home, RunKeys("team-a", run_id).root) == {}  # restored
    history = json.loads(home.get(history_key))
    assert len(history) == spec.rounds and all("beijing" in r["clouds"] for r in history)  # no round lost
    assert any(r["clouds"]["beijing"]["cap"] < 1.0 for r in history)  # the cut showed in the run itself
    assert outcome["summary"]["metrics"]["final_eval_loss"] < outcome["summary"]["metrics"]["eval_loss_start"]
