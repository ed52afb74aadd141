"""The deferred ``sync_checkpoints``: its trigger waits on round records in a real store, and a watch that is
killed and started again leaves training alone.

The operator is driven the way Airflow drives a deferrable task - ``execute``,
then each trigger's first event into ``resume`` until it returns - with the
trigger rebuilt from its serialized form between the two, as the triggerer
rebuilds it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import RunRef, admit_stage, dispatch_stage, preheat_stage, release_stage, stop_run
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.store.base import StoreError
from crosscloud.store.open_store import open_store
from crosscloud.training.exchange.members import Members, read_members
from crosscloud_airflow.operators import SyncCheckpointsOperator
from crosscloud_airflow.triggers import RoundTrigger

# a small run (about 10 s here): evaluated after round 1 and after the last
SPEC = JobSpec(rounds=4, inner_steps=10, model_size="tiny", global_batch=12, seed=4, eval_every_steps=20)


def _rebuilt(trigger: RoundTrigger) -> RoundTrigger:
    """The trigger as the triggerer makes it again: from its classpath and serde-encoded kwargs."""
    from airflow.sdk._shared.module_loading import import_string
    from airflow.sdk.serde import deserialize, serialize

    classpath, kwargs = trigger.serialize()
    stored = json.loads(json.dumps(serialize(kwargs)))  # what the metadata DB keeps
    return import_string(classpath)(**deserialize(stored))


def _home(run_id: str):
    home = open_store(load_federation().local_cloud, SPEC.tenant)
    return home, Plan.load(home, SPEC.tenant, run_id)


def test_round_trigger_serializes_and_round_trips():
    run = {"federation_path": "/f.yaml", "tenant": "team-a", "run_id": "manual__2026-01-01T00:00:00+00:00"}
    handles = [{"backend": "local", "cloud": "beijing", "pid": 42, "command": ["python", "-m", "w"], "started_at": 1.5}]
    trigger = RoundTrigger(run=run, handles=handles, poll_interval=0.5, since=123.0, delay=4.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "crosscloud_airflow.triggers.RoundTrigger"
    assert kwargs == {"run": run, "handles": handles, "poll_interval": 0.5, "since": 123.0, "delay": 4.0}
    again = _rebuilt(trigger)
    assert type(again) is RoundTrigger and again.serialize() == (classpath, kwargs)
    assert RoundTrigger(run=run, handles=[]).serialize()[1]["poll_interval"] == 2.0  # the default


def test_the_operator_defers_at_once_and_holds_no_worker():
    from airflow.sdk.exceptions import TaskDeferred

    run = {"federation_path": "/nowhere.yaml", "tenant": "team-a", "run_id": "never-read"}
    op = SyncCheckpointsOperator(task_id="sync_checkpoints", run=run, handles=[{"cloud": "beijing"}], poll_interval=0.5)
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})  # reads nothing: the federation file does not even exist
    assert deferred.value.method_name == "resume"
    kwargs = deferred.value.trigger.serialize()[1]
    assert kwargs["run"] == run and kwargs["handles"] == [{"cloud": "beijing"}] and kwargs["poll_interval"] == 0.5
    assert before <= kwargs["since"] <= time.time() and kwargs["delay"] == 0.0


@pytest.fixture()
def preheated_run():
    """A run of its own, admitted and preheated on the embedded clouds (devices reserved, plan, round 0),
    no sub-task started."""
    ref = admit_stage(SPEC, f"sync-trigger-{uuid.uuid4().hex[:8]}")
    try:
        preheat_stage(ref)
        yield ref
    finally:
        release_stage(ref)


def _members(plan: Plan, r: int) -> Members:
    """Round ``r``'s record, every cloud in it, each saying it made the global before (as its commit would)."""
    shares = {c.name: c.share for c in plan.clouds}
    made = {c.name: {"name": None, "entry": None, "meta": {"exchange": {"digest": "d" * 64}}} for c in plan.clouds}
    return Members(round=r, contributions=made, shares=shares, lost={}, gone={}, next_shares=shares, caps={},
                   evaluator=plan.coordinator_cloud, decided_at=time.time(), decided_by=plan.coordinator_cloud)


