"""Price-aware timing and placement: deadlines, cheapest hours, residency, capacity, and the LP optimum."""

from __future__ import annotations

import numpy as np
import pytest

from price_lp import (
    BatchJob,
    CloudSpec,
    TrainingJob,
    account,
    optimum,
    schedule,
    schedule_rolling,
)

H = 24


def _view(prices):
    def view(region, decision_hour, start, hours):
        return list(prices[region][start:start + hours])
    return view


def _prices(**regions):
    return {r: np.asarray(v, dtype=float) for r, v in regions.items()}


def test_deferrable_job_takes_the_cheapest_hours_before_its_deadline():
    p = [100.0] * H
    p[5:8] = [10.0, 10.0, 10.0]
    p[15:18] = [1.0, 1.0, 1.0]  # cheaper still, but past the deadline
    prices = _prices(A=p)
    clouds = [CloudSpec("a", "A", 1, 1.0, 1000.0)]
    job = TrainingJob("j", 1, 3.0, arrival=0, deadline=10.0)
    s = schedule("price", [job], [], clouds, H, view=_view(prices))
    (pl,) = s.placements
    assert (pl.cloud, pl.start, pl.end) == ("a", 5, 8.0)
    assert not s.misses
    assert account(s.placements, clouds, prices).electricity_usd == pytest.approx(3 * 1.0 * 10.0 / 1000)


def test_job_never_placed_past_its_deadline_even_when_later_is_cheaper():
    prices = _prices(A=[100.0] * 4 + [0.0] * (H - 4))
    clouds = [CloudSpec("a", "A", 1, 1.0, 300.0)]
    jobs = [TrainingJob(f"j{i}", 1, 1.5, arrival=0, deadline=3.5) for i in range(2)]
    s = schedule("price", jobs, [], clouds, H, view=_view(prices))
    assert not s.misses
    for pl in s.placements:
        assert pl.end <= 3.5 + 1e-9


def test_cheaper_cloud_chosen_and_residency_respected():
    prices = _prices(A=[100.0] * H, B=[10.0] * H)
    clouds = [CloudSpec("a", "A", 4, jurisdiction="EU"), CloudSpec("b", "B", 4, jurisdiction="US")]
    free = TrainingJob("free", 2, 2.0, 0, 2.0)
    resident = TrainingJob("resident", 2, 2.0, 0, 2.0, allowed=frozenset({"a"}))
    s = schedule("price", [free, resident], [], clouds, H, view=_view(prices))
    where = {p.job: p.cloud for p in s.placements}
    assert where == {"free": "b", "resident": "a"}


def test_capacity_is_never_oversubscribed_and_urgent_work_bumps_unstarted_reservations():
    p = [50.0] * H
    p[2] = 1.0
    prices = _prices(A=p)
    clouds = [CloudSpec("a", "A", 1)]
    deferrable = TrainingJob("later", 1, 1.0, arrival=0, deadline=10.0)  # would take hour 2
    urgent = TrainingJob("urgent", 1, 1.0, arrival=1, deadline=3.0)  # must run in hour 1 or 2
    s = schedule("price", [deferrable, urgent], [], clouds, H, view=_view(prices))
    assert not s.misses
    hours = sorted(p.start for p in s.placements)
    assert len(set(hours)) == 2  # one device: never two jobs in one hour
    assert {p.job: p.start for p in s.placements}["urgent"] in (1, 2)


def test_batch_fills_cheapest_device_hours_and_least_loaded_runs_asap():
    prices = _prices(A=[30.0, 20.0, 10.0, 40.0] + [50.0] * (H - 4), B=[25.0] * H)
    clouds = [CloudSpec("a", "A", 2), CloudSpec("b", "B", 2)]
    batch = BatchJob("batch", 5.0, arrival=0, deadline=4)
    s = schedule("price", [], [batch], clouds, H, view=_view(prices))
    got = sorted((p.cloud, p.start, p.device_hours) for p in s.placements)
    assert got == [("a", 1, 2.0), ("a", 2, 2.0), ("b", 0, 1.0)]
    base = schedule("least-loaded", [], [batch], clouds, H)
    assert max(p.start for p in base.placements) == 1  # 4 device-hours per hour from hour 0


