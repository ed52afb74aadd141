"""Deferrable runs in the queue's pass: the cheap (or clean) hour within the deadline, and the deadline guard."""

from __future__ import annotations

import numpy as np
import pytest

from crosscloud.pool.placement import JobRequest, Site
from crosscloud.scheduler.entry import Entry
from crosscloud.scheduler.passes import World, run_pass
from crosscloud.scheduler.timing import Rates

pytestmark = pytest.mark.queue

H = 3600.0
NOW = 1000 * H  # on the hour


def _entry(run_id, devices=1, runtime_h=2.0, deadline_h=10.0, deferrable=True, objective="cost", at=NOW):
    req = JobRequest(name=run_id, tenant="t", family="f", devices=devices, runtime_s={"*": runtime_h * H}, splittable=False)
    return Entry("t", run_id, req, at, deadline=NOW + deadline_h * H, deferrable=deferrable, objective=objective,
                 runtime_s=runtime_h * H)


def _world(devices=4, clouds=("A",)):
    sites = [Site(c, "gpu", "X", devices, devices, families=frozenset({"f"})) for c in clouds]
    return World({"f": sites}, {(c, "gpu"): devices for c in clouds}, {})


def _rates(usd, co2=None, cloud="A"):
    out = Rates(int(NOW // H), {(cloud, "gpu"): np.asarray(usd, dtype=float)})
    if co2 is not None:
        out.co2[(cloud, "gpu")] = np.asarray(co2, dtype=float)
    return out


def _pass(entries, world, rates, now=NOW):
    return run_pass(entries, world, now, lambda *a: 0.0, rates=rates)


CHEAP_AT_3 = [5, 5, 5, 1, 1, 5, 5, 5, 5, 5, 5, 5] + [5] * 200


def test_a_deferrable_run_waits_for_the_cheap_hours_and_an_urgent_one_starts_now():
    world = _world()
    result = _pass([_entry("cheap"), _entry("urgent", deferrable=False)], world, _rates(CHEAP_AT_3))
    plan, urgent = result.decisions[("t", "cheap")], result.decisions[("t", "urgent")]
    assert plan.kind == "plan" and plan.planned_at == NOW + 3 * H and "deferred by cost" in plan.reason
    assert urgent.kind == "start"
    assert world.free[("A", "gpu")] == 3  # the deferred run holds nothing meanwhile


def test_at_its_planned_hour_the_run_starts_on_the_cheapest_pool():
    world = _world(clouds=("A", "B"))
    rates = Rates(int(NOW // H), {("A", "gpu"): np.full(200, 5.0), ("B", "gpu"): np.full(200, 2.0)})
    result = _pass([_entry("r")], world, rates)
    d = result.decisions[("t", "r")]
    assert d.kind == "start" and d.parts == (("B", "gpu", 1),)


def test_two_runs_that_want_the_same_cheap_hours_do_not_both_plan_for_them():
    # one device; two 2 h runs due by hour 4 both prefer hours 3-4: only one can wait, and then not for those
    world = _world(devices=1)
    a, b = _entry("a", deadline_h=4.0, at=NOW), _entry("b", deadline_h=4.0, at=NOW + 1)
    result = _pass([a, b], world, _rates(CHEAP_AT_3))
    a_d, b_d = result.decisions[("t", "a")], result.decisions[("t", "b")]
    assert a_d.kind == "start" and "due now" in a_d.reason  # the guard: EDF from hour 1 cannot fit both
    assert b_d.kind == "plan" and b_d.planned_at == NOW + 2 * H  # the cheapest hours a's run leaves it


def test_the_guard_starts_now_what_no_schedule_from_the_next_hour_could_finish_in_time():
    from crosscloud.scheduler.timing import Timing

    # one device; a (3 h) and b (1 h) both due by hour 4 and both cheaper later: from hour 1 on only 3 h are left
    a, b = _entry("a", runtime_h=3.0, deadline_h=4.0), _entry("b", runtime_h=1.0, deadline_h=4.0)
    timing, keys = Timing(_rates([5, 1, 1, 1] + [5] * 200), {("A", "gpu"): 1}, {}, NOW), [("A", "gpu")]
    for e in (a, b):
        timing.admit(e, keys)
    timing.settle()
    assert timing.is_due(a) and not timing.is_due(b)  # EDF: a now, b at hour 3
    d = _pass([a, b], _world(devices=1), _rates([5, 1, 1, 1] + [5] * 200)).decisions
    assert d[("t", "a")].kind == "start" and "due now" in d[("t", "a")].reason
    assert d[("t", "b")].kind == "plan"


def test_a_run_cheapest_now_waits_if_its_start_would_cost_a_protected_deadline():
    # one device; "short" (older, so decided first) is cheapest now, but holding the device for hours 0-1 would
    # leave "urgent" (due by hour 3) no schedule from hour 1: "short" does not start, and "urgent" does
    short = _entry("short", runtime_h=2.0, deadline_h=20.0, at=NOW)
    urgent = _entry("urgent", runtime_h=2.0, deadline_h=3.0, at=NOW + 1)
    d = _pass([short, urgent], _world(devices=1), _rates([1, 2, 2] + [9] * 200)).decisions
    assert d[("t", "short")].kind in ("wait", "plan") and d[("t", "urgent")].kind == "start"


def test_one_deferred_run_per_pass_is_guarded_even_against_the_joint_plan():
    # the same, planned one at a time (no joint plan): "short" would take hour 0, and the guard makes it wait
    from crosscloud.scheduler import joint

    short = _entry("short", runtime_h=2.0, deadline_h=20.0, at=NOW)
    urgent = _entry("urgent", runtime_h=2.0, deadline_h=3.0, at=NOW + 1)
    saved, joint.MAX_RUNS = joint.MAX_RUNS, 0
    try:
        d = _pass([short, urgent], _world(devices=1), _rates([1, 2, 2] + [9] * 200)).decisions
    finally:
        joint.MAX_RUNS = saved
    assert d[("t", "short")].kind == "wait" and "deadline without a schedule" in d[("t", "short")].reason
    assert d[("t", "urgent")].kind == "start"


def test_the_joint_plan_gives_each_cheap_slot_to_the_run_that_needs_it():
    # one device on A and on B; hour 1 is cheap on both, cheapest on A. "old" (first in line) may use both clouds,
    # "young" only A. One at a time, "old" would take A at hour 1 and leave "young" the dear hours; planned together,
    # "young" gets A and "old" B, both at hour 1
    from dataclasses import replace

    rates = Rates(int(NOW // H), {("A", "gpu"): np.asarray([9, 1] + [9] * 200, dtype=float),
                                  ("B", "gpu"): np.asarray([9, 1.5] + [9] * 200, dtype=float)})
    old = _entry("old", runtime_h=1.0, deadline_h=20.0, at=NOW - H)
    young = _entry("young", runtime_h=1.0, deadline_h=20.0)
    young = replace(young, request=replace(young.request, clouds=frozenset({"A"})))
    d = _pass([old, young], _world(devices=1, clouds=("A", "B")), rates).decisions
    assert d[("t", "young")].kind == "plan" and d[("t", "young")].parts == (("A", "gpu", 1),)
    assert d[("t", "old")].kind == "plan" and d[("t", "old")].parts == (("B", "gpu", 1),)
    assert d[("t", "old")].planned_at == d[("t", "young")].planned_at == NOW + H


def test_a_deadline_no_schedule_can_meet_is_named_and_the_run_starts_at_once():
    d = _pass([_entry("late", runtime_h=5.0, deadline_h=3.0)], _world(), _rates(CHEAP_AT_3)).decisions[("t", "late")]
    assert d.kind == "start" and "its deadline cannot be met: it needs 5.0 h and had 3.0 h when it was submitted" in d.reason


def test_the_carbon_objective_waits_for_the_clean_hours_not_the_cheap_ones():
    usd = [1, 1, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5] + [5] * 200
    co2 = [9, 9, 9, 9, 9, 1, 1, 9, 9, 9, 9, 9] + [9] * 200
    world, rates = _world(), _rates(usd, co2)
    by_cost = _pass([_entry("c", objective="cost")], _world(), rates).decisions[("t", "c")]
    by_carbon = _pass([_entry("k", objective="carbon")], world, rates).decisions[("t", "k")]
    assert by_cost.kind == "start"  # the cheap hours are now
    assert by_carbon.kind == "plan" and by_carbon.planned_at == NOW + 5 * H and "kg CO2" in by_carbon.reason


def test_without_rates_a_deferrable_run_is_decided_like_any_other():
    d = _pass([_entry("r")], _world(), None).decisions[("t", "r")]
    assert d.kind == "start"


def _price_files(root, cheap: dict[str, int]) -> None:
    """A year of hourly prices per region at 100 USD/MWh, 10 at each region's ``cheap`` hour of 2023-03-02."""
    from datetime import datetime, timedelta, timezone

    folder = root / "electricity" / "prices"
    folder.mkdir(parents=True)
    start = datetime(2023, 1, 1, tzinfo=timezone.utc)
    for region in ("DE-LU", "US-CAL-CISO", "SG"):
        lines = ["Datetime (UTC),Price (USD/MWh)"]
        for h in range(365 * 24):
            t = start + timedelta(hours=h)
            low = region in cheap and (t.month, t.day, t.hour) == (3, 2, cheap[region])
            lines.append(f"{t:%Y-%m-%d %H:%M:%S}+00:00,{10.0 if low else 100.0}")
        (folder / f"{region}_2023.csv").write_text("\n".join(lines) + "\n")


def test_a_deferrable_run_submitted_through_admission_starts_at_its_cheap_hour(ledger, tmp_path):
    """The production queue, its prices from the federation's grid regions, and its clock moved by the test."""
    from datetime import datetime, timezone

    from federations import embedded

    from crosscloud.core.job import JobSpec
    from crosscloud.energy.prices import CsvFeed
    from crosscloud.scheduler.admission import NotAdmitted, admit
    from crosscloud.scheduler.prices import federation_rates
    from crosscloud.scheduler.service import Queue

    _price_files(tmp_path, {"US-CAL-CISO": 5})  # shanghai's grid is cheap at 05:00
    fed, now = embedded(), [datetime(2026, 3, 2, tzinfo=timezone.utc).timestamp()]  # day 61: 2 March in 2023 too
    feed = CsvFeed(tmp_path)
    queue = Queue(fed, ledger, clock=lambda: now[0], rates=lambda t: federation_rates(fed, t, feed))
    spec = JobSpec(placement="auto", devices=1, deferrable=True, deadline="12", rounds=2, model_size="tiny")
    with pytest.raises(NotAdmitted, match=r"deferred by cost to 2026-03-02 05:00 UTC \(5 h from now\) on shanghai"):
        admit(fed, spec, "night-run", "byte-lm", 0, set(), ledger, queue=queue)
    assert ledger.active() == []  # it holds nothing while it waits
    now[0] += 5 * 3600
    got = admit(fed, spec, "night-run", "byte-lm", 0, set(), ledger, queue=queue)
    assert [(p.cloud, p.devices) for p in got.parts] == [("shanghai", 1)]
    from crosscloud.scheduler.entry import decision_from_json

    started = decision_from_json(ledger.queue.get("team-a", "night-run").decision)
    # it saved the energy of 90 USD/MWh on one device for its run, against starting when first planned
    assert started.first_cost[0] > started.first_cost[0] - started.saved[0] > 0 and started.saved[0] > 0


def _running(run_id, devices=2, left_h=3.0, deadline_h=10.0, cloud="A"):
    """A running deferrable run holding ``devices`` of ``cloud`` with ``left_h`` of work left."""
    from dataclasses import replace

    from crosscloud.scheduler.pauses import Running

    e = replace(_entry(run_id, devices=devices, runtime_h=left_h, deadline_h=deadline_h, at=NOW - H),
                parts=((cloud, "gpu", devices),))
    return Running(e, NOW + left_h * H)


def _holding(world, r):
    """The world with ``r``'s devices held until its expected end."""
    for c, a, n in r.entry.parts:
        world.free[(c, a)] -= n
        world.releases.setdefault((c, a), []).append((r.until, n))
        world.sites["f"] = [s if s.cloud != c else type(s)(**{**s.__dict__, "free": s.free - n}) for s in world.sites["f"]]
    return world


SPIKE_NOW = [50, 50, 1, 1, 1, 1, 1] + [50] * 200  # dear now and next hour, cheap from hour 2


def test_a_running_deferrable_run_is_paused_at_a_price_spike_and_planned_for_the_cheap_hours():
    r = _running("long", left_h=3.0, deadline_h=10.0)
    result = run_pass([], _holding(_world(), r), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW), running=[r])
    [(entry, d)] = result.paused
    assert entry.key == ("t", "long") and d.kind == "pause"
    assert d.planned_at == NOW + 2 * H and d.parts == (("A", "gpu", 2),)
    assert "paused after its next committed round" in d.reason and "every deferred deadline" in d.reason


def test_no_pause_when_the_deadline_would_lose_its_schedule_or_waiting_does_not_pay():
    tight = _running("tight", left_h=3.0, deadline_h=3.5)  # 3 h of work started at hour 1 would end past 3.5
    result = run_pass([], _holding(_world(), tight), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW), running=[tight])
    assert result.paused == []
    flat = _running("flat", left_h=3.0)
    result = run_pass([], _holding(_world(), flat), NOW, lambda *a: 0.0, rates=_rates([5.0] * 200), running=[flat])
    assert result.paused == []
    # a few minutes of work left: a pause costs more than the spike does
    short = _running("short", left_h=0.04)
    result = run_pass([], _holding(_world(), short), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW), running=[short])
    assert result.paused == []


def test_a_paused_run_resumes_on_exactly_the_devices_of_its_saved_state():
    from dataclasses import replace

    paused = replace(_entry("p", devices=2, runtime_h=1.0, deadline_h=10.0, deferrable=False),
                     parts=(("B", "gpu", 2),))
    world = _world(clouds=("A", "B"))
    world.free[("B", "gpu")] = 1  # B is busy: it waits for B, though A is free and cheaper
    world.sites["f"] = [replace(s, free=1) if s.cloud == "B" else s for s in world.sites["f"]]
    d = run_pass([paused], world, NOW, lambda *a: 0.0).decisions[("t", "p")]
    assert d.kind == "reserve" and d.parts == (("B", "gpu", 2),) and "where its saved state is" in d.reason
    world = _world(clouds=("A", "B"))
    result = run_pass([paused], world, NOW, lambda *a: 0.0)
    [(_, started)] = result.started
    assert started.parts == (("B", "gpu", 2),) and "resumes now" in started.reason


def test_no_pause_that_would_leave_a_waiting_run_s_deadline_without_a_schedule():
    # 2 devices: r holds both with 3 h left; w (3 h on both) waits; both due by hour 7. Paused, r would run from
    # hour 1 at the earliest and w after it (or the reverse), past hour 7: the guard keeps r running
    r = _running("r", devices=2, left_h=3.0, deadline_h=7.0)
    w = _entry("w", devices=2, runtime_h=3.0, deadline_h=7.0)
    result = run_pass([w], _holding(_world(devices=2), r), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW), running=[r])
    assert result.paused == []
    alone = _running("r", devices=2, left_h=3.0, deadline_h=7.0)  # without w it would be paused
    result = run_pass([], _holding(_world(devices=2), alone), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW),
                      running=[alone])
    assert [d.kind for _, d in result.paused] == ["pause"]


