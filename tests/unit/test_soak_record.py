"""The soak's recorder (bench/soak_record.py) on local stores and real processes: what it writes to the history."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from federations import embedded
from soak_record import Recorder, _nproc, find_subtasks, held_until, subtask_roots

from crosscloud.core.job import JobSpec
from crosscloud.core.keys import RunKeys
from crosscloud.core.presets import preset
from crosscloud.run.plan import CloudAssignment, Plan, ProgramRef
from crosscloud.soak import (
    FinalLoss,
    GlobalCommitted,
    History,
    ObjectCommitted,
    ObjectObserved,
    ObjectRetired,
    ReservationHeld,
    RoundSpent,
    RunEnded,
    RunSubmitted,
    SubtaskLived,
    check,
    read_history,
)
from crosscloud.store.base import StoreError
from crosscloud.store.chunks import BlobRef
from crosscloud.store.commit import write_step

pytestmark = pytest.mark.soak

TENANT = "team-a"
SLEEPER = [sys.executable, "-m", "timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"]  # python -m, asleep


def _federation(tmp_path):
    """The embedded federation with every cloud behind ssh (a workdir under ``tmp_path``) and a store of its own."""
    def mutate(raw: dict) -> None:
        for cloud in raw["clouds"]:
            name = cloud["name"]
            cloud["store"] = {"url": f"file://{tmp_path / 'stores' / name}"}
            cloud["access"] = {"method": "ssh", "host": "127.0.0.1", "workdir": str(tmp_path / "hosts" / name),
                               "python": sys.executable}
    return embedded(mutate)


def _recorder(tmp_path, ledger, **kw) -> Recorder:
    url = ledger.url.render_as_string(hide_password=False)
    return Recorder(History(tmp_path / "soak.jsonl"), _federation(tmp_path), TENANT, url, lease_s=30.0, **kw)


def _of(tmp_path, cls) -> list:
    return [e for e in read_history(tmp_path / "soak.jsonl") if isinstance(e, cls)]


def _plan(run_id: str) -> Plan:
    spec = JobSpec(seed=3, round_timeout_s=20)
    return Plan(tenant=TENANT, run_id=run_id, federation="f", federation_path="", job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud="beijing",
                clouds=[CloudAssignment(name=c, role="x", method="ssh", accelerator="cpu", devices=n, throughput=1.0,
                                        share=4, shards=[], image="") for c, n in (("beijing", 2), ("shanghai", 1))],
                candidates=[], dataset="python-stdlib", shards=[], held_out=[], init=None,
                program=ProgramRef(name="p.py", file="p.py", code=BlobRef(sha256="1" * 64, size=1), family="byte-lm"),
                created_at=time.time())


def _run_records(home, run: str) -> None:
    """A run that kept 2 rounds (shanghai's work of round 1 refused), with its digests and summary."""
    keys = RunKeys(TENANT, run)
    _plan(run).save(home)
    clouds = {"beijing": {}, "shanghai": {}}
    history = [{"round": 0, "published_at": 110.0, "wall_s": 10.0, "clouds": clouds, "lost": {}, "refused": {},
                "digests": {"beijing": "r0", "shanghai": "m0"}},
               {"round": 1, "published_at": 130.0, "wall_s": 20.0, "clouds": clouds, "lost": {},
                "refused": {"shanghai": "norm"}, "digests": {"beijing": "r1", "shanghai": "r1-other"}}]
    history.append(history[1])  # recorded twice: spent once
    home.put(keys.history, json.dumps(history).encode())
    later = {"contributions": {"beijing": {"meta": {"exchange": {"digest": "m0"}}}}}  # round 1's: global 1 of beijing
    home.put(keys.members(1), json.dumps(later).encode())
    home.put(keys.summary, json.dumps({"metrics": {"final_eval_loss": 2.5}}).encode())


def test_commits_retirements_observations_reservations_and_rounds(tmp_path, ledger):
    rec = _recorder(tmp_path, ledger)
    home, other = rec.stores["beijing"], rec.stores["shanghai"]
    run = f"rec-{time.time_ns()}"
    keys = RunKeys(TENANT, run)
    delta = write_step(home, keys.cloud_step("beijing", 0), {"delta": b"d0"})["objects"]["delta"]
    write_step(home, keys.global_step(1), {"params": b"g1"}, refs={"delta": delta})  # refers to another step's
    write_step(other, keys.global_step(1), {"params": b"g1"}, meta={"digest": "s0"})
    assert rec.scan_commits() == []
    assert len(_of(tmp_path, ObjectCommitted)) == 6  # 3 commits and 3 objects, the one referred to once
    home.delete(f"{keys.cloud_step('beijing', 0)}/COMMIT.json")  # retention: the commit first
    for key in (f"{keys.global_step(1)}/COMMIT.json", f"{keys.global_step(1)}/params"):
        other.delete(key)
    rec.scan_commits()
    retired = {(e.store, e.key) for e in _of(tmp_path, ObjectRetired)}
    assert retired == {("beijing", f"{keys.cloud_step('beijing', 0)}/COMMIT.json"),  # its delta is still vouched for
                       ("shanghai", f"{keys.global_step(1)}/COMMIT.json"), ("shanghai", f"{keys.global_step(1)}/params")}
    home.put(f"{keys.global_step(1)}/params", b"g2")  # damage at rest
    write_step(home, keys.cloud_step("beijing", 1), {"delta": b"d1"})
    home.delete(f"{keys.cloud_step('beijing', 1)}/delta")  # lost after the last scan, its commit still there
    write_step(home, keys.cloud_step("beijing", 2), {"delta": b"d2"})
    rec.scan_commits()
    for key in (f"{keys.cloud_step('beijing', 2)}/COMMIT.json", f"{keys.cloud_step('beijing', 2)}/delta"):
        home.delete(key)  # retention after the last scan: retired at the end, not lost
    _run_records(home, run)
    capacity = rec.fed.capacity()
    ledger.admit(TENANT, run, lambda usage: [("beijing", "cpu", 2)], capacity, {"beijing": 4}, lease_s=30)
    ledger.release(TENANT, run)

    assert rec.finish({run: "job-a"}) == []
    observed = {e.key: e.sha256 for e in _of(tmp_path, ObjectObserved)}
    assert observed[f"{keys.cloud_step('beijing', 1)}/delta"] is None and observed[delta["key"]] == delta["sha256"]
    assert f"{keys.cloud_step('beijing', 2)}/delta" not in observed
    assert ("beijing", f"{keys.cloud_step('beijing', 2)}/delta") in {(e.store, e.key) for e in _of(tmp_path, ObjectRetired)}
    [held] = _of(tmp_path, ReservationHeld)
    assert (held.run, held.cloud, held.devices, held.lease_s) == (run, "beijing", 2, 30.0) and held.end >= held.start
    spent = [(e.round, e.cloud, e.devices, e.start, e.end, e.kept) for e in _of(tmp_path, RoundSpent)]
    assert spent == [(0, "beijing", 2, 100.0, 110.0, True), (0, "shanghai", 1, 100.0, 110.0, True),
                     (1, "beijing", 2, 110.0, 130.0, True), (1, "shanghai", 1, 110.0, 130.0, False)]
    digests = {(e.round, e.cloud): e.digest for e in _of(tmp_path, GlobalCommitted)}
    assert digests == {(0, "beijing"): "m0", (0, "shanghai"): "m0", (1, "beijing"): "r1", (1, "shanghai"): "r1-other"}
    assert [(e.run, e.job, e.loss) for e in _of(tmp_path, FinalLoss)] == [(run, "job-a", 2.5)]
    # the checker finds what the recorder saw: the damaged global, the lost delta, the two digests of round 1
    with History(tmp_path / "soak.jsonl") as h:
        h.append(RunSubmitted(t=1.0, run=run, tenant=TENANT, job="job-a"))
        h.append(RunEnded(t=time.time(), run=run, state="failed", reason="planted"))
    found = {(v.invariant, v.subject) for v in check(read_history(tmp_path / "soak.jsonl"), grace_s=10).violations}
    assert found == {("committed_unchanged", f"beijing/{keys.global_step(1)}/params"),
                     ("committed_unchanged", f"beijing/{keys.cloud_step('beijing', 1)}/delta"),
                     ("globals_agree", f"{run} round 1")}


def test_a_store_in_an_outage_skips_its_scan_and_the_thread_goes_on(tmp_path, ledger, monkeypatch):
    logged = []
    rec = _recorder(tmp_path, ledger, interval_s=0.05, commit_scan_s=0.05, log=logged.append)

    def refuse(prefix):
        raise StoreError("cloud shanghai: 503 Slow Down")

    monkeypatch.setattr(rec.stores["shanghai"], "list", refuse)
    write_step(rec.stores["beijing"], RunKeys(TENANT, "r1").cloud_step("beijing", 0), {"delta": b"d0"})
    rec.start()
    try:
        deadline = time.time() + 5
        while len([line for line in logged if "shanghai" in line]) < 2 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        rec.stop()
    assert len([line for line in logged if "scan of shanghai skipped" in line]) >= 2  # scanned again after the error
    assert {e.store for e in _of(tmp_path, ObjectCommitted)} == {"beijing"}


def test_subtasks_are_found_by_their_folder_and_written_when_they_end(tmp_path, ledger):
    rec = _recorder(tmp_path, ledger, interval_s=0.05, commit_scan_s=60)
    assert len(subtask_roots(rec.fed)) == 3
    folders = {c: tmp_path / "hosts" / c / "subtasks" / TENANT / "run-1" / c for c in ("beijing", "shanghai")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    (folders["beijing"] / "handle.json").write_text(json.dumps({"cloud": "beijing", "devices": 3}))
    other = tmp_path / "hosts" / "beijing" / "subtasks" / "team-b" / "run-2" / "beijing"  # another tenant's
    shell = tmp_path / "hosts" / "beijing" / "subtasks" / TENANT / "run-3" / "beijing"  # no python -m: no sub-task
    for folder in (other, shell):
        folder.mkdir(parents=True)
    procs = [subprocess.Popen(SLEEPER, cwd=folders["beijing"]), subprocess.Popen(SLEEPER, cwd=folders["beijing"]),
             subprocess.Popen(SLEEPER, cwd=folders["shanghai"]), subprocess.Popen(SLEEPER, cwd=other),
             subprocess.Popen(["sleep", "60"], cwd=shell)]
    try:
        found = find_subtasks(rec.roots, TENANT)
        assert set(found) == {("run-1", "beijing"), ("run-1", "shanghai")}
        assert len(found[("run-1", "beijing")].procs) == 2  # two processes, one sub-task
        rec.start()
        deadline = time.time() + 5
        while len(rec.lives) < 2 and time.time() < deadline:
            time.sleep(0.05)
        procs[2].kill()
        procs[2].wait()
        while not _of(tmp_path, SubtaskLived) and time.time() < deadline:
            time.sleep(0.05)
        rec.stop()
        assert rec.finish({}) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lived = {e.cloud: e for e in _of(tmp_path, SubtaskLived)}
    assert set(lived) == {"beijing", "shanghai"} and all(e.run == "run-1" for e in lived.values())
    assert lived["shanghai"].end is not None and lived["shanghai"].devices == 1
    assert lived["beijing"].end is None and lived["beijing"].devices == 3  # still alive at the end: from its handle
    assert lived["shanghai"].start <= lived["shanghai"].end < time.time()


def test_torchrun_devices_and_when_a_reservation_stopped_holding():
    assert _nproc(["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "w"]) == 4
    assert _nproc(["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "w"]) == 2
    assert _nproc(["python", "-m", "crosscloud.training.worker"]) == 0
    assert held_until(50.0, 200.0, now=100.0) == 50.0  # released under a live lease
    assert held_until(None, 80.0, now=100.0) == 80.0  # lapsed, not reaped yet
    assert held_until(150.0, 80.0, now=200.0) == 80.0  # reaped long after its lease lapsed
    assert held_until(None, 180.0, now=100.0) is None  # still held
