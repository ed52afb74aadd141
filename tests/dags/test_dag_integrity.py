"""DAG integrity: every DAG imports cleanly, is documented, tagged and retried, and parses light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert len(dagbag.dags) >= 1


def test_every_dag_has_tags_doc_and_retries(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md, f"{dag_id} has no doc_md"
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


def test_cross_cloud_training_stages_and_params(dagbag):
    dag = dagbag.get_dag("cross_cloud_training")
    order = ["admit", "preheat", "clouds_of", "dispatch_local", "sync_checkpoints", "aggregate", "cleanup"]
    assert set(order) <= set(dag.task_ids)
    for before, after in zip(order, order[1:]):
        assert after in dag.get_task(before).get_flat_relative_ids(upstream=False), f"{before} must precede {after}"
    params = dag.params.dump()
    assert dag.params.get_param("model_size").schema["enum"] == ["tiny", "small", "base", "large"]
    # every job field is a Param with the engine's default: the DAG runs what the benchmarks measure
    from crosscloud.core.job import JobSpec

    assert params == JobSpec().to_dict()


def test_retraining_trains_through_the_queue_with_the_training_stages(dagbag):
    dag = dagbag.get_dag("retraining")
    order = ["admit", "preheat", "clouds_of", "dispatch_local", "sync_checkpoints", "aggregate", "decide"]
    for before, after in zip(order, order[1:]):
        assert after in dag.get_task(before).get_flat_relative_ids(upstream=False), f"{before} must precede {after}"
    admit = dag.get_task("admit")
    assert type(admit).__name__ == "AdmitOperator" and admit.continue_registered  # queued, deferred, continues the model
    assert dag.get_task("cleanup").is_teardown
    assert set(dagbag.get_dag("cross_cloud_training").task_ids) <= set(dag.task_ids)  # the same stages
    assert {"priority", "deadline", "deferrable", "objective"} <= set(dag.params)


def test_inference_placement_preheats_before_it_places_and_runs_hourly(dagbag):
    from datetime import timedelta

    dag = dagbag.get_dag("inference_placement")
    order = ["resolve", "find_cold", "preheat", "place", "apply", "record"]
    for before, after in zip(order, order[1:]):
        assert after in dag.get_task(before).get_flat_relative_ids(upstream=False), f"{before} must precede {after}"
    assert dag.get_task("place").trigger_rule == "none_failed"  # no cold cloud: the mapped preheat is skipped
    assert dag.schedule == timedelta(hours=1)
    assert {"tenant", "model", "alias", "clouds", "latency_goal_ms", "min_share", "jurisdictions"} <= set(dag.params)


PARSE = """
import json, socket, sys
def refuse(*a, **k):
    raise RuntimeError("network used at parse time")
socket.socket.connect = refuse
socket.create_connection = refuse
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
heavy = sorted(m for m in ("torch", "mlflow", "boto3", "crosscloud.pipeline.stages") if m in sys.modules)
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "heavy": heavy, "dags": sorted(bag.dag_ids)}))
"""


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_parsing_touches_no_network_and_imports_nothing_heavy(dag_file, airflow_db):
    out = subprocess.run([sys.executable, "-c", PARSE, str(dag_file)], capture_output=True, text=True, check=True,
                         env=os.environ.copy())
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["dags"], f"{dag_file.name} defines no DAG"
    assert result["heavy"] == [], f"{dag_file.name} imports {result['heavy']} at parse time"


TASKS = """
import sys
import crosscloud.pipeline.stages, crosscloud.pipeline.retraining, crosscloud_airflow.operators, crosscloud_airflow.training
from crosscloud.core.job import JobSpec
from crosscloud.pipeline.inputs import load_job_program
assert load_job_program(JobSpec(program="examples/hf_causal_lm/train.py")).parameters > 0
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_no_task_imports_torch_or_the_program():
    """admit, preheat, sync (the watcher), aggregate, registration and retraining's decide: none loads torch or
    the team's program in the task's process; admit has a child process describe the program's model."""
    out = subprocess.run([sys.executable, "-c", TASKS], capture_output=True, text=True, check=True, env=os.environ.copy())
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_each_tenant_bundle_defines_its_own_dag_and_multi_team_mode_no_shared_one(tmp_path, airflow_db):
    """Multi-team mode: every tenant of the federation its bundle, each a DAG whose tenant is fixed; the DAGs folder's
    file defines no DAG of no team, which every user could read."""
    from crosscloud_airflow.bundles import write_tenant_bundles

    dags = Path(__file__).resolve().parents[2] / "dags"
    bundles = write_tenant_bundles(["team-a", "team-b"], tmp_path / "bundles", dags)
    assert [(b["name"], b.get("team_name")) for b in bundles] == [
        ("dags-folder", None), ("crosscloud-team-a", "team-a"), ("crosscloud-team-b", "team-b")]
    with pytest.raises(ValueError, match="inside the DAGs folder"):
        write_tenant_bundles(["team-a"], dags / "tenants", dags)
    for bundle in bundles[1:]:
        out = subprocess.run([sys.executable, "-c", PARSE, bundle["kwargs"]["path"]], capture_output=True, text=True,
                             check=True, env=os.environ.copy())
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["errors"] == {} and result["heavy"] == []
        assert result["dags"] == [f"cross_cloud_training__{bundle['team_name']}"]
    shared = subprocess.run([sys.executable, "-c", PARSE, str(dags / "cross_cloud_training.py")], capture_output=True,
                            text=True, check=True, env={**os.environ, "AIRFLOW__CORE__MULTI_TEAM": "True"})
    assert json.loads(shared.stdout.strip().splitlines()[-1])["dags"] == []


def test_a_tenant_dag_accepts_only_its_tenant():
    from airflow.sdk.definitions.param import ParamValidationError

    from crosscloud_airflow.training_dag import training_dag

    dag = training_dag("team-b")
    assert dag.dag_id == "cross_cloud_training__team-b" and "team-b" in dag.tags
    assert dag.params["tenant"] == "team-b"
    with pytest.raises(ParamValidationError):  # a run of team-b's DAG for team-a
        dag.params["tenant"] = "team-a"