def test_a_paused_run_is_not_paused_again_and_keeps_slack_for_later_work():
    from dataclasses import replace

    once = _running("once", left_h=3.0, deadline_h=10.0)
    again = type(once)(replace(once.entry, paused_before=True), once.until)
    result = run_pass([], _holding(_world(), again), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW), running=[again])
    assert result.paused == []
    # resumed at hour 2 it would end at 5: a deadline at 6 leaves 1 h, under half its 3 h of work
    thin = _running("thin", left_h=3.0, deadline_h=6.0)
    result = run_pass([], _holding(_world(), thin), NOW, lambda *a: 0.0, rates=_rates(SPIKE_NOW), running=[thin])
    assert result.paused == []


def test_a_run_that_must_start_now_and_finds_no_devices_pauses_a_running_deferrable_one():
    r = _running("r", devices=4, left_h=2.0, deadline_h=20.0)  # all of A, much slack left
    due = _entry("due", devices=4, runtime_h=2.0, deadline_h=2.5)  # it must start now
    flat = _rates([5.0] * 200)  # no price reason to pause
    result = run_pass([due], _holding(_world(), r), NOW, lambda *a: 0.0, rates=flat, running=[r],
                      make_room_for_due=False)
    assert result.paused == [] and result.decisions[("t", "due")].kind != "start"
    result = run_pass([due], _holding(_world(), r), NOW, lambda *a: 0.0, rates=flat, running=[r],
                      make_room_for_due=True)
    [(paused, d)] = result.paused
    assert paused.key == ("t", "r") and "to make room for t/due" in d.reason


