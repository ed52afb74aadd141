"""``cross_cloud_training`` on a real multi-host Airflow: the CeleryExecutor with Redis and PostgreSQL, two workers.

Each worker stands for a host: its own ``AIRFLOW_HOME``, state folder and
name. The clouds are reached as a multi-host deployment must reach them: ssh
(the tests' real sshd) and S3 stores (moto servers); the ledger is a
PostgreSQL database of its own. A cloud is drained from a third "host" (an
operator's shell) before the run; a worker is killed, with every process it
started, while it runs a task of the run. Then two runs that each need the
whole of one cloud are triggered at once: the second waits in the queue
deferred on the triggerer and starts after the first ended, whichever worker
admits it. Last, ``inference_placement`` serves the
registered model twice, from whichever workers: one fleet in the ledger, one
router, and no request failed while the second run changed it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from celerydeployment import CeleryDeployment
from redisserver import RedisServer

from crosscloud.core.federation import load_federation
from crosscloud.ledger import Ledger
from crosscloud.run.plan import Plan
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.multihost, pytest.mark.e2e, pytest.mark.slow, pytest.mark.ssh, pytest.mark.s3]

DAG_ID = "cross_cloud_training"
SERVED = "crosscloud-team-a-byte-lm-tiny"  # what cross_cloud_training registers for CONF's model
CONF = {"rounds": 2, "inner_steps": 8, "model_size": "tiny", "global_batch": 12, "seed": 7}
DRAINED = "shanghai"
WORKERS = ("host-a", "host-b")


def _federation(tmp_path_factory, s3_servers, ssh_server) -> tuple[object, dict[str, str]]:
    """The embedded federation with every cloud behind ssh and an S3 store; the Connections it names, as env."""
    from federations import multi_host_file

    return multi_host_file(tmp_path_factory.mktemp("multihost-fed") / "federation.yaml",
                           tmp_path_factory.mktemp("cloud-hosts"), s3_servers, ssh_server)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, postgres, s3_servers, ssh_server):
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    redis.start()
    fed_path, conns = _federation(tmp_path_factory, s3_servers, ssh_server)
    root = tmp_path_factory.mktemp("celery")
    env = {"CROSSCLOUD_LEDGER_URL": postgres.create_database("ledger_multihost"),
           "MLFLOW_TRACKING_URI": postgres.create_database("mlflow_multihost"),
           "CROSSCLOUD_MLFLOW_ARTIFACTS": (root / "mlartifacts").as_uri(),
           "CROSSCLOUD_FEDERATION": str(fed_path), "CROSSCLOUD_QUEUE_POLL_S": "2", **conns}
    cluster = CeleryDeployment(root, postgres.create_database("airflow_multihost"), redis.url, env)
    try:
        cluster.start()
        for host in WORKERS:
            cluster.start_worker(host)
        yield cluster, fed_path
    finally:
        cluster.stop()
        redis.stop()


def _crosscloud(cluster: CeleryDeployment, host: str, *args: str, module: str = "crosscloud.cli") -> str:
    """The command line on ``host``; ``module`` crosscloud_airflow.cli reaches the clouds through the Connections."""
    done = subprocess.run([str(sys.executable), "-m", module, *args], env=cluster.host_env(host),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _kill_a_worker_mid_task(cluster: CeleryDeployment, run_id: str, timeout_s: float = 600) -> tuple[str, list[str]]:
    """Kill the first worker seen running a task of the run; the host and the tasks it was running."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        running = [t for t in cluster.task_instances(DAG_ID, run_id) if t["state"] == "running" and t["hostname"] in WORKERS]
        if running:
            host = running[0]["hostname"]
            cluster.kill(host)
            return host, [(t["task_id"], t["map_index"]) for t in running if t["hostname"] == host]
        if cluster.run_state(DAG_ID, run_id) in ("success", "failed"):
            break
        time.sleep(0.2)
    raise AssertionError(f"no task of run {run_id} was seen running on a worker; see {cluster.root}")


