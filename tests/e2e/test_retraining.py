"""The DAG ``retraining`` under ``dag.test()``: real runs that register, and promote only a better model.

Three runs in order: from scratch (no champion yet: promoted), a retrain with
a learning rate that wrecks the model (worse than the champion on the same
held-out set: registered, not promoted), and a sound retrain that continues
the champion (better: promoted).
"""

from __future__ import annotations

import pytest

from crosscloud.tracking import registry

SMALL = {"model_size": "tiny", "rounds": 2, "inner_steps": 8, "global_batch": 12, "seed": 3, "tenant": "team-b"}

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _xcom(run, task_id: str) -> dict:
    ti = next(t for t in run.get_task_instances() if t.task_id == task_id)
    assert ti.state == "success", f"{task_id}: {ti.state}"
    return ti.xcom_pull(task_ids=task_id)


@pytest.fixture(scope="module")
def runs(dagbag):
    dag = dagbag.get_dag("retraining")
    # every conf names inner_lr: a DAG's params keep the values a previous dag.test() gave them
    confs = [{**SMALL, "inner_lr": 3e-3}, {**SMALL, "inner_lr": 0.5}, {**SMALL, "inner_lr": 3e-3}]
    return [dag.test(run_conf=conf) for conf in confs]


def test_every_run_succeeds(runs):
    assert [r.state for r in runs] == ["success"] * 3


def test_promotes_only_a_better_model(runs):
    first, bad, good = (_xcom(r, "decide") for r in runs)
    assert first["promoted"] and first["champion_eval_loss"] is None
    assert not bad["promoted"]
    assert bad["eval_loss"] > bad["champion_eval_loss"]
    assert bad["champion"] == first["version"]
    assert good["promoted"]
    assert good["eval_loss"] < good["champion_eval_loss"]
    assert good["champion_version"] == first["version"]


def test_registry_holds_versions_with_lineage_and_the_champion_alias(runs):
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    name = registry.model_name("team-b", "byte-lm-tiny")
    versions = {int(v.version): v for v in client.search_model_versions(f"name = '{name}'")}
    assert sorted(versions) == [1, 2, 3]
    assert int(registry.champion(client, name).version) == 3
    first, bad, good = (versions[v].tags for v in (1, 2, 3))
    assert "crosscloud.parent_model" not in first
    # the bad retrain continued the champion; so did the good one, not the rejected version 2
    assert bad["crosscloud.parent_model"] == f"{name}/1"
    assert good["crosscloud.parent_model"] == f"{name}/1"
    assert (first["crosscloud.promoted"], bad["crosscloud.promoted"], good["crosscloud.promoted"]) == ("true", "false", "true")
    for v, run in zip((1, 2, 3), runs):
        tags = versions[v].tags
        assert tags["airflow.run_id"] == run.run_id
        assert tags["airflow.dag_id"] == "retraining"
        assert len(tags["crosscloud.plan_sha256"]) == 64
        assert all(len(d) == 64 for d in tags["crosscloud.data_sha256"].split(","))
        assert set(c.split(":")[0] for c in tags["crosscloud.clouds"].split(",")) == {"beijing", "shanghai"}  # team-b's quota
    # a retrain starts from the weights it names: its initial model is the champion's final one
    assert good["crosscloud.init_sha256"] == bad["crosscloud.init_sha256"] != first["crosscloud.init_sha256"]
    assert bad["crosscloud.init_sha256"] == first["crosscloud.model_sha256"]  # the champion's registered bytes
