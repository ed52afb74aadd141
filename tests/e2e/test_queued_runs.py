"""Runs that wait in the queue, for real: a DAG run waits deferred and trains once its devices are free, and runs
submitted at once beyond capacity start in the order of the queue."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from dagruns import params_restored

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.scheduler.admission import admit
from crosscloud.scheduler.service import Queue

pytestmark = [pytest.mark.e2e, pytest.mark.queue, pytest.mark.slow]

TINY = {"rounds": 2, "inner_steps": 4, "model_size": "tiny", "global_batch": 8, "seed": 5, "eval_every_steps": 8}


def _hold_beijing(run_id: str) -> None:
    """A run that holds every device of beijing (no sub-task: only its reservation)."""
    admit(load_federation(), JobSpec(clouds=["beijing"], devices_per_cloud=4), run_id, "byte-lm", 0, set(), Ledger())


def test_a_dag_run_waits_deferred_and_trains_once_its_devices_are_free(dagbag, monkeypatch):
    monkeypatch.setenv("CROSSCLOUD_QUEUE_POLL_S", "1")
    _hold_beijing("queue-blocker")
    stop = threading.Event()

    def free_once_it_waits() -> None:  # the blocker ends 5 s after the DAG run is seen waiting in the queue
        while not stop.is_set():
            if any(r.run_id != "queue-blocker" for r in Ledger().queue.rows(("queued",), "team-a")):
                stop.wait(5.0)
                break
            stop.wait(0.2)
        Ledger().release("team-a", "queue-blocker")

    freer = threading.Thread(target=free_once_it_waits, daemon=True)
    freer.start()
    try:
        with params_restored(dagbag.get_dag("cross_cloud_training")) as dag:
            run = dag.test(run_conf={**TINY, "clouds": ["beijing"], "priority": 2})
    finally:
        stop.set()
        freer.join(10)
    assert run.state == "success"
    row = Ledger().queue.get("team-a", run.run_id)
    assert row.state == "done" and row.priority == 2
    assert row.started_at - row.submitted_at >= 4.0  # it waited for the blocker, then started
    assert "starts now" in row.decision and Ledger().active(run_id=run.run_id) == []
    from crosscloud.tracking.mlflow_runs import Tracker  # MLflow says how long it waited and why it started

    client = Tracker().client
    exp = client.get_experiment_by_name("cross_cloud_training")
    [parent] = client.search_runs([exp.experiment_id], f"tags.`crosscloud.run_id` = '{run.run_id}' and "
                                                        "tags.`crosscloud.level` = 'job'")
    assert parent.data.metrics["queue_wait_s"] >= 4.0 and parent.data.params["queue.priority"] == "2"


RUNNER = ("import sys, json; from crosscloud.core.job import JobSpec; from crosscloud.pipeline.stages import run_job; "
          "run_job(JobSpec(**json.loads(sys.argv[2])), sys.argv[1], log=print, compare_baseline=False)")


def test_runs_beyond_capacity_start_in_the_order_they_were_submitted():
    import json

    job = {**TINY, "clouds": ["beijing"], "placement": "auto", "devices": 4}  # each needs the whole of beijing
    _hold_beijing("order-blocker")
    ids = [f"order-{i}" for i in range(3)]
    procs = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        for run_id in ids:  # one after another: each is in the queue before the next is submitted
            procs.append(subprocess.Popen([sys.executable, "-c", RUNNER, run_id, json.dumps(job)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            deadline = time.time() + 120
            while Ledger().queue.get("team-a", run_id) is None and time.time() < deadline:
                time.sleep(0.2)
        positions = [s.position for s in Queue(load_federation(), Ledger()).listing("team-a") if s.row.run_id in ids]
        assert positions == [1, 2, 3]
        Ledger().release("team-a", "order-blocker")
        outputs = [p.communicate(timeout=600)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * 3, outputs
    finally:
        for p in procs:
            p.kill()
    rows = [Ledger().queue.get("team-a", run_id) for run_id in ids]
    assert [r.state for r in rows] == ["done"] * 3
    started = [r.started_at for r in rows]
    assert started == sorted(started)  # the order of the queue: none overtook another
    assert all("queued at position" in out for out in outputs[1:])  # each said where it waited