def _page_shows_reservation(cluster: CeleryDeployment, ledger: Ledger, run_id: str, timeout_s: float = 300) -> None:
    """The api-server's crosscloud page lists the run's reservation, which a worker on another host made."""
    deadline = time.time() + timeout_s
    while not ledger.active(run_id=run_id):
        assert time.time() < deadline, f"run {run_id} never held a reservation"
        time.sleep(0.5)
    page = httpx.get(f"{cluster.url}/crosscloud/", headers={"Authorization": f"Bearer {cluster.token()}"}, timeout=30)
    assert page.status_code == 200 and run_id in page.text


def test_a_run_survives_a_dead_worker_and_sees_a_drain_from_another_host(deployment, monkeypatch):
    cluster, fed_path = deployment
    for name in ("beijing", "shanghai", "singapore"):  # this process reads the home store as the tenant
        monkeypatch.setenv(f"CROSSCLOUD_{name.upper()}_TEAM_A_ACCESS_KEY_ID", f"key-{name}")
        monkeypatch.setenv(f"CROSSCLOUD_{name.upper()}_TEAM_A_SECRET_ACCESS_KEY", f"secret-{name}")
    ledger = Ledger(cluster.shared["CROSSCLOUD_LEDGER_URL"])
    _crosscloud(cluster, "operator", "cloud", "drain", DRAINED)  # an operator's shell: its own state folder
    try:
        run_id = cluster.trigger(DAG_ID, CONF)
        killed, was_running = _kill_a_worker_mid_task(cluster, run_id)
        _page_shows_reservation(cluster, ledger, run_id)
        state = cluster.wait(DAG_ID, run_id, timeout_s=1200)["state"]
    finally:
        _crosscloud(cluster, "operator", "cloud", "activate", DRAINED)
    assert state == "success", f"run {run_id} {state}; see {cluster.root}"
    survivor = next(h for h in WORKERS if h != killed)
    tries = {(t["task_id"], t["map_index"]): cluster.tries(DAG_ID, run_id, t["task_id"], t["map_index"])
             for t in cluster.task_instances(DAG_ID, run_id) if t["state"] not in ("skipped", "removed")}
    # tasks ran on both hosts; what the dead worker was running was tried again on the other, and succeeded
    assert {tr["hostname"] for ts in tries.values() for tr in ts} >= set(WORKERS)
    retried = [key for key in was_running if any(tr["hostname"] == survivor for tr in tries[key][1:])]
    assert retried, f"none of {was_running} (killed on {killed}) was tried again on {survivor}: {tries}"
    # the drain, issued from a third host, reached the placement made on a worker
    fed = load_federation(fed_path)
    plan = Plan.load(open_store(fed.local_cloud, "team-a"), "team-a", run_id)
    assert DRAINED not in [c.name for c in plan.clouds] and len(plan.clouds) == 2
    assert tries[("admit", -1)][-1]["hostname"] in WORKERS
    # every device the run reserved was given back, whichever host's cleanup did it
    assert ledger.active(run_id=run_id) == []
    assert any(e.run_id == run_id and e.kind == "released" for e in ledger.events(run_id=run_id))


def test_queued_runs_start_one_at_a_time_in_queue_order_across_workers(deployment):
    import sqlalchemy as sa

    cluster, _ = deployment
    ledger = Ledger(cluster.shared["CROSSCLOUD_LEDGER_URL"])
    conf = {**CONF, "rounds": 1, "clouds": ["beijing"], "placement": "auto", "devices": 4}  # all of beijing
    runs = []
    for _ in range(2):  # the order among several waiting runs is test_queued_runs' (one host)
        runs.append(cluster.trigger(DAG_ID, conf))
        time.sleep(1.0)  # submitted in this order (a run enters the queue when its admit task runs)
    states = {run_id: cluster.wait(DAG_ID, run_id, timeout_s=1200)["state"] for run_id in runs}
    assert set(states.values()) == {"success"}, f"{states}; see {cluster.root}"
    rows = sorted((ledger.queue.get("team-a", run_id) for run_id in runs), key=lambda r: r.submitted_at)
    assert [r.state for r in rows] == ["done"] * 2
    for earlier, later in zip(rows, rows[1:]):  # one at a time, in queue order: never two holding beijing
        assert later.started_at >= earlier.ended_at - 1e-3, (earlier, later)
    with ledger.engine.connect() as db:  # each started once: one reservation row per run, never a second
        counts = dict(db.execute(sa.text("SELECT run_id, count(*) FROM reservations WHERE run_id IN :ids GROUP BY run_id")
                                 .bindparams(sa.bindparam("ids", expanding=True)), {"ids": runs}).all())
    assert counts == {run_id: 1 for run_id in runs}
    admitted_on = {cluster.tries(DAG_ID, r, "admit")[-1]["hostname"] for r in runs}
    assert admitted_on <= set(WORKERS)


