"""The soak's checker fed histories with planted violations: each one is found and named, and a clean one passes."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from crosscloud.soak import (
    BaselineLoss,
    CloudCapacity,
    FaultInjected,
    FinalLoss,
    GlobalCommitted,
    History,
    HistoryEnded,
    HistoryError,
    ObjectCommitted,
    ObjectObserved,
    ObjectRetired,
    ReservationHeld,
    RoundSpent,
    RunEnded,
    RunSubmitted,
    SubtaskLived,
    check,
    decode,
    encode,
    read_history,
)

pytestmark = pytest.mark.soak

GRACE = 10.0
SHA_G, SHA_C = "a" * 64, "c" * 64


def _clean() -> list:
    """Two runs on two clouds under two faults: every invariant holds, and goodput is 540 / 600 device-seconds."""
    return [
        CloudCapacity(1000, "beijing", 4),
        CloudCapacity(1000, "shanghai", 2),
        RunSubmitted(1000, "r1", "team-a", "lm"),
        ReservationHeld(1000, "r1", "beijing", 2, 1000, 1100, 30),
        ReservationHeld(1000, "r1", "shanghai", 2, 1000, 1100, 30),
        SubtaskLived(1000, "r1", "beijing", 2, 1000, 1100),
        SubtaskLived(1000, "r1", "shanghai", 2, 1000, 1100),
        FaultInjected(1040, "kill-subtask", "r1@beijing", 1040, 1041),
        RoundSpent(1050, "r1", "beijing", 1, 2, 1000, 1050, True),  # 100 kept
        RoundSpent(1050, "r1", "shanghai", 1, 2, 1000, 1050, True),  # 100 kept
        GlobalCommitted(1050, "r1", 1, "beijing", "d1"),
        GlobalCommitted(1050, "r1", 1, "shanghai", "d1"),
        ObjectCommitted(1050, "s3-beijing", "r1/global-1", SHA_G, 100),
        ObjectCommitted(1050, "s3-beijing", "r1/ckpt-1", SHA_C, 50),
        RunSubmitted(1050, "r2", "team-b", "lm"),
        ReservationHeld(1050, "r2", "beijing", 2, 1050, 1150, 30),
        SubtaskLived(1050, "r2", "beijing", 2, 1050, 1150),
        RoundSpent(1070, "r1", "beijing", 2, 2, 1050, 1070, False),  # 40 thrown away: redone after the fault
        FaultInjected(1080, "store-503", "s3-shanghai", 1080, 1140),
        RoundSpent(1100, "r1", "beijing", 2, 2, 1070, 1100, True),  # 60 kept
        RoundSpent(1100, "r1", "shanghai", 2, 2, 1050, 1100, True),  # 100 kept
        ObjectRetired(1100, "s3-beijing", "r1/ckpt-1", "the run's cleanup"),
        FinalLoss(1100, "r1", "lm", 2.04),
        RunEnded(1100, "r1", "succeeded", ""),
        ObjectObserved(1120, "s3-beijing", "r1/global-1", SHA_G, 100),
        ObjectObserved(1120, "s3-beijing", "r1/ckpt-1", None, None),
        RoundSpent(1140, "r2", "beijing", 1, 2, 1050, 1140, True),  # 180 kept
        GlobalCommitted(1140, "r2", 1, "beijing", "d2"),
        RunEnded(1150, "r2", "failed", "deadline missed"),
        BaselineLoss(1200, "lm", 2.0),
        HistoryEnded(1300),
    ]


def _swap(events: list, old, new) -> list:
    """The history with one event replaced (None drops it)."""
    assert old in events
    return [new if e == old else e for e in events if e != old or new is not None]


def _named(report) -> set[tuple[str, str]]:
    return {(v.invariant, v.subject) for v in report.violations}


def test_a_clean_history_holds_every_invariant_and_gives_exact_figures():
    report = check(_clean(), GRACE)
    assert report.violations == [] and report.ok
    assert report.goodput == pytest.approx(540 / 600)
    assert report.line() == (
        "faults_injected=2 runs_submitted=2 runs_completed=1 committed_bytes_lost=0 invariant_violations=0 "
        "leaked_reservations=0 orphan_subtasks=0 goodput=0.900"
    )


def test_a_run_with_no_end_hangs():
    events = _swap(_clean(), RunEnded(1150, "r2", "failed", "deadline missed"), None)
    report = check(events, GRACE)
    assert _named(report) == {("run_ends", "r2")}
    assert "hangs" in report.violations[0].detail and report.invariant_violations == 1


def test_a_failed_run_without_a_reason_is_a_violation():
    events = _swap(_clean(), RunEnded(1150, "r2", "failed", "deadline missed"), RunEnded(1150, "r2", "failed", " "))
    report = check(events, GRACE)
    assert _named(report) == {("run_ends", "r2")}
    assert "without a stated reason" in report.violations[0].detail


def test_a_run_that_ends_twice_differently_is_a_violation():
    report = check(_clean() + [RunEnded(1160, "r1", "failed", "oops")], GRACE)
    assert _named(report) == {("run_ends", "r1")}


def test_a_committed_object_that_changes_is_found_and_its_bytes_counted():
    events = _clean() + [ObjectObserved(1200, "s3-beijing", "r1/global-1", "b" * 64, 100),
                         ObjectObserved(1210, "s3-beijing", "r1/global-1", "b" * 64, 100)]
    report = check(events, GRACE)
    assert _named(report) == {("committed_unchanged", "s3-beijing/r1/global-1")}
    assert report.committed_bytes_lost == 100 and report.invariant_violations == 1  # judged once


def test_a_committed_object_overwritten_by_another_commit_is_found():
    report = check(_clean() + [ObjectCommitted(1200, "s3-beijing", "r1/global-1", "b" * 64, 90)], GRACE)
    assert _named(report) == {("committed_unchanged", "s3-beijing/r1/global-1")}
    assert "recommitted" in report.violations[0].detail and report.committed_bytes_lost == 100


def test_a_committed_object_that_goes_missing_is_lost():
    report = check(_clean() + [ObjectObserved(1200, "s3-beijing", "r1/global-1", None, None)], GRACE)
    assert _named(report) == {("committed_unchanged", "s3-beijing/r1/global-1")}
    assert "missing" in report.violations[0].detail and report.committed_bytes_lost == 100


def test_a_retired_object_missing_is_not_lost_but_missing_before_its_retirement_is():
    clean = check(_clean(), GRACE)  # r1/ckpt-1 is observed missing after the run's cleanup retired it
    assert clean.committed_bytes_lost == 0 and clean.ok
    early = _clean() + [ObjectObserved(1090, "s3-beijing", "r1/ckpt-1", None, None)]
    report = check(early, GRACE)
    assert _named(report) == {("committed_unchanged", "s3-beijing/r1/ckpt-1")}
    assert report.committed_bytes_lost == 50


def test_two_runs_over_a_clouds_devices_past_the_grace_are_found():
    events = _clean() + [SubtaskLived(1080, "r2", "beijing", 2, 1080, 1100)]  # 6 of 4 devices for 20 s
    report = check(events, GRACE)
    assert _named(report) == {("devices_exclusive", "beijing")}
    assert "r1, r2" in report.violations[0].detail and "20.000 s" in report.violations[0].detail


def test_an_overlap_shorter_than_the_grace_is_fine():
    events = _clean() + [SubtaskLived(1095, "r2", "beijing", 2, 1095, 1100)]  # 6 of 4 devices for 5 s
    assert check(events, GRACE).ok


def test_one_run_over_capacity_alone_is_not_two_runs_holding_a_device():
    events = _clean() + [SubtaskLived(1060, "r1", "shanghai", 2, 1060, 1100)]  # a restart overlapping itself
    assert not {v.invariant for v in check(events, GRACE).violations} & {"devices_exclusive"}


def test_a_drained_cloud_makes_two_runs_over_its_capacity():
    events = _clean() + [CloudCapacity(1060, "beijing", 3)]  # r1 and r2 hold 4 of 3 from 1060 to 1100
    report = check(events, GRACE)
    assert _named(report) == {("devices_exclusive", "beijing")}


def test_a_reservation_past_its_runs_end_lease_and_grace_is_found():
    old = ReservationHeld(1000, "r1", "beijing", 2, 1000, 1100, 30)
    within = check(_swap(_clean(), old, dataclasses.replace(old, end=1140)), GRACE)
    assert within.ok
    report = check(_swap(_clean(), old, dataclasses.replace(old, end=1141)), GRACE)
    assert _named(report) == {("reservation_bounded", "r1@beijing")} and report.leaked_reservations == 1


def test_a_still_open_reservation_of_an_ended_run_is_a_leak():
    old = ReservationHeld(1050, "r2", "beijing", 2, 1050, 1150, 30)
    report = check(_swap(_clean(), old, dataclasses.replace(old, end=None)), GRACE)
    assert _named(report) == {("reservation_bounded", "r2@beijing")}
    assert "leaked" in report.violations[0].detail and report.leaked_reservations == 1
    assert "leaked_reservations=1" in report.line() and "invariant_violations=1" in report.line()


def test_a_subtask_past_its_runs_end_and_grace_is_an_orphan():
    old = SubtaskLived(1000, "r1", "shanghai", 2, 1000, 1100)
    assert check(_swap(_clean(), old, dataclasses.replace(old, end=1110)), GRACE).ok
    report = check(_swap(_clean(), old, dataclasses.replace(old, end=1111)), GRACE)
    assert _named(report) == {("subtask_bounded", "r1@shanghai")} and report.orphan_subtasks == 1


def test_a_subtask_still_alive_at_the_end_of_an_ended_run_is_an_orphan():
    old = SubtaskLived(1000, "r1", "shanghai", 2, 1000, 1100)
    report = check(_swap(_clean(), old, dataclasses.replace(old, end=None)), GRACE)
    assert _named(report) == {("subtask_bounded", "r1@shanghai")}
    assert "orphan" in report.violations[0].detail and report.orphan_subtasks == 1
    assert report.goodput == pytest.approx(540 / (600 + 2 * 200))  # it burns devices until the history ends


def test_globals_of_one_round_that_disagree_are_found():
    old = GlobalCommitted(1050, "r1", 1, "shanghai", "d1")
    report = check(_swap(_clean(), old, dataclasses.replace(old, digest="dX")), GRACE)
    assert _named(report) == {("globals_agree", "r1 round 1")}
    assert "beijing=d1, shanghai=dX" in report.violations[0].detail


def test_a_final_loss_far_from_the_baseline_is_found_and_the_tolerance_is_a_parameter():
    old = FinalLoss(1100, "r1", "lm", 2.04)
    events = _swap(_clean(), old, dataclasses.replace(old, loss=2.2))  # 10 % off
    report = check(events, GRACE)
    assert _named(report) == {("loss_close", "r1")}
    assert check(events, GRACE, loss_tolerance=0.2).ok


def test_a_completed_run_without_a_baseline_or_a_final_loss_is_found():
    no_base = _swap(_clean(), BaselineLoss(1200, "lm", 2.0), None)
    assert _named(check(no_base, GRACE)) == {("loss_close", "r1")}
    no_loss = _swap(_clean(), FinalLoss(1100, "r1", "lm", 2.04), None)
    assert _named(check(no_loss, GRACE)) == {("loss_close", "r1")}


def test_a_history_cut_off_before_its_end_ends_at_its_latest_time():
    events = _swap(_clean(), HistoryEnded(1300), None)
    assert check(events, GRACE).ok


def test_the_history_round_trips_through_its_file_from_many_threads(tmp_path):
    path = tmp_path / "soak.jsonl"
    events = _clean()
    with History(path) as history:
        history.append(events[0])
        workers = [threading.Thread(target=lambda e=e: history.append(e)) for e in events[1:]]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    back = read_history(path)
    assert sorted(back, key=encode) == sorted(events, key=encode)
    assert back[0] == events[0] and len(path.read_text().splitlines()) == len(events)
    with History(path) as history:  # appends to what is there
        history.append(HistoryEnded(1400))
    assert read_history(path)[-1] == HistoryEnded(1400)
    assert check(read_history(path), GRACE).ok


def test_an_event_encodes_with_its_kind_and_decodes_to_itself():
    event = SubtaskLived(1000, "r1", "beijing", 2, 1000, None)
    line = encode(event)
    assert line.startswith('{"kind":"subtask_lived",') and decode(line) == event


def test_a_malformed_line_names_its_line(tmp_path):
    path = tmp_path / "soak.jsonl"
    path.write_text(encode(HistoryEnded(1)) + "\n\n" + '{"kind": "history_ended", "t": 1\n')
    with pytest.raises(HistoryError, match=r"soak\.jsonl line 3: not a JSON object"):
        read_history(path)


@pytest.mark.parametrize("line, says", [
    ('{"kind": "meteor_strike", "t": 1}', "line 1: unknown event kind 'meteor_strike'"),
    ('{"t": 1}', "line 1: unknown event kind None"),
    ('[1, 2]', "line 1: not a JSON object"),
    ('{"kind": "run_ended", "t": 1, "run": "r1", "state": "failed"}',
     r"line 1: run_ended has missing fields \['reason'\]"),
    ('{"kind": "cloud_capacity", "t": 1, "cloud": "b", "devices": "4"}', "line 1: cloud_capacity.devices must be int"),
    ('{"kind": "round_spent", "t": 1, "run": "r", "cloud": "b", "round": 1, "devices": 1, "start": 0, "end": 1, '
     '"kept": 1}', "line 1: round_spent.kept must be bool"),
    ('{"kind": "history_ended", "t": null}', "line 1: history_ended.t must be float"),
])
def test_a_line_that_is_no_event_names_its_line_and_why(tmp_path, line, says):
    path = tmp_path / "soak.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(HistoryError, match=says):
        read_history(path)