def test_a_late_arrival_no_schedule_fits_with_the_admitted_work_is_named_and_takes_nothing_from_it():
    from crosscloud.scheduler.entry import Decision

    # one device; "admitted" (in the queue since the last pass) must start by hour 1, "late" (just submitted) now:
    # both cannot finish in time, so "late" is named at submission and runs only where it costs no admitted deadline
    admitted = _entry("admitted", runtime_h=2.0, deadline_h=3.0, at=NOW - H)
    late = _entry("late", runtime_h=2.0, deadline_h=2.5)
    previous = {admitted.key: Decision("plan", "deferred")}
    result = run_pass([admitted, late], _world(devices=1), NOW, lambda *a: 0.0, previous,
                      rates=_rates([5.0] * 200))
    d = result.decisions
    assert d[("t", "admitted")].kind == "start"
    assert d[("t", "late")].kind != "start" and "cannot be met with the work admitted before it" in d[("t", "late")].at_risk
    # the name is carried: the next pass does not protect it either
    again = run_pass([late], _world(devices=1), NOW, lambda *a: 0.0, {late.key: d[("t", "late")]},
                     rates=_rates([5.0] * 200)).decisions[("t", "late")]
    assert again.kind == "start" and again.at_risk


def test_a_run_ends_by_its_deadline_from_its_last_start():
    from crosscloud.scheduler.deadlines import Item
    from crosscloud.scheduler.timing import occupancy

    # 42.2 h of work due at hour 44.1: from hour 2 it would end at 44.2
    assert Item("x", 44.1, (0,), devices=1, occ=occupancy(42.2)).last_start == 1
    assert Item("x", 44.0, (0,), devices=1, occ=occupancy(42.0)).last_start == 2


