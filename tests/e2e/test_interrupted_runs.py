"""A run stopped from outside gives everything back: an interrupted runner at once, a dead one when its lease lapses.

A dead runner's sub-tasks stop themselves too: they read the lease's heartbeat in their cloud's store
(``crosscloud.run.heartbeat``) and stop after a committed round once it lapsed past the grace.

The runner is ``run_job`` in its own process, as ``make bench-gap`` and
``crosscloud train`` run it. Ctrl-C (SIGINT) or ``timeout`` (SIGTERM) must
stop its sub-tasks and release its devices before it exits. SIGKILL leaves
nothing a chance to clean up: the reservation is a lease, and once the runner
stops renewing it the ledger gives the devices back and records why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from crosscloud.backends import get_backend
from crosscloud.core.paths import state_dir
from crosscloud.ledger import Ledger

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]

TENANT = "team-a"
# Ctrl-C's default meaning even where the test itself runs with SIGINT ignored (a background job of a
# non-interactive shell, as a CI runner may start it), which a child would otherwise inherit
RUNNER = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from crosscloud.core.job import JobSpec; from crosscloud.pipeline.stages import run_job; "
          "run_job(JobSpec(rounds=200, inner_steps=8, model_size='tiny', global_batch=12, seed=11), sys.argv[1], "
          "log=lambda m: None, compare_baseline=False)")


def _handles(run_id: str) -> list[dict]:
    folder = state_dir() / "subtasks" / TENANT / run_id
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/handle.json"))]


def _start_runner(run_id: str, env: dict[str, str] | None = None, timeout_s: float = 180) -> subprocess.Popen:
    """A runner whose sub-tasks all train: every planned cloud's handle is there and running."""
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, run_id], env={**os.environ, **(env or {})})
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        handles = _handles(run_id)
        reserved = {r.cloud for r in Ledger().active(TENANT, run_id)}
        if reserved and len(handles) == len(reserved) and all(
                get_backend(h["backend"]).state(h) == "running" for h in handles):
            return proc
        assert proc.poll() is None, f"the runner exited with {proc.returncode} before its sub-tasks started"
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"run {run_id}: its sub-tasks did not start within {timeout_s} s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_runner_stops_its_subtasks_and_gives_its_devices_back(sig):
    run_id = f"interrupted-{sig.name.lower()}"
    proc = _start_runner(run_id)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) != 0
    assert Ledger().active(TENANT, run_id) == []
    assert [h["cloud"] for h in _handles(run_id) if get_backend(h["backend"]).state(h) == "running"] == []
    assert any(e.run_id == run_id for e in Ledger().events(run_id=run_id))


@pytest.mark.soak  # the lease that sub-tasks obey
def test_a_killed_runner_gives_its_devices_back_once_its_lease_lapses_and_its_subtasks_stop():
    run_id, lease_s, grace_s = "killed-runner", 6.0, 2.0
    proc = _start_runner(run_id, env={"CROSSCLOUD_LEASE_S": str(lease_s), "CROSSCLOUD_LEASE_GRACE_S": str(grace_s)})
    try:
        held = Ledger().active(TENANT, run_id)
        assert held
        proc.kill()  # nothing of the runner runs any more: no teardown, no renewal
        proc.wait()
        time.sleep(lease_s / 2)
        assert Ledger().active(TENANT, run_id) == held  # a lease that has not lapsed is kept
        deadline = time.time() + 4 * lease_s
        while Ledger().active(TENANT, run_id) and time.time() < deadline:
            time.sleep(0.5)
        assert Ledger().active(TENANT, run_id) == []
        lapsed = Ledger().reap()  # what a next admission does first: record the lapsed leases as released
        assert {r.cloud for r in lapsed if r.run_id == run_id} == {r.cloud for r in held}
        events = Ledger().events(run_id=run_id)
        assert events and all("lapsed" in e.detail for e in events)
        # the sub-tasks read the heartbeat the runner wrote and stop themselves after a committed round: the devices
        # the ledger gave back are not trained on for long (the grace, a heartbeat read, a round)
        handles, deadline = _handles(run_id), time.time() + 120
        while any(get_backend(h["backend"]).state(h) == "running" for h in handles) and time.time() < deadline:
            time.sleep(0.5)
        for handle in handles:
            backend = get_backend(handle["backend"])
            assert backend.state(handle) != "running", f"{handle['cloud']}'s sub-task trains on past its lease"
            assert "its lease lapsed" in backend.logs(handle)[0]
    finally:
        for handle in _handles(run_id):  # the sub-tasks of a killed runner: the next test must find the devices free
            get_backend(handle["backend"]).stop(handle)
