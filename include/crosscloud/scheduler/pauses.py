"""Pausing a running deferrable run for prices: it stops after a committed round, waits, and resumes where it was.

Each pass looks at the running runs that are deferrable and have a deadline.
The work one has left (``Running.entry``: its estimated run time times the
share of rounds it has not trained) is planned as a waiting run's would be
(``timing.Timing.choose``), on the devices it holds, since only its clouds
keep its saved states. It is paused when all of these hold:

- the plan's cheapest (or cleanest) start for that work is a later hour;
- waiting pays for the pause itself: the work left, lengthened by
  ``restart_s()`` (stopping after the round, starting its sub-tasks again,
  the round in flight trained again), costs less at the later hour than
  running on now costs;
- resumed at that hour, it still has half its work left (``SLACK_KEPT``) as
  slack before its deadline, for work that arrives meanwhile;
- the deadline guard keeps a schedule: with the run waiting too, an EDF
  schedule of every protected deadline from the next hour on still exists
  (``deadlines.witness``). Prices never enter that rule.

A run is paused at most once. A run that must start within the hour to meet
its deadline and finds no devices may also pause some (``make_room``):
running deferrable runs on a pool it may use, the latest deadlines first,
when the guard keeps a schedule for every protected deadline with the urgent
run holding those devices and the paused runs waiting. The urgent run starts
at the next pass, once they have stopped after their round and given the
devices back.

A paused run releases its devices once its sub-tasks have committed the
round and stopped; it then waits in the queue as any deferrable run does,
for exactly the devices it had (``Entry.parts``), and each pass plans it
again, so a worse forecast starts it early and never loses its deadline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from crosscloud.scheduler.entry import Decision, Entry
from crosscloud.scheduler.timing import Choice, Key, Timing, kg_text, utc_hour

# seconds of its devices a pause costs: the sub-tasks' stop after the round and their start again (interpreter,
# framework, program, saved state), and the part of a round trained when the pause was asked for;
# $CROSSCLOUD_PAUSE_COST_S sets a deployment's own (its images preheated, its models' sizes)
RESTART_S = 180.0
# a run paused for prices keeps this share of its work left as slack after its planned resume (measured on
# bench-electricity: pausing into the last slack made later urgent arrivals miss)
SLACK_KEPT = 0.5


def restart_s() -> float:
    """What a pause costs here, in seconds of the run's devices."""
    return float(os.environ.get("CROSSCLOUD_PAUSE_COST_S") or RESTART_S)


@dataclass(frozen=True)
class Running:
    """A running run as a pass sees it: ``entry.parts`` the devices it holds, ``entry.runtime_s`` its work left."""

    entry: Entry
    until: float  # epoch seconds its devices are expected back (as the pass's world holds them)


def pausable(entry: Entry) -> bool:
    """Whether the run may be paused: deferrable, with a deadline, never paused before (no run is paused back and
    forth), and with more work left than a pause costs."""
    return (entry.deferrable and entry.deadline is not None and entry.parts is not None and not entry.paused_before
            and entry.runtime_s > restart_s())


def decide_pauses(running: Iterable[Running], timing: Timing) -> list[tuple[Entry, Decision]]:
    """The runs to pause at this pass, each planned in ``timing`` for the hours it waits for."""
    out = []
    for r in running:
        if not pausable(r.entry):
            continue
        decision = _pause(r, timing)
        if decision is not None:
            out.append((r.entry, decision))
    return out


def _release(timing: Timing, r: Running, sign: int) -> None:
    """Give the run's devices back to the calendar (``sign`` 1), or take them again (-1)."""
    for cloud, accelerator, n in r.entry.parts:
        timing.hold((cloud, accelerator), -sign * n, r.until)


def resumed(entry: Entry) -> Entry:
    """What a paused run asks for when it waits again: its work left and a pause's cost, on the devices it held."""
    return replace(entry, runtime_s=entry.runtime_s + restart_s(), paused_before=True)


def _pause(r: Running, timing: Timing) -> Decision | None:
    entry, keys = resumed(r.entry), [(c, a) for c, a, _ in r.entry.parts]
    _release(timing, r, 1)
    choice = timing.choose(entry, keys)
    if choice is None or choice.start == 0 or not _pays(entry, choice) or not _slack_kept(entry, choice, timing):
        _release(timing, r, -1)
        return None
    timing.admit(entry, keys)
    if not timing.keeps_deadlines():
        timing.started(entry)  # its deadline would lose its schedule: it runs on
        _release(timing, r, -1)
        return None
    timing.defer(entry, choice)
    return _decision(entry, choice, timing)


