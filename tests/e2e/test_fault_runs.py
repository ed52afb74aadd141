"""Real runs on the embedded clouds whose sub-task is killed (and resumes, or is lost), whose watcher is
killed, that see a cloud drained, or whose cloud dies in the middle of its reduce or its publish, and complete.

Processes are killed for real: a cloud's worker (``os.kill`` with SIGKILL), the
watcher running in its own process as the ``sync_checkpoints`` task does, and
a sub-task that kills itself at a failpoint (``CROSSCLOUD_FAILPOINTS``).
Every cloud reduces every round itself: after any of these faults each
cloud's copy of each global must still be the same, digest for digest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from crosscloud.backends import get_backend
from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.keys import RunKeys
from crosscloud.pipeline.stages import admit_stage, aggregate_stage, dispatch_stage, preheat_stage, run_job, sync_stage
from crosscloud.pool.membership import activate, drain
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.store.commit import read_commit, read_object
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]

SPEC = JobSpec(rounds=6, inner_steps=8, model_size="tiny", global_batch=12, seed=3)
# blocking rounds train the same way every time: the loss compared is the fault's alone, not when globals landed
BLOCKING = dataclasses.replace(SPEC, overlap=False)
WATCHER = ("import sys; from crosscloud.pipeline.stages import RunRef, sync_stage; "
           "from crosscloud.pipeline.subtasks import run_handles; "
           "ref = RunRef(*sys.argv[1:4]); sync_stage(ref, run_handles(ref), log=lambda m: None)")


def _home():
    return open_store(load_federation().local_cloud, SPEC.tenant)


def _decided(run_id: str) -> int:
    """Rounds the clouds have decided (their MEMBERS records in the home store), whether a watcher runs or not."""
    home, keys, n = _home(), RunKeys(SPEC.tenant, run_id), 0
    while home.exists(keys.members(n)):
        n += 1
    return n


def _recorded(run_id: str) -> int:
    """Rounds the watcher has recorded in the run's history."""
    home = _home()
    key = RunKeys(SPEC.tenant, run_id).history
    return len(load_history(home, Plan.load(home, SPEC.tenant, run_id))) if home.exists(key) else 0


def _when(ready, action, done: threading.Event) -> threading.Thread:
    """Run ``action`` once ``ready()`` (or never, if the run ends first)."""
    def watch():
        while not done.is_set() and not ready():
            time.sleep(0.02)
        if not done.is_set():
            action()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def _run_with(run_id: str, n: int, action, spec: JobSpec = SPEC, experiment: str | None = None, log=lambda m: None) -> dict:
    """A run with ``action`` done once ``n`` rounds are decided."""
    done = threading.Event()
    watcher = _when(lambda: _decided(run_id) >= n, action, done)
    try:
        return run_job(spec, run_id, experiment=experiment, log=log, compare_baseline=False)
    finally:
        done.set()
        watcher.join()


def _held(run_id: str, cloud: str, until, timeout_s: float = 60.0) -> None:
    """Every worker process of ``cloud`` stopped (SIGSTOP) until ``until()``, then resumed."""
    handle = get_backend("local").find(SPEC.tenant, run_id, cloud)
    held = [p.pid for p in psutil.Process(handle["pid"]).children(recursive=True)]
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout_s
        while not until() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def fault_free() -> dict:
    return run_job(BLOCKING, "faults-clean", log=lambda m: None, compare_baseline=False)


def _killer(run_id: str, cloud: str, killed: list):
    def kill():
        handle = get_backend("local").find(SPEC.tenant, run_id, cloud)
        for worker in psutil.Process(handle["pid"]).children(recursive=True):  # the worker under its wrapper shell
            os.kill(worker.pid, signal.SIGKILL)
            killed.append(worker.pid)
    return kill


def _verify_every_commit(run_id: str) -> int:
    """Read every committed object of the run in every store, each checked against its commit's sha256."""
    fed, keys, checked = load_federation(), RunKeys(SPEC.tenant, run_id), 0
    for cloud in fed.clouds:
        store = open_store(cloud, SPEC.tenant)
        for key in store.list(keys.root):
            if key.endswith("/COMMIT.json"):
                commit = read_commit(store, key.removesuffix("/COMMIT.json"))
                for name in commit["objects"]:
                    read_object(store, commit, name, reads=1)  # raises IntegrityError on any changed byte
                    checked += 1
    return checked


