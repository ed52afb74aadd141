"""A running deferrable run paused at a price spike and resumed after it, for real: no committed round is lost.

The scheduler's clock is moved (``crosscloud.scheduler.service.wall_clock``)
over prices of this module's own: cheap, then two dear hours, then cheap
again, on beijing's grid region. The run starts in the cheap hour; once the
clock enters the spike, a pass pauses it; its sub-task stops after a
committed round and its devices go back; when the clock leaves the spike, a
pass starts it again on the same devices and it resumes from its saved state.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.scheduler import prices as scheduler_prices
from crosscloud.scheduler import service
from crosscloud.store.open_store import open_store
from crosscloud.training import watcher

pytestmark = [pytest.mark.e2e, pytest.mark.queue, pytest.mark.slow]

T0 = datetime(2026, 3, 10, 8, tzinfo=UTC)  # 08:00; the spike is 09:00-11:00 every day (of 2023 in the price data)
SPIKE_HOURS = (9, 10)
TENANT = "team-a"
ROUNDS = 120


@pytest.fixture
def spiky_prices(tmp_path, monkeypatch):
    """A year of DE-LU prices (beijing's grid region): 20 USD/MWh, 3000 in the two spike hours of each day."""
    data = tmp_path / "data"
    shutil.copytree(Path(os.environ["CROSSCLOUD_DATA_DIR"]) / "power", data / "power")
    (data / "electricity" / "prices").mkdir(parents=True)
    hours = [datetime(2023, 1, 1, tzinfo=UTC) + timedelta(hours=h) for h in range(8760)]
    rows = [f"{t:%Y-%m-%d %H:%M:%S}+00:00,,{3000.0 if t.hour in SPIKE_HOURS else 20.0}" for t in hours]
    (data / "electricity" / "prices" / "DE-LU_2023.csv").write_text(
        "Datetime (UTC),Datetime (Local),Price (USD/MWh)\n" + "\n".join(rows) + "\n")
    monkeypatch.setenv("CROSSCLOUD_DATA_DIR", str(data))
    monkeypatch.setenv("CROSSCLOUD_PAUSE_COST_S", "1")  # a tiny run: a pause costs it a second, not minutes
    monkeypatch.setattr(scheduler_prices, "_FORECASTS", {})
    return data


class MovedClock:
    """The scheduler's clock: the wall clock's seconds, from ``start`` on; ``to`` moves it."""

    def __init__(self, start: datetime):
        self.offset = start.timestamp() - time.time()

    def __call__(self) -> float:
        return time.time() + self.offset

    def to(self, when: datetime) -> None:
        self.offset = when.timestamp() - time.time()


def _wait(what, timeout_s: float, log: list[str], every_s: float = 0.5):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if (got := what()) is not None:
            return got
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s; the run's log ends: " + "\n".join(log[-30:]))


def test_a_deferrable_run_pauses_at_a_price_spike_and_resumes_after_it_losing_no_round(spiky_prices, monkeypatch):
    from crosscloud.pipeline.stages import run_job

    clock = MovedClock(T0 + timedelta(minutes=1))
    monkeypatch.setattr(service, "wall_clock", clock)
    # 120 rounds of 0.05 to 0.5 s (the machine's load): long enough for the watch's next look after the clock moved
    monkeypatch.setattr(watcher, "QUEUE_LOOK_S", 1.0)
    spec = JobSpec(tenant=TENANT, clouds=["beijing"], rounds=ROUNDS, inner_steps=30, model_size="tiny", global_batch=8,
                   seed=7, eval_every_steps=30 * ROUNDS, deferrable=True, deadline="12")
    lines, out = [], {}

    def train() -> None:
        try:
            out["summary"] = run_job(spec, "paused-run", log=lines.append, compare_baseline=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    _wait(lambda: True if any(line.startswith("round 1:") for line in lines) else None, 240, lines)
    clock.to(T0 + timedelta(hours=1, minutes=1))  # into the spike
    ledger = Ledger()
    paused = _wait(lambda: r if (r := ledger.queue.get(TENANT, "paused-run")).state == "paused" else None, 180, lines)
    assert any("the queue pauses the run after its next committed round: paused after its next committed round "
               "by cost: resumes 2026-03-10 11:00 UTC" in line for line in lines)
    assert '"planned_at": %d' % (T0 + timedelta(hours=3)).timestamp() in paused.decision  # it waits for 11:00
    assert ledger.active(TENANT, "paused-run") == []  # its devices went back
    assert '"parts": [["beijing"' in paused.request  # it waits for the devices of its saved state
    clock.to(T0 + timedelta(hours=3, minutes=1))  # the spike is over
    thread.join(timeout=300)
    assert "error" not in out, out.get("error")
    summary = out["summary"]
    fed = load_federation()
    home = open_store(fed.cloud("beijing"), TENANT)
    plan = Plan.load(home, TENANT, "paused-run")
    history = load_history(home, plan)
    assert [r["round"] for r in history] == list(range(ROUNDS))  # every round once: none lost, none trained twice
    assert all(r["digests_agree"] for r in history)
    marker = home.get(plan.keys.paused("beijing"))
    after = int(__import__("json").loads(marker)["round"])
    assert 0 < after < ROUNDS - 1
    assert history[after + 1]["published_at"] > history[after]["published_at"]
    assert any("paused after round" in line for line in lines) and any("resumed after pause-1" in line for line in lines)
    row = ledger.queue.get(TENANT, "paused-run")
    assert row.state == "done" and clock() < row.deadline  # it finished before its deadline
    assert summary["metrics"]["final_eval_loss"] < summary["metrics"]["eval_loss_start"]
    released = [e for e in ledger.events(TENANT, "paused-run") if e.kind == "released"]
    assert any("paused" in e.detail for e in released)


def test_a_dag_run_pauses_deferred_at_a_price_spike_and_resumes_after_it(spiky_prices, monkeypatch, dagbag):
    from dagruns import params_restored

    # the next day (the scheduler's clock never goes back): cheap, then the spike
    clock = MovedClock(T0 + timedelta(hours=24, minutes=1))
    monkeypatch.setattr(service, "wall_clock", clock)
    monkeypatch.setenv("CROSSCLOUD_QUEUE_POLL_S", "1")
    monkeypatch.setattr(watcher, "QUEUE_LOOK_S", 1.0)  # its watch asks each second: rounds take 0.05 to 0.5 s here
    ledger, seen, stop = Ledger(), {}, threading.Event()
    begun = clock()

    def move_the_clock() -> None:  # into the spike once the run reported its rounds; past it once it paused
        while not stop.wait(0.3):
            rows = [r for r in ledger.queue.rows(("running", "paused"), TENANT)  # the run, not its baseline calibration
                    if r.submitted_at >= begun and not r.run_id.endswith(".baseline")]
            if not rows:
                continue
            row = rows[0]
            seen.setdefault("estimate", row.runtime_s)
            if "spike" not in seen and row.state == "running" and row.runtime_s != seen["estimate"]:
                seen["spike"] = row.run_id  # its watch reported the work it has left, measured from its rounds
                clock.to(T0 + timedelta(hours=25, minutes=1))
            elif row.state == "paused" and "paused" not in seen:
                seen["paused"] = row
                time.sleep(2.0)
                clock.to(T0 + timedelta(hours=27, minutes=1))
                return

    mover = threading.Thread(target=move_the_clock, daemon=True)
    mover.start()
    conf = {"tenant": TENANT, "clouds": ["beijing"], "rounds": ROUNDS, "inner_steps": 30, "model_size": "tiny",
            "global_batch": 8, "seed": 9, "eval_every_steps": 30 * ROUNDS, "deferrable": True, "deadline": "12"}
    try:
        with params_restored(dagbag.get_dag("cross_cloud_training")) as dag:
            run = dag.test(run_conf=conf)
    finally:
        stop.set()
        mover.join(10)
    assert run.state == "success", [(t.task_id, t.state) for t in run.get_task_instances()]
    assert seen.get("paused") is not None and seen["paused"].run_id == run.run_id  # it waited, paused, in the queue
    sync = next(t for t in run.get_task_instances() if t.task_id == "sync_checkpoints")
    history = sync.xcom_pull(task_ids="sync_checkpoints")
    assert [r["round"] for r in history] == list(range(ROUNDS))  # every round once
    row = ledger.queue.get(TENANT, run.run_id)
    assert row.state == "done" and clock() < row.deadline
    assert any("paused" in e.detail for e in ledger.events(TENANT, run.run_id) if e.kind == "released")
    assert ledger.active(TENANT, run.run_id) == []  # the cleanup gave back what it held after the resume
