"""Test settings: every test session gets its own state folder, Airflow home and MLflow DB.

The environment is set here, at import, because Airflow reads its configuration
when it is first imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' helper modules

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


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE


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
