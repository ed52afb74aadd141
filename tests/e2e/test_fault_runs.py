"""Real runs on the embedded clouds whose sub-task is killed (and resumes, or is lost), whose coordinator
is killed, or that see a cloud drained, and complete.

Processes are killed for real (``os.kill`` with SIGKILL): a cloud's worker, and
a coordinator running in its own process as the ``sync_checkpoints`` task does.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

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
from crosscloud.training.checkpoint import quantized_global
from crosscloud.training.compression import ErrorFeedback
from crosscloud.training.coordinator import load_global, load_residual, outer_config
from crosscloud.training.outer import outer_step, weighted_mean
from crosscloud.training.screening import screen

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]

SPEC = JobSpec(rounds=6, inner_steps=8, model_size="tiny", global_batch=12, seed=3)
# blocking rounds train the same way every time: the loss compared is the fault's alone, not when globals landed
BLOCKING = dataclasses.replace(SPEC, overlap=False)
COORDINATOR = "import sys; from crosscloud.pipeline.stages import RunRef, run_handles, sync_stage; " \
              "ref = RunRef(*sys.argv[1:4]); sync_stage(ref, run_handles(ref), log=lambda m: None)"


def _rounds_done(run_id: str) -> int:
    home = open_store(load_federation().local_cloud, SPEC.tenant)
    key = f"{RunKeys(SPEC.tenant, run_id).root}/history.json"
    return len(load_history(home, Plan.load(home, SPEC.tenant, run_id))) if home.exists(key) else 0


def _when_rounds_done(run_id: str, n: int, action, done: threading.Event) -> threading.Thread:
    """Run ``action`` once ``n`` rounds of the run are committed (or never, if the run ends first)."""
    def watch():
        while not done.is_set() and _rounds_done(run_id) < n:
            time.sleep(0.1)
        if not done.is_set():
            action()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def _run_with(run_id: str, n: int, action, spec: JobSpec = SPEC, experiment: str | None = None, log=lambda m: None) -> dict:
    done = threading.Event()
    watcher = _when_rounds_done(run_id, n, action, done)
    try:
        return run_job(spec, run_id, experiment=experiment, log=log, compare_baseline=False)
    finally:
        done.set()
        watcher.join()


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


@pytest.mark.program
def test_a_sigkilled_subtask_resumes_from_its_own_state_and_changes_no_committed_object(fault_free):
    run_id, killed, lines = "faults-resume", [], []
    summary = _run_with(run_id, 1, _killer(run_id, "singapore", killed), BLOCKING, log=lines.append)
    assert killed, "no worker process was killed: the fault was not injected"
    history = summary["history"]
    assert len(history) == SPEC.rounds and not any(r["lost"] for r in history)  # never declared lost
    assert any("cloud singapore: sub-task failed" in line and "starting it again" in line for line in lines), lines
    assert any("[singapore] resuming after round" in line for line in lines), lines
    assert all(r["next_shares"]["singapore"] > 0 for r in history)  # it kept its share
    assert _verify_every_commit(run_id) > 3 * SPEC.rounds
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
    final, clean = summary["metrics"]["final_eval_loss"], fault_free["metrics"]["final_eval_loss"]
    assert abs(final - clean) <= 0.05 * clean, (final, clean)
    client = MlflowClient()
    parent = client.search_runs([client.get_experiment_by_name("faults").experiment_id],
                                f"tags.`crosscloud.run_id` = '{run_id}' and tags.`crosscloud.level` = 'job'")[0]
    assert parent.data.tags["crosscloud.lost.singapore"].startswith(f"round {lost[0]}: sub-task is failed")
    counted = sorted((m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "clouds_lost"))
    assert counted == [(r["round"], 1.0 if r["round"] == lost[0] else 0.0) for r in history]


def test_a_killed_coordinator_resumes_and_applies_every_round_exactly_once():
    ref = admit_stage(SPEC, "faults-coordinator")
    preheat_stage(ref)
    fed, plan = ref.load()
    handles = [dispatch_stage(ref, c.name) for c in plan.clouds]
    first = subprocess.Popen([sys.executable, "-c", COORDINATOR, ref.federation_path, ref.tenant, ref.run_id])
    killed = threading.Event()
    done = threading.Event()

    def kill_coordinator():
        os.kill(first.pid, signal.SIGKILL)
        killed.set()

    watcher = _when_rounds_done(ref.run_id, 2, kill_coordinator, done)
    try:
        first.wait(timeout=600)
    finally:
        done.set()
        watcher.join()
    assert killed.is_set() and first.returncode == -signal.SIGKILL, "the coordinator was not killed mid-run"
    assert _rounds_done(ref.run_id) < SPEC.rounds
    sync_stage(ref, handles, log=lambda m: None)  # the retried task
    summary = aggregate_stage(ref, handles, compare_baseline=False)
    home = open_store(fed.local_cloud, SPEC.tenant)
    history = load_history(home, plan)
    assert [r["round"] for r in history] == list(range(SPEC.rounds)) == [r["round"] for r in summary["history"]]
    stores = {c.name: open_store(fed.cloud(c.name), SPEC.tenant) for c in plan.clouds}
    for r, record in enumerate(history):
        # global r + 1 is global r moved by one outer step on round r's committed contributions: once, none skipped
        params, momentum, meta = load_global(home, plan, r)
        commits = {c: read_commit(stores[c], plan.keys.cloud_step(c, r)) for c in record["clouds"]}
        deltas, _ = screen(stores, commits, params, record["shares"])
        stepped, _ = outer_step(params, weighted_mean(deltas, record["shares"]), momentum, outer_config(plan, r))
        feedback = ErrorFeedback()  # the global is the one every cloud holds: params plus the int8 update
        feedback.residual = load_residual(home, plan, r) or {}
        expected, _ = quantized_global(params, stepped, feedback)
        after, _, published = load_global(home, plan, r + 1)
        assert published["round"] == r
        assert all(torch.allclose(expected[n], after[n]) for n in after), f"round {r} is not applied exactly once"
    assert read_commit(home, plan.keys.global_step(SPEC.rounds + 1)) is None


def test_a_cloud_drained_mid_run_hands_its_share_to_the_others():
    fed = load_federation()
    try:
        summary = _run_with("faults-drain", 1, lambda: drain(fed, "singapore"))
    finally:
        activate(fed, "singapore")
    history = summary["history"]
    assert len(history) == SPEC.rounds
    moved = [r["round"] for r in history if r["next_shares"]["singapore"] == 0]
    assert moved and moved == list(range(moved[0], SPEC.rounds))  # from one round on, for the rest of the run
    assert all(sum(history[r]["next_shares"].values()) == SPEC.global_batch for r in moved)
    home = open_store(fed.local_cloud, SPEC.tenant)
    plan = Plan.load(home, SPEC.tenant, "faults-drain")
    idle = [r["round"] for r in load_history(home, plan) if not r["clouds"]["singapore"]["step_s"]]
    assert idle and idle[-1] == SPEC.rounds - 1  # its sub-task idled once the share arrived, to the end
