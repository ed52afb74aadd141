"""One real run of the DAG ``cross_cloud_training`` under ``dag.test()``: it trains for real."""

from __future__ import annotations

import json

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.keys import RunKeys
from crosscloud.store.commit import read_commit
from crosscloud.store.open_store import open_store

CONF = {"rounds": 3, "inner_steps": 12, "model_size": "tiny", "global_batch": 12, "seed": 7, "eval_every_steps": 24}

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_runs(dagbag):
    dag = dagbag.get_dag("cross_cloud_training")
    first = dag.test(run_conf=CONF)
    second = dag.test(run_conf=CONF)
    return first, second


def _store_json(store, key):
    return json.loads(store.get(key))


def test_every_stage_succeeds(two_runs):
    for run in two_runs:
        assert run.state == "success"
        states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
        assert {t for t, _ in states} >= {"admit", "preheat", "dispatch_local", "sync_checkpoints", "aggregate", "cleanup"}
        # no cloud of the embedded federation is reached by kubernetes or ssh: those stages expand to nothing
        remote = {"dispatch_kubernetes", "await_kubernetes", "dispatch_ssh"}
        assert all(s == ("skipped" if t in remote else "success") for (t, _), s in states.items()), states
        assert sum(1 for t, _ in states if t == "dispatch_local") == 3


def test_run_reserved_its_devices_and_gave_them_back(two_runs):
    from crosscloud.ledger import Ledger

    for run in two_runs:
        plan = json.loads(open_store(load_federation().local_cloud).get(RunKeys("team-a", run.run_id).plan))
        assert {c["cloud"] for c in plan["candidates"] if c["chosen"]} == {"beijing", "shanghai", "singapore"}
        assert Ledger().active(run_id=run.run_id) == []


def test_every_cloud_made_the_same_globals_and_kept_only_the_last_rounds(two_runs):
    fed = load_federation()
    keys = RunKeys("team-a", two_runs[0].run_id)
    home = open_store(fed.local_cloud)
    history = json.loads(home.get(keys.history))
    assert [r["round"] for r in history] == list(range(CONF["rounds"]))
    # each cloud reported the digest of every global it made: the same bytes everywhere, every round
    assert all(r["digests_agree"] and set(r["digests"]) == {c.name for c in fed.clouds} for r in history)
    kept = {0, *range(CONF["rounds"] + 1 - 2, CONF["rounds"] + 1)}  # global 0, then keep_rounds (2) rounds
    for cloud in fed.clouds:
        store = open_store(cloud)
        held = {r for r in range(CONF["rounds"] + 1) if read_commit(store, keys.global_step(r)) is not None}
        assert held == kept, f"{cloud.name} holds globals {sorted(held)}"
        assert set(read_commit(store, keys.global_step(CONF["rounds"]))["objects"]) == {"params.safetensors"}


def test_rounds_report_their_cpu_time_and_their_evaluations_apart(two_runs):
    """What bench-sdk and bench-gap account by: every round's CPU time, and the evaluations inside its seconds."""
    home = open_store(load_federation().local_cloud)
    history = json.loads(home.get(RunKeys("team-a", two_runs[0].run_id).history))
    records = [(c, rec) for r in history for c, rec in r["clouds"].items()]
    assert all(rec["cpu_s"] > 0 for _, rec in records)
    assert all(0 <= rec["eval_s"] <= rec["wait_s"] + rec["download_s"] + rec["compute_s"] + rec["upload_s"]
               for _, rec in records)
    # one cloud evaluates (global 0 before round 0, then the globals the schedule asks for)
    assert len({c for c, rec in records if rec["eval_s"] > 0}) == 1


def test_training_lowers_eval_loss(two_runs):
    home = open_store(load_federation().local_cloud)
    summary = _store_json(home, RunKeys("team-a", two_runs[0].run_id).summary)
    m = summary["metrics"]
    assert m["final_eval_loss"] < 0.8 * m["eval_loss_start"]
    assert m["iteration_time_gap_pct"] is not None
    assert set(summary["clouds"]) == {"beijing", "shanghai", "singapore"}


def test_mlflow_holds_parent_and_child_per_cloud(two_runs):
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name("cross_cloud_training")
    run_id = two_runs[0].run_id
    parents = client.search_runs([exp.experiment_id], f"tags.`airflow.run_id` = '{run_id}' and tags.`crosscloud.level` = 'job'")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["rounds"] == "3"
    # evaluated once 24 steps are trained (round 1) and after the last round
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "eval_loss")] == [1, 2]
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(c.data.tags["crosscloud.cloud"] for c in children) == ["beijing", "shanghai", "singapore"]
    for child in children:
        history = client.get_metric_history(child.info.run_id, "iteration_time_s")
        assert len(history) == CONF["rounds"] * CONF["inner_steps"]
        assert all(m.value > 0 for m in history)
        assert len(client.get_metric_history(child.info.run_id, "round_compute_s")) == CONF["rounds"]


def test_second_identical_run_preheats_zero_bytes(two_runs):
    home = open_store(load_federation().local_cloud)
    first = _store_json(home, f"{RunKeys('team-a', two_runs[0].run_id).root}/preheat.json")
    second = _store_json(home, f"{RunKeys('team-a', two_runs[1].run_id).root}/preheat.json")
    assert first["total_sent_bytes"] > 0
    assert second["total_sent_bytes"] == 0
    assert second["total_skipped_bytes"] == first["total_sent_bytes"] + first["total_skipped_bytes"]


def test_second_run_finds_its_baseline_in_mlflow(two_runs):
    home = open_store(load_federation().local_cloud)
    first = _store_json(home, RunKeys("team-a", two_runs[0].run_id).summary)
    second = _store_json(home, RunKeys("team-a", two_runs[1].run_id).summary)
    assert first["baseline"]["source"] == "calibration"
    assert second["baseline"]["source"] == "mlflow"
    assert first["baseline"]["run_id"] == f"{two_runs[0].run_id}.baseline"
    assert second["baseline"]["run_id"] == first["baseline"]["run_id"]
