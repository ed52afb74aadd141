"""The local access method: start returns at once; state, logs and stop work on real processes."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from crosscloud.backends import SubTaskError, SubTaskSpec, get_backend


def _spec(run_id: str, module: str, args: list[str]) -> SubTaskSpec:
    return SubTaskSpec(tenant="t", run_id=run_id, cloud="c1", image="local", accelerator="cpu", devices=1,
                       module=module, args=args)


def _wait(backend, handle, timeout=30):
    deadline = time.time() + timeout
    while backend.state(handle) == "running" and time.time() < deadline:
        time.sleep(0.05)
    return backend.state(handle)


def test_finished_subtask_reports_success_and_its_output():
    backend = get_backend("local")
    handle = backend.start(_spec("ok", "timeit", ["-n", "1", "-r", "1", "print('hello from the cloud')"]))
    assert _wait(backend, handle) == "succeeded"
    text, offset = backend.logs(handle)
    assert "hello from the cloud" in text
    assert backend.logs(handle, offset) == ("", offset)


def test_failing_subtask_reports_failure():
    backend = get_backend("local")
    handle = backend.start(_spec("bad", "crosscloud.training.join_probe", []))  # exits 2: its arguments are missing
    assert _wait(backend, handle) == "failed"
    assert "the following arguments are required" in backend.logs(handle)[0]


def test_stop_ends_the_whole_process_group_and_retry_does_not_duplicate():
    backend = get_backend("local")
    spec = _spec("long", "timeit", ["-n", "1000000000", "pass"])
    handle = backend.start(spec)
    assert backend.state(handle) == "running"
    assert backend.start(spec)["pid"] == handle["pid"]  # a retried dispatch finds the running one
    assert backend.used_devices()["c1"]["cpu"] == 1
    backend.stop(handle)
    assert backend.state(handle) in ("failed", "lost")
    assert "c1" not in backend.used_devices()
    assert backend.find("t", "long", "c1")["pid"] == handle["pid"]


def test_unknown_access_method_is_named():
    with pytest.raises(SubTaskError, match="no engine backend for access method 'carrier-pigeon'"):
        get_backend("carrier-pigeon")


def test_a_missing_worker_environment_is_refused_before_starting():
    with pytest.raises(SubTaskError, match="lacks 'no_such_module_here'"):
        get_backend("local").start(_spec("env", "no_such_module_here", []))


def test_a_clock_step_does_not_make_a_running_subtask_lost(monkeypatch):
    """NTP or a VM resumed from a snapshot steps the wall clock; a running sub-task must stay running."""
    backend = get_backend("local")
    handle = backend.start(_spec("clock", "timeit", ["-n", "1000000000", "pass"]))
    try:
        real_boot_time = psutil._psplatform.boot_time  # what psutil derives every wall-clock create time from
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real_boot_time() + 3600.0)
        assert backend.state(handle) == "running"
        assert backend.used_devices()["c1"]["cpu"] == 1
    finally:
        monkeypatch.undo()
        backend.stop(handle)


def test_another_process_under_the_same_pid_is_not_the_subtask():
    backend = get_backend("local")
    handle = backend.start(_spec("reused", "timeit", ["-n", "1000000000", "pass"]))
    try:
        assert backend.state(handle) == "running"
        reused = {**handle, "started_since_boot": handle["started_since_boot"] - 5.0}  # the pid's earlier owner
        assert backend.state(reused) == "lost"
        assert backend.exit_code(reused) is None
    finally:
        backend.stop(handle)


def test_a_subtask_ending_while_its_state_is_read_is_not_lost(monkeypatch):
    backend = get_backend("local")
    handle = backend.start(_spec("ending", "timeit", ["-n", "1", "-r", "1", "pass"]))
    assert _wait(backend, handle) == "succeeded"
    rc = Path(handle["rc"])
    code = rc.read_text()
    rc.unlink()

    def ends_now(_handle):  # the sub-task writes its rc and exits between the two looks
        rc.write_text(code)

    monkeypatch.setattr(backend, "_process", ends_now)
    assert backend.state(handle) == "succeeded"