def test_lp_on_a_tiny_hand_solvable_case():
    # one device; prices 5, 1, 3, 9; job A (1 h, deadline 2) and job B (1 h, deadline 2):
    # one must take hour 0 (5), the other hour 1 (1): optimum energy = (5 + 1) * 1 kW / 1000
    prices = _prices(A=[5.0, 1.0, 3.0, 9.0])
    clouds = [CloudSpec("a", "A", 1, pue=1.0, power_w=1000.0)]
    jobs = [TrainingJob("A", 1, 1.0, 0, 2.0), TrainingJob("B", 1, 1.0, 0, 2.0)]
    opt = optimum(jobs, [], clouds, 4, prices)
    assert opt.status == "optimal"
    assert opt.electricity_usd == pytest.approx(6.0 / 1000)
    batch = BatchJob("b", 1.5, 2, 4)  # then 1.5 device-hours in hours 2..3: 1 at 3, 0.5 at 9
    opt2 = optimum(jobs, [batch], clouds, 4, prices)
    assert opt2.electricity_usd == pytest.approx((6.0 + 3.0 + 4.5) / 1000)


def test_lp_reports_infeasible_deadlines():
    prices = _prices(A=[1.0] * 4)
    opt = optimum([TrainingJob("x", 2, 1.0, 0, 1.0)], [], [CloudSpec("a", "A", 1)], 4, prices)
    assert opt.status.startswith("infeasible")


def test_rolling_lp_policy_waits_for_cheap_hours_and_keeps_deadlines():
    p = [100.0] * H
    p[6:9] = [5.0, 5.0, 5.0]
    prices = _prices(A=p, B=[80.0] * H)
    clouds = [CloudSpec("a", "A", 3), CloudSpec("b", "B", 2)]
    jobs = [TrainingJob("defer", 2, 3.0, 0, 12.0), TrainingJob("urgent", 2, 2.0, 1, 3.0)]
    s = schedule("price-lp", jobs, [BatchJob("batch", 1.0, 0, 10, allowed=frozenset({"a"}))], clouds, H, view=_view(prices))
    assert not s.misses
    where = {(pl.job, pl.cloud, pl.start) for pl in s.placements}
    assert ("defer", "a", 6) in where
    assert ("urgent", "b", 1) in where  # cheaper now than waiting is impossible: b (80) beats a (100)
    assert {(pl.cloud, pl.start) for pl in s.placements if pl.job == "batch"} <= {("a", 6), ("a", 7), ("a", 8)}
    for pl in s.placements:
        job = next((j for j in jobs if j.name == pl.job), None)
        if job:
            assert pl.end <= job.deadline + 1e-9


def test_rolling_lp_pauses_deferrable_work_for_an_urgent_job():
    prices = _prices(A=[10.0 + t for t in range(H)])  # cheapest now: the long jobs start at once
    clouds = [CloudSpec("a", "A", 3)]
    long_jobs = [TrainingJob(f"long{i}", 1, 4.0, 0, 23.0) for i in range(3)]  # lots of slack, fill the cloud
    urgent = TrainingJob("urgent", 1, 1.0, 1, 2.0)
    s = schedule("price-lp", [*long_jobs, urgent], [], clouds, H, view=_view(prices))
    assert not s.misses
    assert len(s.preempted) == 1
    assert {pl.start for pl in s.placements if pl.job == "urgent"} == {1}
    busy = np.zeros(H)
    for pl in s.placements:
        occ = np.ones(int(np.ceil(pl.end - pl.start - 1e-9)))
        busy[pl.start:pl.start + len(occ)] += pl.devices * occ
    assert busy.max() <= 3 + 1e-9


def test_rolling_lp_due_job_without_room_waits_for_an_hour_that_meets_its_deadline_rather_than_holding_a_late_one():
    # at 2 the urgent job finds "short" still running and pausing "long" frees too little; the first start
    # free without pausing is after "long" ends (a miss). At 3 "short" has ended: pausing "long" makes room.
    hours = 48
    prices = _prices(A=[10.0 + t for t in range(hours)])  # cheapest now: every job starts as soon as it can
    clouds = [CloudSpec("a", "A", 4)]
    jobs = [TrainingJob("long", 2, 20.0, 0, 45.0), TrainingJob("short", 2, 3.0, 0, 3.0),
            TrainingJob("urgent", 4, 3.0, 2, 7.0)]
    s = schedule_rolling(jobs, [], clouds, hours, _view(prices), big_share=1.5, margin_h=2)
    assert not s.misses
    assert s.preempted == ["long"]
    assert [pl.start for pl in s.placements if pl.job == "urgent"] == [3]