def _globals_agree(run_id: str, history: list[dict], strict: bool = True) -> int:
    """Every cloud of every round made the same global, digest for digest.

    The clouds reduce each round independently from the same committed deltas, so one
    digest everywhere is the proof that each round was applied once, and the same way,
    by every cloud. A cloud's digest of global r + 1 is found in the round's record (those
    the watcher saw), in the report each cloud commits with its next round (kept in round
    r + 1's MEMBERS record), and in its own commit of the global where retention keeps it
    (read back and checked against its sha256). ``strict``: every member's digest of every
    round is found; else at least two per round (a cloud restarted right after saving its
    state reports none for the round before). Returns how many committed globals were read back.
    """
    fed, keys, checked = load_federation(), RunKeys(SPEC.tenant, run_id), 0
    home = open_store(fed.local_cloud, SPEC.tenant)
    stores = {c: open_store(fed.cloud(c), SPEC.tenant) for c in history[0]["clouds"]}
    for record in history:
        r, members = record["round"], set(record["clouds"])
        assert record["digests_agree"], record
        seen = [(c, d, "the record") for c, d in record["digests"].items()]
        if r + 1 < SPEC.rounds:
            later = json.loads(home.get(keys.members(r + 1)))["contributions"]
            seen += [(c, v["meta"]["exchange"]["digest"], "its report") for c, v in later.items()
                     if (v["meta"].get("exchange") or {}).get("digest")]
        for cloud in members:
            commit = read_commit(stores[cloud], keys.global_step(r + 1))
            if commit is None:  # deleted by retention, commit first
                continue
            entry = commit["objects"]["params.safetensors"]
            assert commit["meta"]["digest"] == entry["sha256"], (cloud, r)
            read_object(stores[cloud], commit, "params.safetensors", reads=1)  # the bytes are what the digest says
            seen.append((cloud, entry["sha256"], "its commit"))
            checked += 1
        assert len({d for _, d, _ in seen}) == 1, f"round {r}: the clouds' globals differ: {seen}"
        found = {c for c, _, _ in seen}
        assert found <= members and (found == members if strict or r == SPEC.rounds - 1 else len(found) >= 2), (r, seen)
    for cloud in history[-1]["clouds"]:
        assert read_commit(stores[cloud], keys.global_step(SPEC.rounds + 1)) is None
    return checked


@pytest.mark.program
def test_a_sigkilled_subtask_resumes_from_its_own_state_and_changes_no_committed_object(fault_free):
    run_id, killed, lines = "faults-resume", [], []
    summary = _run_with(run_id, 1, _killer(run_id, "singapore", killed), BLOCKING, log=lines.append)
    assert killed, "no worker process was killed: the fault was not injected"
    history = summary["history"]
    assert len(history) == SPEC.rounds and not any(r["lost"] for r in history)  # never declared lost
    assert any("cloud singapore: sub-task" in line and "starting it again" in line for line in lines), lines
    assert any("[singapore] resuming after round" in line for line in lines), lines
    assert all(r["next_shares"]["singapore"] > 0 for r in history)  # it kept its share
    assert _verify_every_commit(run_id) > 3 * SPEC.rounds
    assert _globals_agree(run_id, history, strict=False) >= 3  # the last global on each cloud at least
    final, clean = summary["metrics"]["final_eval_loss"], fault_free["metrics"]["final_eval_loss"]
    assert abs(final - clean) <= 0.05 * clean, (final, clean)


def test_a_killed_subtask_without_restarts_is_lost_and_the_run_completes_as_well_as_without_the_fault(fault_free):
    from mlflow.tracking import MlflowClient

    run_id, killed = "faults-kill", []
    spec = dataclasses.replace(BLOCKING, subtask_retries=0)
    summary = _run_with(run_id, 1, _killer(run_id, "singapore", killed), spec, experiment="faults")
    assert killed, "no worker process was killed: the fault was not injected"
    history = summary["history"]
    lost = [r["round"] for r in history if "singapore" in r["lost"]]
    assert len(lost) == 1 and "sub-task is failed" in history[lost[0]]["lost"]["singapore"]
    assert len(history) == SPEC.rounds
    for record in history[lost[0]:]:  # its share goes to the other clouds, which cover the whole batch
        assert record["next_shares"]["singapore"] == 0 and sum(record["next_shares"].values()) == SPEC.global_batch
        assert "singapore" not in record["clouds"]
    _globals_agree(run_id, history, strict=False)
    final, clean = summary["metrics"]["final_eval_loss"], fault_free["metrics"]["final_eval_loss"]
    assert abs(final - clean) <= 0.05 * clean, (final, clean)
    client = MlflowClient()
    parent = client.search_runs([client.get_experiment_by_name("faults").experiment_id],
                                f"tags.`crosscloud.run_id` = '{run_id}' and tags.`crosscloud.level` = 'job'")[0]
    assert parent.data.tags["crosscloud.lost.singapore"].startswith(f"round {lost[0]}: sub-task is failed")
    counted = sorted((m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "clouds_lost"))
    assert counted == [(r["round"], 1.0 if r["round"] == lost[0] else 0.0) for r in history]