@pytest.mark.slow
def test_the_trigger_fires_when_a_round_is_decided_and_polls_before(preheated_run, monkeypatch):
    from crosscloud.training.watcher import Watcher

    home, plan = _home(preheated_run.run_id)
    # the store fails twice: the trigger logs it and reads again, it never ends for it
    real_peek, failures = Watcher.peek, []

    def flaky_peek(self):
        if len(failures) < 2:
            failures.append(time.time())
            raise StoreError(f"{plan.coordinator_cloud}: connection reset (injected)")
        return real_peek(self)

    monkeypatch.setattr(Watcher, "peek", flaky_peek)
    trigger = _rebuilt(RoundTrigger(run=preheated_run.to_dict(), handles=[], poll_interval=0.05))

    async def watch():
        events = trigger.run()
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(1.5)
        assert len(failures) == 2, "the trigger did not read again after a store error"
        assert not waiting.done(), f"fired before any round was decided: {waiting.result().payload}"
        home.put(plan.keys.members(0), _members(plan, 0).to_bytes())
        await asyncio.sleep(0.5)
        assert not waiting.done(), "fired before round 0's global was made"
        home.put(plan.keys.members(1), _members(plan, 1).to_bytes())  # the clouds went on: global 1 was made
        if plan.spec.evaluates_after(0):
            home.put(plan.keys.evaluation(1), b'{"eval_loss": 3.0}')
        event = await asyncio.wait_for(waiting, timeout=10)
        assert await anext(events, None) is None  # one event, then the trigger is done
        return event

    event = asyncio.run(watch())
    assert event.payload["reason"] == "round 0 to record"
    assert event.payload["since"] > 0 and event.payload["delay"] == 0.0
    assert read_members(home, plan, 0) is not None and load_history(home, plan) == []  # it only read


