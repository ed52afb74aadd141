"""Serving on a cloud reached over SSH: the fleet starts, finds, routes to and stops a replica on the cloud's host.

shanghai is a "bare-metal" cloud behind a real sshd on 127.0.0.1 (key
authentication, host key pinned). Its replica is started there in the host's
prepared environment, on a port free on the host, and reads the model from
shanghai's store with the tenant's keys; the router reaches it at the address
SSH reached. beijing stays a local cloud, so one fleet serves from both.
"""

from __future__ import annotations

import os
import sys

import pytest
from federations import embedded_file
from servingload import Load, phase

from crosscloud.artifacts.preheat import TransferReport, fetch
from crosscloud.core.federation import load_federation
from crosscloud.serving.fleet import Fleet
from crosscloud.serving.replica import ReplicaError, ServeSpec, find, running, start, stop, wait_ready
from crosscloud.store.chunks import put_blob
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import to_bytes
from crosscloud.training.program import load_program, program_source
from crosscloud.training.session import parameters

pytestmark = [pytest.mark.inference, pytest.mark.ssh]

TENANT = "team-a"
PROGRAM = "examples/byte_lm/train.py"
ARGS = {"seed": 27, "model_size": "tiny"}


@pytest.fixture(scope="module")
def ssh_cloud(ssh_server, state_dir, tmp_path_factory):
    """The federation with shanghai over SSH (its host's environment: this machine's state folder and venv)."""
    workdir = tmp_path_factory.mktemp("serving-host")

    def over_ssh(raw: dict) -> None:
        shanghai = next(c for c in raw["clouds"] if c["name"] == "shanghai")
        shanghai["access"] = {"method": "ssh", "host": "127.0.0.1", "port": ssh_server.port, "user": ssh_server.user,
                              "workdir": str(workdir), "python": sys.executable,
                              "env": {"CROSSCLOUD_STATE_DIR": str(state_dir), "OMP_NUM_THREADS": "1"}}

    path = embedded_file(tmp_path_factory.mktemp("servefed") / "federation.yaml", over_ssh)
    env = {"CROSSCLOUD_SHANGHAI_SSH_KEY_FILE": str(ssh_server.key_file),
           "CROSSCLOUD_SHANGHAI_SSH_KNOWN_HOSTS": str(ssh_server.known_hosts)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield path, workdir
    for k, v in old.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def spec(ssh_cloud) -> ServeSpec:
    """The tiny model stored in beijing, preheated to shanghai only."""
    path, _ = ssh_cloud
    fed = load_federation(path)
    module = load_program(program_source(PROGRAM), PROGRAM)
    weights = to_bytes({n: p.detach() for n, p in parameters(module.build_model(ARGS)).items()})
    home = open_store(fed.cloud("beijing"), TENANT)
    ref, _ = put_blob(home, TENANT, weights, kind="model")
    fetch(open_store(fed.cloud("shanghai"), TENANT), [home], TENANT, ref, TransferReport())
    return ServeSpec(tenant=TENANT, name="byte-lm-ssh", model=ref.text, program=PROGRAM, args=ARGS,
                     federation=str(path))


def test_the_fleet_serves_from_a_replica_on_an_ssh_cloud_and_takes_it_down_without_a_failed_request(
        ssh_cloud, spec, tmp_path):
    path, workdir = ssh_cloud
    fleet = Fleet(TENANT, spec.name, root=tmp_path)
    try:
        done = fleet.apply(spec, {"beijing": 1, "shanghai": 1}, {"beijing": 1, "shanghai": 1})
        with Load(done["router"]) as load:
            both = phase(load, 1.5)
            replicas = {r.cloud: r for r in Fleet(TENANT, spec.name, root=tmp_path).replicas()}  # as another task finds them
            fleet.apply(spec, {"beijing": 1}, {"beijing": 1})
            after = phase(load, 0.5)
        assert load.failures() == [], load.failures()[:5]
    finally:
        fleet.stop()
    remote = replicas["shanghai"].handle
    assert sorted(done["started"]) == ["beijing-0", "shanghai-0"] and remote["backend"] == "ssh"
    assert remote["url"].startswith("http://127.0.0.1:") and remote["folder"].startswith(str(workdir))
    assert both.get("shanghai", 0) > 0 and both.get("beijing", 0) > 0, both  # the router reached the host's replica
    assert "shanghai" not in after, after
    assert not running(remote), "the replica on the host outlived its take-down"
    assert not (workdir / "subtasks" / TENANT / "serve-byte-lm-ssh-r0" / "shanghai" / "env").exists()  # keys read, gone


def test_a_replica_on_an_ssh_cloud_where_the_model_is_cold_refuses_with_the_hosts_own_log(ssh_cloud, spec):
    path, _ = ssh_cloud
    singapore = load_federation(path).cloud("singapore")  # local, and cold: a control for the message
    cold = load_federation(path).cloud("shanghai")
    other = ServeSpec(**{**spec.__dict__, "name": "cold-over-ssh", "model": "ab" * 32 + ":1000"})
    handle = start(other, cold)
    try:
        with pytest.raises(ReplicaError, match="not warm|no artifact"):
            wait_ready(handle, timeout_s=60)
    finally:
        stop(handle)
    assert find(other, cold)["backend"] == "ssh" and find(other, singapore) is None
