"""A real multi-host Airflow on one machine: the CeleryExecutor with Redis and PostgreSQL, and Celery workers
that stand for hosts.

The api-server, scheduler, dag-processor and triggerer share one Airflow home;
each worker has its own ``AIRFLOW_HOME``, state folder and name (the task
instances' ``hostname``), as a worker on another host would. Everything that
crosses "hosts" goes through the servers a real deployment shares: Airflow's
and the ledger's PostgreSQL databases, Redis, the clouds' S3 stores and sshd.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from airflowstandalone import AirflowAPI, unavailable
from s3servers import free_port

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))


class CeleryDeployment(AirflowAPI):
    def __init__(self, root: Path, airflow_db: str, broker: str, env: dict[str, str]):
        """``airflow_db``: a SQLAlchemy URL of Airflow's own database; ``env``: what every host shares besides."""
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.passwords, self._tokens, self.log = {"admin": secrets.token_urlsafe(12)}, {}, root
        self.shared = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
            "AIRFLOW__CELERY__BROKER_URL": broker,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + airflow_db.replace("+psycopg2", ""),
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(root / "passwords.json"),
            # a worker that died is noticed within seconds, not minutes: its task is failed and retried elsewhere
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "90",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "hostnames.host_name",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **env,
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.workers: set[str] = set()
        self._control = {"api-server": ["api-server", "--port", str(self.port), "--workers", "1"],
                         **{part: [part] for part in ("scheduler", "dag-processor", "triggerer")}}

    def host_env(self, host: str) -> dict[str, str]:
        """The environment of a process on ``host``: its own Airflow home and state folder, the shared settings."""
        home = self.root / host
        # this process's settings stay here; the public data folder is the same on every "host"
        env = {k: v for k, v in os.environ.items()
               if k == "CROSSCLOUD_DATA_DIR" or not k.startswith(("AIRFLOW__", "CROSSCLOUD_", "MLFLOW_"))}
        env.update(self.shared)
        env.update({"AIRFLOW_HOME": str(home / "airflow"), "CROSSCLOUD_STATE_DIR": str(home / "state"),
                    "CROSSCLOUD_TEST_HOST": host,
                    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())})
        (home / "airflow").mkdir(parents=True, exist_ok=True)
        (home / "state").mkdir(parents=True, exist_ok=True)
        return env

    def _spawn(self, name: str, host: str, args: list[str]) -> None:
        with open(self.root / f"{name}.log", "ab") as log:  # the process keeps its own copy of the file
            self.procs[name] = subprocess.Popen([AIRFLOW, *args], env=self.host_env(host), stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout_s: float = 300.0) -> None:
        """Migrate Airflow's database, then start the control plane on host ``control``."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "passwords.json").write_text(json.dumps(self.passwords))
        done = subprocess.run([AIRFLOW, "db", "migrate"], env=self.host_env("control"), capture_output=True, text=True)
        if done.returncode:
            unavailable(f"airflow db migrate on PostgreSQL failed: {done.stderr[-1500:]}")
        for name, args in self._control.items():
            self._spawn(name, "control", args)
        self.serving(timeout_s, lambda: ", ".join(n for n, p in self.procs.items() if p.poll() is not None) or None)

    def start_worker(self, host: str) -> None:
        self.workers.add(host)
        self._spawn(host, host, ["celery", "worker", "--concurrency", "2", "--celery-hostname", f"{host}@%h",
                                 "--without-gossip", "--without-mingle"])

    def kill(self, name: str) -> None:
        """The host dies: its worker and every process it started, at once."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def restart(self, name: str, down_s: float = 0.0) -> None:
        """A control-plane process (``scheduler``, ``triggerer``, ``dag-processor``, ``api-server``) or a worker
        killed at once, and started again after ``down_s``, as a host's supervisor would."""
        self.kill(name)
        time.sleep(down_s)
        if name in self.workers:
            self.start_worker(name)
        else:
            self._spawn(name, "control", self._control[name])

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]

    def tries(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict]:
        """Every try of a task instance, with the host each ran on."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        path += f"/{map_index}/tries" if map_index >= 0 else "/tries"
        r = self.api("GET", path)
        r.raise_for_status()
        return r.json()["task_instances"]
