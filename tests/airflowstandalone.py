"""A real ``airflow standalone`` for the browser tests: own AIRFLOW_HOME, state folder and free port.

It runs the api-server, scheduler, dag-processor and triggerer of this
checkout's DAGs and plugins, with the SimpleAuthManager's ``admin`` user (and
any other users given) and passwords written before start. Given ``teams``, it
runs in Airflow's multi-team mode with those teams created in the DB before
start (the auth manager refuses to start with a user's team the DB lacks).
With ``CI=true`` a server that cannot start fails the test; elsewhere the test
is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from s3servers import free_port


def unavailable(message: str) -> None:
    """Fail under CI (nothing may be skipped there), skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class AirflowAPI:
    """Airflow's REST API as a signed-in user: what the tests of a standalone Airflow and of a Celery deployment share.

    A subclass sets ``url``, ``passwords`` (user -> password) and ``log`` (where to look when something fails).
    """

    url: str
    passwords: dict[str, str]
    log: Path
    _tokens: dict[str, str]

    def serving(self, timeout_s: float, dead: Callable[[], str | None]) -> None:
        """Wait until the api-server answers its health check; ``dead()`` names a process that exited, if one did."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if gone := dead():
                unavailable(f"{gone} exited before {self.url} served; see {self.log}")
            try:
                if httpx.get(f"{self.url}/api/v2/monitor/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        unavailable(f"the api-server did not serve {self.url} within {timeout_s:.0f} s; see {self.log}")

    def token(self, user: str = "admin") -> str:
        if user not in self._tokens:
            r = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": self.passwords[user]}, timeout=30)
            r.raise_for_status()
            self._tokens[user] = r.json()["access_token"]
        return self._tokens[user]

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, f"{self.url}/api/v2{path}", headers={"Authorization": f"Bearer {self.token()}"},
                             timeout=30, **kwargs)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of a run (each map index its own)."""
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        r.raise_for_status()
        return r.json()["task_instances"]

    def trigger(self, dag_id: str, conf: dict, timeout_s: float = 300.0) -> str:
        """Unpause ``dag_id`` once the dag-processor has it (the other DAGs stay paused), trigger it; the run's id."""
        deadline = time.time() + timeout_s
        while self.api("GET", f"/dags/{dag_id}").status_code != 200:
            if time.time() > deadline:
                raise AssertionError(f"DAG {dag_id} never appeared; see {self.log}")
            time.sleep(2)
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
        r = self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        r.raise_for_status()
        return r.json()["dag_run_id"]

    def wait(self, dag_id: str, run_id: str, timeout_s: float = 900.0) -> dict:
        """The run once it has ended (success or failed)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(3)
        raise AssertionError(f"run {run_id} of {dag_id} did not end within {timeout_s:.0f} s; see {self.log}")

    def run_dag(self, dag_id: str, conf: dict, timeout_s: float = 900.0) -> dict:
        """Trigger ``dag_id`` and wait for the run's end."""
        started = time.time()
        run_id = self.trigger(dag_id, conf, timeout_s)
        return self.wait(dag_id, run_id, timeout_s - (time.time() - started))


class AirflowStandalone(AirflowAPI):
    def __init__(self, root: Path, users: dict[str, str] | None = None, teams: tuple[str, ...] = (),
                 tenant_bundles: bool = False):
        """``users``: name -> what follows the name in ``simple_auth_manager_users`` ("viewer:team-a");
        ``admin`` (an Admin) is always one of them. ``tenant_bundles``: each team its tenant's DAG bundle
        (``crosscloud-airflow tenant-bundles``) and its own triggerer, as a multi-team deployment runs them."""
        self.root = root
        self.bundles = None
        if tenant_bundles:
            from crosscloud_airflow.bundles import write_tenant_bundles

            self.bundles = write_tenant_bundles(list(teams), root / "bundles", Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]))
        self.triggerers: list[subprocess.Popen] = []
        self.users = {"admin": "admin", **(users or {})}
        self.teams = teams
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = root / "airflow"
        self.state = root / "state"
        self.data = root / "data"  # CROSSCLOUD_DATA_DIR: the test puts its price files and power sweep here
        self.log = root / "standalone.log"
        self.passwords = {name: secrets.token_urlsafe(12) for name in self.users}
        self.password = self.passwords["admin"]
        self.proc: subprocess.Popen | None = None
        self._tokens: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        env = os.environ.copy()
        env.update({
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # standalone starts `airflow ...`
            "AIRFLOW_HOME": str(self.home),
            "CROSSCLOUD_STATE_DIR": str(self.state),
            "CROSSCLOUD_DATA_DIR": str(self.data),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{name}:{spec}" for name, spec in self.users.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{self.state / 'mlflow.db'}",
            "CROSSCLOUD_MLFLOW_ARTIFACTS": (self.state / "mlartifacts").as_uri(),
        })
        if self.teams:
            env["AIRFLOW__CORE__MULTI_TEAM"] = "True"
        if self.bundles:
            env.update({"AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(self.bundles),
                        "AIRFLOW__CORE__TEAM_NAME_CACHE_TTL": "0",  # a DAG's team as soon as it is parsed
                        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"})
        return env

    def _create_teams(self, airflow: str) -> None:
        """The DB and its teams before the api-server starts: its auth manager checks users' teams against them."""
        for command in [["db", "migrate"]] + [["teams", "create", team] for team in self.teams]:
            done = subprocess.run([airflow, *command], env=self.env(), capture_output=True, text=True)
            if done.returncode != 0:
                unavailable(f"airflow {' '.join(command)} failed: {done.stderr[-2000:]}")

    def start(self, timeout_s: float = 240.0) -> None:
        self.home.mkdir(parents=True)
        self.state.mkdir(parents=True)
        (self.home / "passwords.json").write_text(json.dumps(self.passwords))
        airflow = str(Path(sys.executable).with_name("airflow"))
        if self.teams:
            self._create_teams(airflow)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([airflow, "standalone"], env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.serving(timeout_s, lambda: "airflow standalone" if self.proc.poll() is not None else None)
        if self.bundles:  # standalone's triggerer runs the triggers of no team only
            for team in self.teams:
                with open(self.root / f"triggerer-{team}.log", "wb") as log:
                    self.triggerers.append(subprocess.Popen([airflow, "triggerer", "--team-name", team], env=self.env(),
                                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for proc in self.triggerers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
