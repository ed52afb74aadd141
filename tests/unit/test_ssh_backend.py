"""The ssh access method against a real OpenSSH server on 127.0.0.1 (key authentication only).

The "bare-metal host" is this machine reached through sshd: the prepared
environment is this project's venv, the sub-task's folder a temporary one.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from crosscloud.backends import SubTaskError, SubTaskSpec, get_backend
from crosscloud.backends import ssh as ssh_backend

pytestmark = pytest.mark.ssh

SECRET = "planted-ssh-secret"


@pytest.fixture()
def access(ssh_server, tmp_path, monkeypatch):
    """The engine's own way in (no Airflow): host, port and user in the access section, key and known hosts from the environment."""
    monkeypatch.setenv("CROSSCLOUD_C1_SSH_KEY_FILE", str(ssh_server.key_file))
    monkeypatch.setenv("CROSSCLOUD_C1_SSH_KNOWN_HOSTS", str(ssh_server.known_hosts))
    ssh_backend.set_connector(None)
    yield {"method": "ssh", "host": "127.0.0.1", "port": ssh_server.port, "user": ssh_server.user,
           "workdir": str(tmp_path / "host"), "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}}
    ssh_backend.set_connector(None)


def _spec(access: dict, run_id: str, module: str, args: list[str], env: dict | None = None) -> SubTaskSpec:
    return SubTaskSpec(tenant="t", run_id=run_id, cloud="c1", image="bare-metal", accelerator="cpu", devices=1,
                       module=module, args=args, env=env or {}, access=access)


def _wait(backend, handle, timeout=60):
    deadline = time.time() + timeout
    while backend.state(handle) == "running" and time.time() < deadline:
        time.sleep(0.1)
    return backend.state(handle)


HELLO = f"""
import os, sys
copy = sys.argv[sys.argv.index("--federation") + 1]
print("hello from", os.environ["OMP_NUM_THREADS"], os.environ["CROSSCLOUD_C1_T_SECRET_ACCESS_KEY"] == "{SECRET}",
      open(copy).read().strip(), copy.startswith(os.environ["HOST_WORKDIR"]))
"""


def test_subtask_runs_on_the_host_with_its_secret_only_in_its_environment(access, tmp_path):
    backend = get_backend("ssh")
    modules = tmp_path / "modules"  # the prepared environment's own module path
    modules.mkdir()
    (modules / "hello_host.py").write_text(HELLO)
    access = {**access, "env": {**access["env"], "PYTHONPATH": str(modules), "HOST_WORKDIR": access["workdir"]}}
    federation = tmp_path / "federation.yaml"
    federation.write_text("name: copied-to-the-host\n")
    spec = _spec(access, "ok", "hello_host", ["--federation", str(federation)], env={"CROSSCLOUD_C1_T_SECRET_ACCESS_KEY": SECRET})
    handle = backend.start(spec)
    assert _wait(backend, handle) == "succeeded"
    text, offset = backend.logs(handle)
    assert "hello from 1 True name: copied-to-the-host True" in text
    assert backend.logs(handle, offset) == ("", offset)
    assert SECRET not in json.dumps(handle)
    folder = tmp_path / "host" / "subtasks" / "t" / "ok" / "c1"
    assert not (folder / "env").exists()  # the secret environment is removed once the sub-task read it
    assert SECRET not in (folder / "subtask.log").read_text()
    assert backend.find("t", "ok", "c1", access) == handle


def test_failing_subtask_reports_failure_and_its_output(access):
    backend = get_backend("ssh")
    handle = backend.start(_spec(access, "bad", "crosscloud.training.join_probe", []))  # exits 2: its arguments are missing
    assert _wait(backend, handle) == "failed"
    assert "the following arguments are required" in backend.logs(handle)[0]


def test_stop_ends_the_process_group_and_a_retry_does_not_start_twice(access):
    backend = get_backend("ssh")
    spec = _spec(access, "long", "timeit", ["-n", "1000000000", "pass"])
    handle = backend.start(spec)
    assert backend.state(handle) == "running"
    assert get_backend("ssh").start(spec)["pid"] == handle["pid"]
    backend.stop(handle)
    assert get_backend("ssh").state(handle) in ("failed", "lost")
    assert backend.find("t", "nothing-started", "c1", access) is None


def test_unprepared_host_and_unknown_host_key_are_named(access, tmp_path, monkeypatch):
    with pytest.raises(SubTaskError, match="prepared environment /nonexistent/python"):
        get_backend("ssh").start(_spec({**access, "python": "/nonexistent/python"}, "env", "timeit", []))
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    monkeypatch.setenv("CROSSCLOUD_C1_SSH_KNOWN_HOSTS", str(empty))
    ssh_backend.set_connector(lambda cloud, a: ssh_backend.SSHTarget.from_access(cloud, a).connect())  # a fresh client
    with pytest.raises(SubTaskError, match="cloud c1: cannot reach 127.0.0.1 over SSH: SSHException"):
        get_backend("ssh").find("t", "x", "c1", access)


def test_airflow_connection_through_the_ssh_provider(ssh_server, access, monkeypatch):
    """Inside Airflow the cloud's SSH Connection (host key pinned) opens the client, through SSHHook."""
    from crosscloud_airflow.connections import use_airflow_connections

    conn = {"conn_type": "ssh", "host": "127.0.0.1", "port": ssh_server.port, "login": ssh_server.user,
            "extra": {"key_file": str(ssh_server.key_file), "host_key": ssh_server.host_key}}
    monkeypatch.setenv("AIRFLOW_CONN_SSH_C1", json.dumps(conn))
    monkeypatch.delenv("CROSSCLOUD_C1_SSH_KEY_FILE")
    use_airflow_connections()
    via_conn = {**access, "host": None, "connection_id": "ssh_c1"}
    backend = get_backend("ssh")
    handle = backend.start(_spec(via_conn, "conn", "timeit", ["-n", "1", "-r", "1", "print('via the connection')"]))
    assert _wait(backend, handle) == "succeeded"
    assert "via the connection" in backend.logs(handle)[0]
    wrong = {**conn, "extra": {**conn["extra"], "host_key": ssh_server.host_key.split()[0] + " " + "A" * 68}}
    monkeypatch.setenv("AIRFLOW_CONN_SSH_C2", json.dumps(wrong))
    with pytest.raises(SubTaskError, match="cannot reach ssh_c2 over SSH"):
        get_backend("ssh").find("t", "x", "c2", {**via_conn, "connection_id": "ssh_c2"})


@pytest.mark.parametrize(("access", "message"), [
    ({"method": "ssh", "host": "h", "python": "/venv/bin/python"}, "access.workdir: required for method ssh"),
    ({"method": "ssh", "workdir": "/srv/cc", "python": "/venv/bin/python"}, "access.host: method ssh needs a host"),
    ({"method": "ssh", "host": "h", "workdir": "/w", "python": "/p", "env": {"A B": "1"}}, "access.env: ['A B']"),
])
def test_federation_names_what_an_ssh_cloud_lacks(access, message):
    from federations import embedded

    from crosscloud.core.federation import FederationError

    with pytest.raises(FederationError, match=re.escape(message)):
        embedded(lambda raw: raw["clouds"][2].update(access=access))