def test_a_run_as_cheap_now_as_later_starts_now_however_small_its_cost():
    # a short run costing a thousandth of a dollar: the joint plan's equal hours go to the earliest
    d = _pass([_entry("tiny", runtime_h=0.05)], _world(), _rates([2e-3] * 3 + [9] * 200)).decisions[("t", "tiny")]
    assert d.kind == "start"


def test_the_work_expected_again_is_what_could_not_wait_in_the_last_day():
    from dataclasses import replace

    from crosscloud.scheduler.expected import expected_work

    urgent = _entry("urgent", runtime_h=2.0, deadline_h=3.0 - 20, at=NOW - 20 * H)  # 1 h of slack, 20 h ago
    flexible = _entry("flexible", runtime_h=2.0, deadline_h=26.0 - 20, at=NOW - 20 * H)  # 24 h of slack
    old = _entry("old", runtime_h=2.0, deadline_h=3.0 - 30, at=NOW - 30 * H)  # more than a day ago
    paused = replace(urgent, run_id="paused", parts=(("A", "gpu", 1),))
    plain = replace(_entry("plain", runtime_h=2.0, at=NOW - 2 * H), deadline=None, deferrable=False)
    named = replace(urgent, run_id="expected:named")  # a real run may be named so (":" is allowed, "/" is not)
    got = {e.run_id: e for e in expected_work([urgent, flexible, old, paused, plain, named], NOW)}
    assert set(got) == {"expected/urgent", "expected/plain", "expected/expected:named"}
    again = got["expected/urgent"]
    assert again.submitted_at == urgent.submitted_at + 24 * H and again.deadline == urgent.deadline + 24 * H
    # a run without a deadline is expected to start as it arrives
    assert got["expected/plain"].deadline == NOW + 22 * H + 2 * H and got["expected/plain"].deferrable