@pytest.mark.slow
def test_a_store_outage_on_a_visit_defers_again_and_a_lost_run_fails_the_task(preheated_run, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from crosscloud.training.watcher import SubTaskLost, Watcher

    op = SyncCheckpointsOperator(task_id="sync_checkpoints", run=preheated_run.to_dict(), handles=[], poll_interval=1)

    def outage(self, on_round=None):
        raise StoreError("beijing: rounds/watch.json: put still failing after 30 s (injected)")

    monkeypatch.setattr(Watcher, "act", outage)
    with pytest.raises(TaskDeferred) as deferred:
        op.resume({}, {"reason": "round 0 decided", "since": time.time(), "delay": 0.0})
    again = deferred.value.trigger.serialize()[1]
    assert deferred.value.method_name == "resume" and again["delay"] == 1.0  # it waits a little longer, then looks again
    with pytest.raises(TaskDeferred) as deferred:
        op.resume({}, {"reason": "round 0 decided", "since": again["since"], "delay": again["delay"]})
    assert deferred.value.trigger.serialize()[1]["delay"] == 2.0
    # an outage as long as a round may take is the run's stall: the task fails (and Airflow retries it)
    with pytest.raises(StoreError):
        op.resume({}, {"reason": "unreadable", "since": time.time() - SPEC.round_timeout_s - 1, "delay": 2.0})

    def lost(self, on_round=None):
        raise SubTaskLost("every cloud of the run is lost (injected)")

    monkeypatch.setattr(Watcher, "act", lost)
    with pytest.raises(SubTaskLost):
        op.resume({}, {"reason": "sub-task ended", "since": time.time(), "delay": 0.0})


def _start(ref: RunRef) -> list[dict]:
    _, plan = ref.load()
    return [dispatch_stage(ref, c.name) for c in plan.clouds]


def _visits(op: SyncCheckpointsOperator, stop=lambda: False):
    """Drive ``op`` as Airflow does: ``execute``, then each rebuilt trigger's first event into ``resume``.

    Returns ``(result, visits)``: the task's return value, or None when ``stop()`` said to drop the task
    (as a kill or a lost worker would) after a visit.
    """
    from airflow.sdk.exceptions import TaskDeferred

    visit, visits = functools.partial(op.execute, {}), 0
    while True:
        visits += 1
        try:
            return visit(), visits
        except TaskDeferred as deferred:
            assert deferred.method_name == "resume"
            if stop():
                return None, visits
            trigger = _rebuilt(deferred.trigger)
            event = asyncio.run(asyncio.wait_for(anext(trigger.run()), timeout=120))
            visit = functools.partial(op.resume, {}, event.payload)


def _states(handles: list[dict]) -> dict[str, str]:
    from crosscloud.backends import get_backend

    return {h["cloud"]: get_backend(h["backend"]).state(h) for h in handles}


@pytest.mark.e2e
@pytest.mark.slow
def test_a_watch_restart_leaves_training_untouched():
    from mlflow.tracking import MlflowClient

    from crosscloud.pipeline.stages import watcher

    run_id = "sync-watch-restart"
    ref = admit_stage(SPEC, run_id, experiment="sync_trigger")
    try:
        preheat_stage(ref)
        home, plan = _home(run_id)
        handles = _start(ref)
        run = ref.to_dict()
        # the first watch records a round or two, then is killed between visits (its on_kill is called)
        first = SyncCheckpointsOperator(task_id="sync_checkpoints", run=run, handles=handles, poll_interval=0.1)
        result, _ = _visits(first, stop=lambda: len(load_history(home, plan)) >= 1)
        assert result is None
        first.on_kill()
        del first
        recorded = len(load_history(home, plan))
        assert 1 <= recorded < SPEC.rounds
        # with no watch at all the clouds train on: later rounds are decided, nothing was stopped
        deadline = time.time() + 120
        while read_members(home, plan, SPEC.rounds - 1) is None:
            assert time.time() < deadline, "the clouds stopped deciding rounds once the watch was gone"
            assert all(s in ("running", "succeeded") for s in _states(handles).values()), _states(handles)
            time.sleep(0.2)
        assert not home.exists(plan.keys.stop)
        assert len(load_history(home, plan)) == recorded  # nobody recorded meanwhile: the rounds wait for the watch
        # the retried task picks up after the last recorded round and records each round exactly once
        retried = SyncCheckpointsOperator(task_id="sync_checkpoints", run=run, handles=handles, poll_interval=0.1)
        result, visits = _visits(retried)
        assert [r["round"] for r in result] == list(range(SPEC.rounds))
        assert all(not {"clouds", "shares", "next_shares"} & set(r) for r in result)  # the XCom stays small
        assert visits <= 4 * SPEC.rounds, f"{visits} visits of a worker for {SPEC.rounds} rounds"
        history = load_history(home, plan)
        assert [r["round"] for r in history] == list(range(SPEC.rounds)) and all(r["digests_agree"] for r in history)
        assert history[-1]["eval_loss"] is not None
        deadline = time.time() + 60
        while set(_states(handles).values()) != {"succeeded"}:  # the sub-tasks end by themselves
            assert time.time() < deadline and "failed" not in _states(handles).values(), _states(handles)
            time.sleep(0.2)
        # a fresh engine watcher finds the run done and records nothing again
        assert watcher(ref, handles, log=lambda m: None).run() == history
        client = MlflowClient()
        parent = Plan.load(home, SPEC.tenant, run_id).tracking["parent_run_id"]
        walls = client.get_metric_history(parent, "round_wall_s")
        assert sorted(m.step for m in walls) == list(range(SPEC.rounds))  # each round in MLflow once
    finally:
        try:
            stop_run(ref, handles if "handles" in locals() else [])
        finally:
            release_stage(ref)
