"""Deadlines kept by construction: the rolling price-aware policy never trades a deadline for a cheaper hour."""

from __future__ import annotations

import numpy as np

from crosscloud.scheduler.deadlines import Guard, Item, witness
from price_lp import CloudSpec, TrainingJob, account, occupancy, schedule, schedule_rolling


def _view(prices):
    def view(region, decision_hour, start, hours):
        return list(prices[region][start:start + hours])
    return view


def _job_item(name, devices, runtime, deadline, clouds=(0,)):
    return Item(name, deadline, clouds, devices=devices, occ=occupancy(runtime))


def test_the_edf_schedule_waits_only_while_every_deadline_stays_reachable():
    guard = Guard(np.array([2.0]), urgent_slack_h=0)
    used = np.zeros((1, 24))
    roomy = [_job_item("a", 2, 3.0, 7.0), _job_item("b", 2, 3.0, 8.0)]
    assert guard.due_now(used, roomy, 0).starts == {}  # from hour 1: a 1..4, b 4..7: both in time
    tight = [_job_item("a", 2, 3.0, 6.0), _job_item("b", 2, 3.0, 6.0)]
    due = guard.due_now(used, tight, 0)
    assert list(due.starts.values()) == [(0, 0)] and len(due.starts) == 1  # one starts now, the other right after
    assert witness(guard.free(used, 0), tight, 0).ok and not witness(guard.free(used, 0), tight, 1).ok


def test_cheap_hours_after_the_deadlines_do_not_tempt_the_policy_past_them():
    hours = 48
    prices = {"A": np.array([100.0] * 10 + [1.0] * (hours - 10))}
    jobs = [TrainingJob(f"j{i}", 2, 3.0, arrival=0, deadline=10.0) for i in range(3)]  # 9 h of work, 10 h to do it
    s = schedule_rolling(jobs, [], [CloudSpec("a", "A", 2)], hours, _view(prices))
    assert s.misses == [] and s.infeasible == {}
    assert all(p.end <= 10.0 + 1e-9 for p in s.placements)


def test_an_urgent_job_on_a_cloud_full_of_deferred_work_makes_it_yield_and_both_deadlines_hold():
    hours = 60
    cheap = [100.0] * 10 + [5.0] * 10 + [100.0] * (hours - 20)  # a is cheap from 10 to 20: the deferred work waits
    prices = {"A": np.array(cheap), "B": np.array([300.0] * hours)}
    clouds = [CloudSpec("a", "A", 4), CloudSpec("b", "B", 4)]
    deferred = [TrainingJob(f"d{i}", 2, 6.0, arrival=0, deadline=40.0) for i in range(2)]
    urgent = TrainingJob("urgent", 4, 3.0, arrival=11, deadline=15.0, allowed=frozenset({"a"}))
    s = schedule_rolling([*deferred, urgent], [], clouds, hours, _view(prices), big_share=1.5)
    assert s.misses == [] and s.infeasible == {}
    starts = {}
    for p in s.placements:
        starts.setdefault(p.job, p.start)  # the first piece of each
    assert 10 <= min(starts[d.name] for d in deferred) < 11  # the deferred work did wait for the cheap hours
    assert starts["urgent"] <= 12
    assert set(s.preempted) <= {"d0", "d1"} and s.preempted  # it yielded: paused, resumed later, still in time
    for p in s.placements:
        assert p.end <= {"d0": 40.0, "d1": 40.0, "urgent": 15.0}[p.job] + 1e-9


def test_a_deadline_no_schedule_can_meet_is_named_at_admission_and_not_counted_as_the_policys_miss():
    hours = 24
    prices = {"A": np.array([10.0] * hours)}
    clouds = [CloudSpec("a", "A", 2)]
    too_short = TrainingJob("too-short", 1, 5.0, arrival=0, deadline=3.0)
    tight = TrainingJob("tight", 2, 10.0, arrival=0, deadline=10.0)  # no slack: it cannot be paused
    squeezed = TrainingJob("squeezed", 2, 5.0, arrival=1, deadline=6.0)  # only if "tight" gave way, and it cannot
    s = schedule_rolling([too_short, tight, squeezed], [], clouds, hours, _view(prices))
    assert "run time is longer" in s.infeasible["too-short"]
    assert "admitted before it" in s.infeasible["squeezed"]
    assert "tight" not in s.infeasible and "tight" not in s.misses
    assert s.missed_feasible == []


def test_a_forecast_wrong_by_a_lot_costs_money_never_a_deadline():
    hours = 72
    actual = {"A": np.array([50.0 + t for t in range(hours)])}  # in truth every hour is dearer than the last
    promised = {"A": np.array([100.0] * 20 + [1.0] * 10 + [100.0] * (hours - 20 - 10))}  # cheap hours never come
    clouds = [CloudSpec("a", "A", 4)]
    jobs = [TrainingJob(f"j{i}", 2, 4.0, arrival=i, deadline=i + 4.0 + 22.0) for i in range(6)]
    s = schedule_rolling(jobs, [], clouds, hours, _view(promised))
    assert s.misses == [] and s.infeasible == {}
    assert max(p.start for p in s.placements) >= 15  # it believed the forecast and waited
    for p, job in ((p, next(j for j in jobs if j.name == p.job)) for p in s.placements):
        assert p.end <= job.deadline + 1e-9
    asap = schedule("least-loaded", jobs, [], clouds, hours)
    assert account(s.placements, clouds, actual).electricity_usd > account(asap.placements, clouds, actual).electricity_usd


def test_room_held_back_for_urgent_work_follows_the_measured_arrivals():
    guard = Guard(np.array([10.0]), urgent_slack_h=6.0, window_h=24)
    guard.observe(0, devices=24, runtime_h=3.0, slack_h=1.0, clouds=(0,))  # urgent: counted
    guard.observe(0, devices=24, runtime_h=3.0, slack_h=20.0, clouds=(0,))  # deferrable: not counted
    # k hours ahead, the urgent jobs that will have arrived by then and still run: 24 x min(3, k) / 24 h
    assert guard.holdback(0, 5).tolist() == [[1.0, 2.0, 3.0, 3.0, 3.0]]
    assert guard.holdback(30, 5).tolist() == [[0.0] * 5]  # out of the window: nothing measured
    assert Guard(np.array([10.0])).holdback(0, 3).tolist() == [[0.0] * 3]  # off by default