def test_a_deferred_run_leaves_the_cheap_device_to_the_urgent_work_expected_then():
    # one device on A, cheap at hours 2-5; B is dear. Yesterday an urgent run (1 h of slack) came at this hour + 2:
    # the flexible run planned alone takes hours 2-3; expecting that work again, it takes hours 4-5 and leaves
    # the expected run the cheap hours it has no time to wait past. The expected run is never decided or held.
    rates = Rates(int(NOW // H), {("A", "gpu"): np.asarray([5, 5, 1, 1, 1, 1] + [5] * 200, dtype=float),
                                  ("B", "gpu"): np.full(206, 9.0)})
    flexible = _entry("flexible", runtime_h=2.0, deadline_h=20.0)
    yesterday = _entry("urgent", runtime_h=2.0, deadline_h=2.0 + 3.0 - 24, at=NOW + 2 * H - 24 * H)
    world = lambda: _world(devices=1, clouds=("A", "B"))  # noqa: E731
    alone = run_pass([flexible], world(), NOW, lambda *a: 0.0, rates=rates).decisions[("t", "flexible")]
    assert alone.kind == "plan" and alone.planned_at == NOW + 2 * H
    w = world()
    result = run_pass([flexible], w, NOW, lambda *a: 0.0, rates=rates, recent=[flexible, yesterday])
    d = result.decisions[("t", "flexible")]
    assert d.kind == "plan" and d.planned_at == NOW + 4 * H and d.parts == (("A", "gpu", 1),)
    assert "leaving room for 1 run(s) expected to arrive" in d.reason
    assert set(result.decisions) == {("t", "flexible")} and not result.started and w.free == {("A", "gpu"): 1, ("B", "gpu"): 1}