def _champion(cluster: CeleryDeployment) -> None:
    """The newest registered version of SERVED as its champion; a run trains and registers one if none is."""
    from mlflow import MlflowClient

    from crosscloud.tracking.registry import latest, promote

    uri = cluster.shared["MLFLOW_TRACKING_URI"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    if latest(client, SERVED) is None:  # this test alone
        run_id = cluster.trigger(DAG_ID, {**CONF, "rounds": 1, "clouds": ["beijing"], "placement": "auto", "devices": 1})
        assert cluster.wait(DAG_ID, run_id, timeout_s=1200)["state"] == "success"
    promote(client, SERVED, int(latest(client, SERVED).version))


def test_two_workers_serve_one_fleet_and_no_request_fails_while_it_changes(deployment):
    from pricefiles import write_flat_prices
    from servingload import Load, phase

    from crosscloud.serving.router import Router

    cluster, _ = deployment
    ledger = Ledger(cluster.shared["CROSSCLOUD_LEDGER_URL"])
    _champion(cluster)
    # every host reads the one public data folder: prices for the hour, removed again for the tests after this one
    priced = write_flat_prices(Path(os.environ["CROSSCLOUD_DATA_DIR"]), {"DE-LU": 60.0, "US-CAL-CISO": 40.0})
    conf = {"tenant": "team-a", "model": SERVED, "alias": "champion", "clouds": ["beijing", "shanghai"],
            "users_near": "beijing", "tokens_per_s": 300.0, "min_share": 0.1, "latency_goal_ms": 5000.0,
            "context_tokens": 8.0, "generated_tokens": 4.0}
    runs = [cluster.trigger("inference_placement", conf)]
    try:
        assert cluster.wait("inference_placement", runs[0], timeout_s=900)["state"] == "success", cluster.root
        record = ledger.fleets.get("team-a", SERVED)  # the fleet as any host reads it: the ledger's record
        assert {cloud for cloud, _ in record["replicas"]} == {"beijing", "shanghai"}, record
        router = Router.attach(record["router"])  # through its runtime API, from this third "host"
        with Load(router.url) as load:
            phase(load, 1.0)
            runs.append(cluster.trigger("inference_placement", {**conf, "clouds": ["beijing"]}))
            state = cluster.wait("inference_placement", runs[1], timeout_s=900)["state"]
            after = phase(load, 1.0)
        assert state == "success", cluster.root
        assert load.failures() == [], load.failures()[:5]
        assert "shanghai" not in after and after.get("beijing", 0) > 0, after
        record = ledger.fleets.get("team-a", SERVED)
        assert {cloud for cloud, _ in record["replicas"]} == {"beijing"} and record["router"]["url"] == router.url
        applied_on = [cluster.tries("inference_placement", r, "apply")[-1]["hostname"] for r in runs]
        assert set(applied_on) <= set(WORKERS), applied_on
        page = httpx.get(f"{cluster.url}/crosscloud/", headers={"Authorization": f"Bearer {cluster.token()}"}, timeout=30)
        assert page.status_code == 200 and SERVED in page.text  # the api-server's host sees the fleet too
        status = json.loads(_crosscloud(cluster, "operator", "serve", "status", "--json", module="crosscloud_airflow.cli"))
        assert [(r["tenant"], r["model"]) for r in status] == [("team-a", SERVED)], status  # and an operator's host
    finally:  # from the operator's host: the replicas on the clouds' hosts over SSH, the router on its worker's
        stopped = _crosscloud(cluster, "operator", "serve", "stop", "--tenant", "team-a", "--model", SERVED,
                              module="crosscloud_airflow.cli")
        for path in priced:
            path.unlink()
    assert "beijing-0" in stopped and not Router.reachable(record["router"]), stopped
    assert ledger.fleets.get("team-a", SERVED)["replicas"] == []
