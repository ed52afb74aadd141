"""The DAG ``cross_cloud_training`` with the three clouds on three real S3 server processes.

Credentials reach the tasks as Airflow Connections (one per cloud and tenant)
and the sub-tasks as their environment; none is written to the plan or logs.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, load_federation
from crosscloud.core.keys import RunKeys
from crosscloud.store.commit import read_commit
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.s3, pytest.mark.slow]

SECRET = "s3cr3t-never-logged"


@pytest.fixture(scope="module")
def s3_federation(s3_servers, tmp_path_factory):
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    for cloud in raw["clouds"]:
        server = s3_servers[cloud["name"]]
        cloud["store"] = {"url": f"s3://crosscloud/e2e/{cloud['name']}", "endpoint_url": server.endpoint,
                          "region": "us-east-1", "addressing_style": "path",
                          "connection_id": f"s3_{cloud['name']}_{{tenant}}"}
    path = tmp_path_factory.mktemp("s3fed") / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {"CROSSCLOUD_FEDERATION": str(path)}
    for cloud in raw["clouds"]:
        env[f"AIRFLOW_CONN_S3_{cloud['name'].upper()}_TEAM-A"] = json.dumps(
            {"conn_type": "aws", "login": f"key-{cloud['name']}", "password": SECRET})
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield path
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_training_run_over_three_s3_servers(s3_federation, s3_servers, dagbag, state_dir, capfd):
    dag = dagbag.get_dag("cross_cloud_training")
    run = dag.test(run_conf={"rounds": 2, "inner_steps": 8, "model_size": "tiny", "global_batch": 12, "seed": 3})
    assert run.state == "success"
    fed = load_federation(s3_federation)
    keys = RunKeys("team-a", run.run_id)
    for cloud in fed.clouds:
        store = open_store(cloud, "team-a")
        assert store.__class__.__name__ == "TenantStore" and "S3Store" in repr(store)
        for r in range(3):
            assert read_commit(store, keys.global_step(r)) is not None, f"{cloud.name} lacks global round {r}"
    home = open_store(fed.local_cloud, "team-a")
    summary = json.loads(home.get(keys.summary))
    assert summary["metrics"]["final_eval_loss"] < summary["metrics"]["eval_loss_start"]
    # nothing stored in the local folders: everything went to the S3 servers
    assert not (state_dir / "clouds" / "beijing" / "team-a" / "runs" / run.run_id).exists()
    # the secret never shows: not in the plan, the task logs, the sub-tasks' handles
    assert SECRET not in home.get(keys.plan).decode()
    captured = capfd.readouterr()
    assert SECRET not in captured.out and SECRET not in captured.err
    for handle in (state_dir / "subtasks" / "team-a" / run.run_id).glob("*/handle.json"):
        assert SECRET not in handle.read_text()
    # nor anywhere else: no file of the state folder (Airflow's DB and task logs, MLflow's DB with every
    # param and tag, its artifacts with the sub-tasks' logs, the sub-tasks' folders) and no stored object
    assert (state_dir / "mlflow.db").is_file() and any((state_dir / "mlartifacts").rglob("*.log"))
    leaks = [str(p) for p in state_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    for server in s3_servers.values():
        s3 = server.client()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="crosscloud"):
            leaks += [f"s3://{server.name}/{o['Key']}" for o in page.get("Contents", [])
                      if SECRET.encode() in s3.get_object(Bucket="crosscloud", Key=o["Key"])["Body"].read()]
    assert leaks == []