def _slack_kept(entry: Entry, choice: Choice, timing: Timing) -> bool:
    """Whether, resumed at the chosen hour, the run still has ``SLACK_KEPT`` of its work left as slack before its
    deadline: the guard knows only the work waiting now, and work that arrives later needs room too."""
    end = (timing.h0 + choice.start) * 3600 + entry.runtime_s
    return entry.deadline - end >= SLACK_KEPT * entry.runtime_s


def _pays(entry: Entry, choice: Choice) -> bool:
    """Whether the work left, lengthened by a pause's cost (``entry`` is ``resumed``), is cheaper at the chosen
    hour than the work left run on now."""
    return choice.value < choice.value_now * (1 - restart_s() / entry.runtime_s)


def _decision(entry: Entry, choice: Choice, timing: Timing) -> Decision:
    at = (timing.h0 + choice.start) * 3600
    saving = 100 * (1 - choice.value / choice.value_now) if choice.value_now > 0 else 0.0
    return Decision("pause", f"paused after its next committed round by {entry.objective}: resumes {utc_hour(at)} "
                    f"({choice.start} h from now) on the devices it holds, {saving:.0f} % less for its work left "
                    f"(USD {choice.usd:.4f} vs {choice.usd_now:.4f}{kg_text(choice)}); every deferred deadline still "
                    "has a schedule", entry.parts, at - timing.now, planned_at=at, runtime_s=entry.runtime_s)


def make_room(due: list[Entry], running: list[Running], timing: Timing, eligible: Callable[[Entry], list[Key]],
              room: Callable[[str, Key], int], taken: set[tuple[str, str]]) -> list[tuple[Entry, Decision]]:
    """Pause running deferrable runs so that the due runs that found no devices start at the next pass."""
    out = []
    for entry in due:
        if entry.parts is not None or entry.spread is not None:  # one pool's devices: what a pause can free
            continue
        for key in eligible(entry):
            victims = _victims(entry, key, [r for r in running if r.entry.key not in taken], room)
            if victims and _keeps_deadlines(entry, victims, key, timing):
                taken.update(r.entry.key for r in victims)
                out += [(r.entry, _room_decision(r.entry, entry, timing)) for r in victims]
                break
    return out


def _victims(entry: Entry, key: Key, running: list[Running], room: Callable[[str, Key], int]) -> list[Running]:
    """The fewest runs on pool ``key``, latest deadlines first, whose devices with what is free give ``entry`` all
    it needs; none when they cannot."""
    need, got, out = entry.request.devices - room(entry.tenant, key), 0, []
    for r in sorted(running, key=lambda r: -r.entry.deadline):
        held = sum(n for c, a, n in r.entry.parts if (c, a) == key)
        if held and got < need:
            out.append(r)
            got += held
    return out if got >= need > 0 else []


def _keeps_deadlines(entry: Entry, victims: list[Running], key: Key, timing: Timing) -> bool:
    """Whether, with ``entry`` running on ``key`` and ``victims`` waiting, every protected deadline keeps a
    schedule; if so the calendar is left that way, else as it was."""
    saved = timing.items.get(entry.key)
    for r in victims:
        _release(timing, r, 1)
        timing.admit(resumed(r.entry), [(c, a) for c, a, _ in r.entry.parts])
    timing.hold(key, entry.request.devices, timing.now + entry.runtime_s)
    timing.started(entry)
    if timing.keeps_deadlines():
        return True
    if saved is not None:
        timing.items[entry.key] = saved
    timing.hold(key, -entry.request.devices, timing.now + entry.runtime_s)
    for r in victims:
        timing.started(r.entry)
        _release(timing, r, -1)
    return False


def _room_decision(paused: Entry, due: Entry, timing: Timing) -> Decision:
    later = resumed(paused)
    choice = timing.choose(later, [(c, a) for c, a, _ in paused.parts])
    at = None if choice is None else (timing.h0 + choice.start) * 3600
    if choice is not None:
        timing.defer(later, choice)
    when = "as soon as its devices are free" if at is None else f"planned {utc_hour(at)}"
    return Decision("pause", f"paused after its next committed round to make room for {due.tenant}/{due.run_id}, "
                    f"whose deadline is due; it still ends in time: resumes {when} on the devices it holds",
                    paused.parts, None if at is None else at - timing.now, planned_at=at, runtime_s=later.runtime_s)