def test_rolling_lp_as_a_last_resort_pauses_a_job_with_a_few_hours_of_slack_for_an_urgent_one():
    # "mid" has 5.75 h of slack left at 1: too little to pause it first, enough to finish after the urgent job.
    hours = 24
    prices = _prices(A=[10.0 + t for t in range(hours)])
    jobs = [TrainingJob("mid", 2, 10.0, 0, 16.0), TrainingJob("urgent", 2, 1.0, 1, 2.0)]
    s = schedule_rolling(jobs, [], [CloudSpec("a", "A", 2)], hours, _view(prices), big_share=1.5)
    assert not s.misses
    assert s.preempted == ["mid"]
    assert [pl.start for pl in s.placements if pl.job == "urgent"] == [1]


def test_rolling_lp_holds_the_cheap_hour_of_a_job_due_soon_unless_that_leaves_too_little_room():
    p = [100.0] * H
    p[10] = 1.0  # the one cheap hour: the job's last start that meets its deadline
    prices = _prices(A=p)
    clouds = [CloudSpec("a", "A", 5)]
    job = TrainingJob("defer", 2, 1.0, arrival=0, deadline=11.0)
    held = schedule_rolling([job], [], clouds, H, _view(prices))
    assert [(pl.start, pl.end) for pl in held.placements] == [(10, 11.0)] and not held.misses
    # keeping 70 % of the cloud free for urgent work: no hold, it starts when it is due (margin_h before)
    early = schedule_rolling([job], [], clouds, H, _view(prices), hold_headroom=0.7, margin_h=2)
    assert [pl.start for pl in early.placements] == [8]


def test_rolling_lp_starts_whole_jobs_and_never_spills_a_planned_start_onto_a_dearer_cloud():
    # a has room for one of the two jobs in its cheapest hour; the relaxation would give each 3/4 of it.
    a = [100.0] * H
    a[0:2] = [1.0, 2.0]
    prices = _prices(A=a, B=[50.0] * H)
    clouds = [CloudSpec("a", "A", 3), CloudSpec("b", "B", 5)]
    jobs = [TrainingJob("j1", 2, 1.0, 0, 10.0), TrainingJob("j2", 2, 1.0, 0, 10.0)]
    s = schedule_rolling(jobs, [], clouds, H, _view(prices))
    assert not s.misses
    assert sorted((pl.cloud, pl.start) for pl in s.placements) == [("a", 0), ("a", 1)]


def test_rolling_lp_due_job_that_cannot_hold_its_planned_hour_takes_the_cheapest_slot_left():
    # the plan's hour (a at 9) cannot be held: it would leave less than half of a free for urgent work.
    # b's hour 8 keeps that room and is cheaper than starting at once (when the job falls due at 7).
    a = [100.0] * H
    a[9] = 1.0
    prices = _prices(A=a, B=[100.0] * 8 + [20.0] + [100.0] * (H - 9))
    clouds = [CloudSpec("a", "A", 2), CloudSpec("b", "B", 5)]
    job = TrainingJob("defer", 2, 1.0, 0, 10.0)
    s = schedule_rolling([job], [], clouds, H, _view(prices), hold_headroom=0.5)
    assert not s.misses
    assert [(pl.cloud, pl.start) for pl in s.placements] == [("b", 8)]


def test_rolling_lp_keeps_room_on_the_cheap_cloud_for_the_work_expected_from_yesterday():
    # yesterday an urgent job needed all of a at hour 4; today one like it will arrive at 28.
    # A deferrable job arriving at 27 could take a at once (a's price creeps up), blocking it.
    hours = 48
    prices = _prices(A=[10.0 + 0.1 * t for t in range(hours)], B=[100.0] * hours)
    clouds = [CloudSpec("a", "A", 2), CloudSpec("b", "B", 2)]
    jobs = [TrainingJob("urgent-1", 2, 2.0, 4, 6.0), TrainingJob("defer", 2, 2.0, 27, 35.0),
            TrainingJob("urgent-2", 2, 2.0, 28, 30.0)]

    def placed(**kw):  # big_share > 1: these whole-cloud jobs are planned hourly, not reserved at arrival
        s = schedule_rolling(jobs, [], clouds, hours, _view(prices), preempt=False, big_share=1.5, **kw)
        assert not s.misses
        return {pl.job: (pl.cloud, pl.start) for pl in s.placements}

    blind = placed(expect_arrivals=False)
    assert blind["defer"] == ("a", 27) and blind["urgent-2"] == ("b", 28)
    seen = placed()
    assert seen["urgent-2"] == ("a", 28)
    assert seen["defer"][0] == "a" and seen["defer"][1] >= 30