def test_a_killed_watcher_leaves_training_alone_and_the_restarted_one_records_every_round_exactly_once():
    ref = admit_stage(SPEC, "faults-watcher")
    preheat_stage(ref)
    fed, plan = ref.load()
    handles = [dispatch_stage(ref, c.name) for c in plan.clouds]
    first = subprocess.Popen([sys.executable, "-c", WATCHER, ref.federation_path, ref.tenant, ref.run_id])
    killed, done, at = threading.Event(), threading.Event(), {}

    def kill_watcher():
        def kill() -> bool:  # once it has recorded a round (it watches for real; 4 s at most: under the patience)
            deadline = time.monotonic() + 4.0
            while _recorded(ref.run_id) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            at["killed"], at["recorded"] = time.time(), _recorded(ref.run_id)
            killed.set()
            return True

        _held(ref.run_id, "beijing", kill)  # beijing held: no round past its last commit is decided until then

    injector = _when(lambda: _decided(ref.run_id) >= 2, kill_watcher, done)
    try:
        first.wait(timeout=600)
    finally:
        done.set()
        injector.join()
    assert killed.is_set() and first.returncode == -signal.SIGKILL, "the watcher was not killed mid-run"
    # rounds go on with no watcher: the clouds decide, reduce and commit them; started again before the last
    deadline = time.monotonic() + 120
    while _decided(ref.run_id) < min(at["recorded"] + plan.spec.keep_rounds + 1, SPEC.rounds - 1):
        assert time.monotonic() < deadline, f"no round decided without a watcher ({_decided(ref.run_id)} decided)"
        time.sleep(0.02)
    restarted_at, lines = time.time(), []
    assert _recorded(ref.run_id) == at["recorded"] < SPEC.rounds  # nothing recorded them meanwhile
    sync_stage(ref, handles, log=lines.append)  # the retried task
    summary = aggregate_stage(ref, handles, compare_baseline=False)
    home = open_store(fed.local_cloud, SPEC.tenant)
    history = load_history(home, plan)
    assert [r["round"] for r in history] == list(range(SPEC.rounds)) == [r["round"] for r in summary["history"]]
    members = [json.loads(home.get(plan.keys.members(r))) for r in range(SPEC.rounds)]
    unwatched = [m["round"] for m in members if at["killed"] < m["decided_at"] < restarted_at]
    assert unwatched, "every round was decided while a watcher ran"
    # training never noticed: no sub-task ended, restarted or lost, every cloud in every round
    assert not any(line.startswith("cloud ") for line in lines), lines  # "cloud x: sub-task ...; starting it again" or "lost"
    assert all(sorted(r["clouds"]) == sorted(c.name for c in plan.clouds) and not r["lost"] for r in history)
    assert _globals_agree(ref.run_id, history) >= len(plan.clouds)


def test_a_cloud_drained_mid_run_hands_its_share_to_the_others():
    fed, run_id = load_federation(), "faults-drain"

    def drain_it():  # beijing held until the watcher has noted it: the clouds' next decision sees it
        drain(fed, "singapore")
        home, key = _home(), RunKeys(SPEC.tenant, run_id).watch
        _held(run_id, "beijing", lambda: home.exists(key) and "singapore" in json.loads(home.get(key)).get("draining", []))

    try:
        summary = _run_with(run_id, 1, drain_it)
    finally:
        activate(fed, "singapore")
    history = summary["history"]
    assert len(history) == SPEC.rounds
    moved = [r["round"] for r in history if r["next_shares"]["singapore"] == 0]
    assert moved and moved == list(range(moved[0], SPEC.rounds))  # from one round on, for the rest of the run
    assert all(sum(history[r]["next_shares"].values()) == SPEC.global_batch for r in moved)
    home = open_store(fed.local_cloud, SPEC.tenant)
    plan = Plan.load(home, SPEC.tenant, run_id)
    idle = [r["round"] for r in load_history(home, plan) if not r["clouds"]["singapore"]["step_s"]]
    assert idle and idle[-1] == SPEC.rounds - 1  # its sub-task idled once the share arrived, to the end
    _globals_agree(run_id, history)


@pytest.mark.parametrize("point", ["reduce", "publish"])
def test_a_cloud_killed_in_the_middle_of_its_exchange_resumes_and_every_cloud_makes_the_same_globals(
        fault_free, point, monkeypatch, tmp_path):
    run_id, lines, r = f"faults-{point}", [], 2
    monkeypatch.setenv("CROSSCLOUD_FAILPOINTS", f"singapore:{point}:{r}")  # the sub-tasks inherit it
    monkeypatch.setenv("CROSSCLOUD_SPOOL", str(tmp_path))  # a spool of this test's own: no marker of an earlier session
    summary = run_job(BLOCKING, run_id, log=lines.append, compare_baseline=False)
    assert (tmp_path / SPEC.tenant / run_id / "singapore" / f"failpoint-{point}-{r}").exists(), "the failpoint never fired"
    assert any(f"[singapore] failpoint: cloud singapore killed at {point} of round {r}" in line for line in lines), lines
    assert any("cloud singapore: sub-task" in line and "starting it again" in line for line in lines), lines
    assert any("[singapore] resuming after round" in line for line in lines), lines
    history = summary["history"]
    assert [x["round"] for x in history] == list(range(SPEC.rounds)) and not any(x["lost"] for x in history)
    assert all(x["next_shares"]["singapore"] > 0 for x in history)  # it kept its share
    assert _globals_agree(run_id, history) >= 3
    _verify_every_commit(run_id)
    final, clean = summary["metrics"]["final_eval_loss"], fault_free["metrics"]["final_eval_loss"]
    assert abs(final - clean) <= 0.05 * clean, (final, clean)
