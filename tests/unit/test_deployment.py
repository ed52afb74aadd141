"""One host or several: what crosscloud refuses under a multi-host executor, and how stages agree on the federation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crosscloud.core import deployment
from crosscloud.core.deployment import SingleHostOnly
from crosscloud.core.federation import read_federation
from crosscloud.run.ref import FederationMismatch, RunRef


@pytest.fixture()
def celery(monkeypatch):
    monkeypatch.setenv("CROSSCLOUD_EXECUTOR", "CeleryExecutor")
    deployment.set_executor(None)
    yield
    deployment.set_executor(None)


@pytest.mark.parametrize("name, several", [
    ("LocalExecutor", False), ("", False), ("SequentialExecutor", False), ("CeleryExecutor", True),
    ("airflow.providers.celery.executors.celery_executor.CeleryExecutor", True),
    ("LocalExecutor,KubernetesExecutor", True), ("team_a:CeleryExecutor", True),
])
def test_executors_that_run_tasks_on_other_hosts(name, several):
    deployment.set_executor(name)
    try:
        assert deployment.multi_host() is several
    finally:
        deployment.set_executor(None)


def test_a_relative_file_store_is_refused_on_several_hosts(celery):
    from crosscloud.store.open_store import open_store
    from federations import embedded

    cloud = embedded().local_cloud  # the embedded default: file://clouds/<name>, under this host's state folder
    with pytest.raises(SingleHostOnly, match="use an S3 store"):
        open_store(cloud, "team-a")


def test_the_local_access_method_is_refused_on_several_hosts(celery):
    from crosscloud.backends import get_backend
    from crosscloud.backends.base import SubTaskSpec

    spec = SubTaskSpec(tenant="team-a", run_id="r", cloud="beijing", image="x", accelerator="cpu", devices=1)
    with pytest.raises(SingleHostOnly, match="reach the cloud by ssh or kubernetes"):
        get_backend("local").start(spec)


def test_mlflow_needs_a_shared_tracking_uri_on_several_hosts(celery, monkeypatch):
    from crosscloud.tracking import mlflow_runs

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(SingleHostOnly, match="MLFLOW_TRACKING_URI"):
        mlflow_runs.tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert mlflow_runs.tracking_uri() == "http://mlflow:5000"


def test_every_stage_checks_it_reads_the_federation_the_run_was_admitted_with(tmp_path):
    from federations import embedded_file

    path = embedded_file(tmp_path / "federation.yaml")
    _, digest = read_federation(path)
    ref = RunRef(str(path), "team-a", "r1", digest)
    assert ref.federation().name
    assert RunRef(**ref.to_dict()) == ref  # what XCom carries between hosts
    path.write_text(path.read_text().replace("team-a", "team-z"))  # another host, another federation
    with pytest.raises(FederationMismatch, match="deploy the same federation file on every host"):
        ref.federation()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_interrupt_inside_a_ledger_transaction_waits_for_its_end(tmp_path, sig):
    """Interrupted mid-statement, SQLite kept the transaction's lock and cleanup's release then failed on it."""
    code = ("import os, signal, time\nfrom crosscloud.core.interrupt import terminate_as_interrupt\n"
            "from crosscloud.ledger.engine import engine_for, write\nimport sqlalchemy as sa\n"
            f"engine = engine_for(sa.engine.make_url('sqlite:///{tmp_path}/l.db'))\n"
            "try:\n    with terminate_as_interrupt():\n        with write(engine) as conn:\n"
            "            conn.exec_driver_sql('CREATE TABLE t (x INTEGER)')\n"
            f"            os.kill(os.getpid(), signal.{sig}); time.sleep(0.5)\n"
            "            conn.exec_driver_sql('INSERT INTO t VALUES (1)')\n"
            "        print('after the transaction')\nexcept KeyboardInterrupt:\n"
            "    with write(engine) as conn:  # cleanup's own write: not locked out\n"
            "        print('cleaned up', conn.exec_driver_sql('SELECT count(*) FROM t').scalar())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "cleaned up 1", done.stderr


def test_sigterm_unwinds_like_ctrl_c():
    code = ("import os, signal\nfrom crosscloud.core.interrupt import terminate_as_interrupt\n"
            "try:\n    with terminate_as_interrupt():\n        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        import time; time.sleep(10)\nexcept KeyboardInterrupt:\n    print('cleaned up')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "cleaned up", done.stderr