def test_a_run_that_must_start_now_takes_the_cheapest_pool_it_may_use_not_the_emptiest():
    # A is cheapest but the tenant's quota there is spent; B has one device at 3 USD; C is empty at 9 USD, which
    # placement alone would prefer (the least used)
    totals, free = {"A": 2, "B": 2, "C": 4}, {"A": 2, "B": 1, "C": 4}
    sites = [Site(c, "gpu", "X", totals[c], free[c], families=frozenset({"f"})) for c in totals]

    def world():
        return World({"f": sites}, {(c, "gpu"): n for c, n in free.items()}, {("B", "gpu"): [(NOW + 5 * H, 1)]},
                     quota_left={"t": {"A": 0, "B": 2, "C": 4}})

    rates = Rates(int(NOW // H), {(c, "gpu"): np.full(200, usd) for c, usd in (("A", 2.0), ("B", 3.0), ("C", 9.0))})
    d = _pass([_entry("due", runtime_h=2.0, deadline_h=2.0)], world(), rates).decisions[("t", "due")]
    assert d.kind == "start" and d.parts == (("B", "gpu", 1),), d.reason
    flat = Rates(int(NOW // H), {(c, "gpu"): np.full(200, 3.0) for c in totals})
    d = _pass([_entry("due", runtime_h=2.0, deadline_h=2.0)], world(), flat).decisions[("t", "due")]
    assert d.parts == (("C", "gpu", 1),), d.reason  # prices equal: placement's own choice, the least used
