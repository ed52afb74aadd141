"""Test settings: every test session gets its own state folder, Airflow home and MLflow DB.

The environment is set here, at import, because Airflow reads its configuration
when it is first imported.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' helper modules
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "bench"))  # the benchmarks' inputs and reference policies

ROOT = Path(__file__).resolve().parents[1]
_STATE = Path(tempfile.mkdtemp(prefix="crosscloud-test-"))
os.environ.update(
    {
        "CROSSCLOUD_STATE_DIR": str(_STATE),
        "AIRFLOW_HOME": str(_STATE / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_STATE / 'airflow' / 'airflow.db'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_STATE / 'mlflow.db'}",
        "CROSSCLOUD_MLFLOW_ARTIFACTS": (_STATE / "mlartifacts").as_uri(),
    }
)
os.environ.pop("CROSSCLOUD_FEDERATION", None)
(_STATE / "airflow").mkdir(parents=True, exist_ok=True)

# A hand-made power-cap sweep in the format of the real one (../shared/data/power/dvfs_sweep.csv), so that
# the tests run where the public data is not installed; the benchmarks read the real data.
SYNTHETIC_SWEEP = """Workload,GPU power cap,throughput,total GPU power,normalized throughput,power per GPU
ft_synthetic,100,0.25,800,0.25,100
ft_synthetic,200,0.80,1600,0.80,200
ft_synthetic,250,0.88,1840,0.88,230
ft_synthetic,300,0.95,2160,0.95,270
ft_synthetic,400,1.00,2560,1.00,320
infer_synthetic,200,0.9,1600,0.90,200
infer_synthetic,400,1.0,3200,1.00,400
"""
(_STATE / "data" / "power").mkdir(parents=True, exist_ok=True)
(_STATE / "data" / "power" / "dvfs_sweep.csv").write_text(SYNTHETIC_SWEEP)
os.environ["CROSSCLOUD_DATA_DIR"] = str(_STATE / "data")


@pytest.fixture()
def ledger(tmp_path):
    """A reservation ledger of the test's own, so reservations never leak between tests."""
    from crosscloud.ledger import Ledger

    return Ledger(tmp_path / "ledger.sqlite")


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server on 127.0.0.1 for the session (tests/pgserver.py): ``.url(db)``, ``.create_database(name)``."""
    from pgserver import PostgresServer, PostgresUnavailable

    server = PostgresServer({"fsync": "off"})  # a throwaway server: no crash to survive
    try:
        server.start()
    except PostgresUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.multihost)])
def ledger_location(request, tmp_path) -> str:
    """A fresh ledger's place on each backend: a SQLite file's path, and a new database on the session's PostgreSQL
    (those runs are marked ``multihost``)."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return request.getfixturevalue("postgres").create_database(f"ledger_{uuid.uuid4().hex[:12]}")


@pytest.fixture()
def any_ledger(ledger_location):
    """A ledger of the test's own, on each backend."""
    from crosscloud.ledger import Ledger

    return Ledger(ledger_location)


@pytest.fixture()
def in_processes():
    """Runs ``target(*args, results)`` in one spawned process per ``args``, all at once; returns what each put on
    ``results`` (in the order they did), once every process exited cleanly."""
    def run(target, arglists: list[tuple], timeout_s: float = 120) -> list:
        spawn = multiprocessing.get_context("spawn")
        results = spawn.Queue()
        procs = [spawn.Process(target=target, args=(*args, results)) for args in arglists]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        return [results.get(timeout=5) for _ in procs]

    return run


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE


def pytest_collection_modifyitems(config, items) -> None:
    """The whole-deployment modules first: with ``make test``'s two processes one of them takes these long files
    while the other takes the rest, instead of both idling at the end while one file runs for minutes."""
    items.sort(key=lambda item: item.get_closest_marker("multihost") is None)  # stable: the rest keep their order


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove the session's state folder (runs' stores, databases: hundreds of MB) when every test passed;
    a failed session keeps it to look into."""
    if exitstatus == 0:
        shutil.rmtree(_STATE, ignore_errors=True)
    else:
        print(f"\ntest state kept in {_STATE}", file=sys.stderr)


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """An initialised Airflow metadata DB for real DAG runs."""
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)


@pytest.fixture(scope="session")
def dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture(scope="session")
def s3_servers(tmp_path_factory):
    """Three S3 server processes, one per embedded cloud, each with bucket ``crosscloud``."""
    from s3servers import S3Server

    logs = tmp_path_factory.mktemp("s3-logs")
    servers = {name: S3Server(name, logs) for name in ("beijing", "shanghai", "singapore")}
    try:
        for server in servers.values():
            server.start()
            server.make_bucket("crosscloud")
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory):
    """A real sshd on 127.0.0.1 (key authentication only, as the current user), started for the session."""
    from sshserver import SSHServer

    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
