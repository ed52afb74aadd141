"""The DAG ``cross_cloud_training`` with one of the three clouds reached over SSH, training for real.

singapore is a "bare-metal" cloud: its sub-task is started by ``dispatch_ssh``
through a real sshd on 127.0.0.1 (key authentication, host key pinned in the
Airflow Connection), in the prepared environment named by the federation.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.keys import RunKeys
from crosscloud.store.commit import read_commit
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.ssh, pytest.mark.slow]

CONF = {"rounds": 2, "inner_steps": 8, "model_size": "tiny", "global_batch": 12, "seed": 5}


@pytest.fixture(scope="module")
def ssh_federation(ssh_server, state_dir, tmp_path_factory):
    from federations import embedded_file

    workdir = tmp_path_factory.mktemp("bare-metal-host")

    def over_ssh(raw: dict) -> None:
        singapore = next(c for c in raw["clouds"] if c["name"] == "singapore")
        singapore["access"] = {"method": "ssh", "connection_id": "ssh_singapore", "workdir": str(workdir),
                               "python": sys.executable,
                               # the host's environment: its stores' folder and the data, as a prepared host would hold them
                               "env": {"CROSSCLOUD_STATE_DIR": str(state_dir), "OMP_NUM_THREADS": "1",
                                       "CROSSCLOUD_DATA_DIR": os.environ["CROSSCLOUD_DATA_DIR"]}}

    path = embedded_file(tmp_path_factory.mktemp("sshfed") / "federation.yaml", over_ssh)
    conn = {"conn_type": "ssh", "host": "127.0.0.1", "port": ssh_server.port, "login": ssh_server.user,
            "extra": {"key_file": str(ssh_server.key_file), "host_key": ssh_server.host_key}}
    env = {"CROSSCLOUD_FEDERATION": str(path), "AIRFLOW_CONN_SSH_SINGAPORE": json.dumps(conn)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield path, workdir
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_training_run_with_one_cloud_over_ssh(ssh_federation, dagbag, capfd):
    path, workdir = ssh_federation
    run = dagbag.get_dag("cross_cloud_training").test(run_conf=CONF)
    assert run.state == "success"
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert sorted(i for (t, i), s in states.items() if t == "dispatch_ssh" and s == "success") == [0]
    assert sum(1 for (t, _), s in states.items() if t == "dispatch_local" and s == "success") == 2
    assert states[("dispatch_kubernetes", -1)] == "skipped"
    fed = load_federation(path)
    keys = RunKeys("team-a", run.run_id)
    for cloud in fed.clouds:
        for r in range(CONF["rounds"] + 1):
            assert read_commit(open_store(cloud, "team-a"), keys.global_step(r)) is not None, f"{cloud.name} lacks global {r}"
    summary = json.loads(open_store(fed.local_cloud, "team-a").get(keys.summary))
    assert summary["metrics"]["final_eval_loss"] < summary["metrics"]["eval_loss_start"]
    assert summary["clouds"]["singapore"]["compute_s"] > 0
    # the sub-task ran on the "host" under sshd: its files are in the host's workdir, it exited 0,
    # and its output was streamed back into the coordinator's log
    folder = workdir / "subtasks" / "team-a" / run.run_id / "singapore"
    handle = json.loads((folder / "handle.json").read_text())
    assert handle["backend"] == "ssh" and (folder / "rc").read_text().strip() == "0"
    assert (folder / "federation.yaml").exists() and not (folder / "env").exists()
    out = capfd.readouterr().out
    assert "[singapore]" in out
