"""The electricity benchmark's work through the production queue, hour by hour on a simulated clock.

Each training job becomes a queue entry (placement ``auto`` on the clouds it
may use, ``deferrable`` with its deadline, the benchmark's ``--objective``),
each daily batch one entry of ``batch_devices`` devices for its device-hours
(the queue does not split a run over hours). Every hour the driver finishes
the runs that ended, adds the arrivals and runs ``crosscloud.scheduler``'s
pass with the prices and carbon a decision then sees (known, else forecast):
the same ``run_pass`` and ``Timing`` every DAG run's admission goes through.
A running run the pass pauses for prices stops at once (the hour's round
boundary) and waits again for the same devices with its work left plus
``pauses.restart_s()``, the cost of a pause (``pauses.resumed``). The driver only advances the clock,
builds the pass's ``World`` from its own state and records where and when each
run trained.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from crosscloud.energy.power import energy_price_per_device_hour
from crosscloud.pool.placement import JobRequest, Site
from crosscloud.scheduler.entry import Entry
from crosscloud.scheduler.expected import LAG_H
from crosscloud.scheduler.passes import World, run_pass
from crosscloud.scheduler.pauses import Running, resumed
from crosscloud.scheduler.timing import MAX_HOURS, Rates
from price_lp import BatchJob, CloudSpec, Placement, Schedule, TrainingJob

FAMILY = "bench"
ACC = "gpu"
View = Callable[[str, int, int, int], Sequence[float]]  # (region, decision hour, start, hours) -> values


def _entry(name: str, devices: int, runtime_h: float, arrival: int, deadline: float, allowed, t0: int,
           objective: str) -> Entry:
    req = JobRequest(name=name, tenant="bench", family=FAMILY, devices=devices, runtime_s={"*": runtime_h * 3600},
                     clouds=frozenset(allowed) if allowed else None, splittable=False)
    return Entry("bench", name, req, (t0 + arrival) * 3600.0, deadline=(t0 + deadline) * 3600.0, deferrable=True,
                 objective=objective, runtime_s=runtime_h * 3600)


def entries(jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], t0: int, objective: str,
            batch_devices: int) -> list[tuple[int, Entry]]:
    """(arrival hour, entry) of every job and batch."""
    out = [(j.arrival, _entry(j.name, j.devices, j.runtime_h, j.arrival, j.deadline, j.allowed, t0, objective))
           for j in jobs]
    for b in batches:
        out.append((b.arrival, _entry(b.name, batch_devices, b.device_hours / batch_devices, b.arrival, b.deadline,
                                      b.allowed, t0, objective)))
    return sorted(out, key=lambda x: (x[0], x[1].run_id))


def rates(clouds: Sequence[CloudSpec], prices: View, carbon: View | None, hour: int, horizon: int,
          known_until: Callable[[int], int] | None = None, band: dict[str, float] | None = None) -> Rates:
    """What a decision at absolute hour ``hour`` sees: USD (rental + energy) and kg CO2 per device-hour; hours past
    ``known_until`` are forecast, with ``band`` (USD/MWh per region, the forecast's error) on top."""
    n = max(1, min(MAX_HOURS, horizon - hour))
    usd, co2 = {}, {}
    extra = {(c.name, ACC): energy_price_per_device_hour(c.power_w, band[c.region], c.pue)
             for c in clouds if band and c.region in band}
    known = known_until(hour) - hour + 1 if known_until else MAX_HOURS
    for c in clouds:
        p = np.asarray(prices(c.region, hour, hour, n), dtype=float)
        usd[(c.name, ACC)] = c.rental + energy_price_per_device_hour(c.power_w, p, c.pue)
        if carbon is not None:
            try:
                g = np.asarray(carbon(c.region, hour, hour, n), dtype=float)
            except KeyError:
                continue
            co2[(c.name, ACC)] = g * c.power_w / 1000 * c.pue / 1000
    return Rates(hour, usd, co2, known, extra)


def run_queue(jobs: Sequence[TrainingJob], batches: Sequence[BatchJob], clouds: Sequence[CloudSpec], horizon: int,
              prices: View, t0: int, objective: str = "cost", carbon: View | None = None,
              batch_devices: int = 4, known_until: Callable[[int], int] | None = None,
              band: dict[str, float] | None = None, make_room: bool = True, expect: bool = True) -> Schedule:
    """The schedule the production queue makes of the work, hours relative to ``t0``."""
    pending = entries(jobs, batches, t0, objective, batch_devices)
    sites = [Site(c.name, ACC, c.jurisdiction, int(c.devices), int(c.devices), families=frozenset({FAMILY}))
             for c in clouds]
    sim = _Sim({(c.name, ACC): int(c.devices) for c in clouds}, Schedule("queue"), t0)
    waiting, previous, k = [], {}, 0
    for hour in range(pending[0][0] if pending else 0, horizon):
        now = (t0 + hour) * 3600.0
        sim.finish(now)
        while k < len(pending) and pending[k][0] <= hour:
            waiting.append(pending[k][1])
            k += 1
        # what the ledger holds of the last day's submissions: the pass expects that work again (``expected``)
        recent = [e for _, e in pending[:k] if e.submitted_at >= now - LAG_H * 3600] if expect else []
        if not waiting and not sim.running:
            if k >= len(pending):
                break
            continue
        seen = rates(clouds, prices, carbon, t0 + hour, t0 + horizon, known_until, band)
        for _ in range(3):  # a pause gives devices back, which is a change: the queue runs its next pass at once
            waiting, previous, paused = _pass(sim, sites, waiting, previous, now, seen, make_room, recent)
            if not paused:
                break
    return _finish(sim.out, jobs, batches, waiting)


def _pass(sim: _Sim, sites: list[Site], waiting: list[Entry], previous: dict, now: float, seen: Rates,
          make_room: bool = True, recent: Sequence[Entry] = ()):
    """One pass of the production queue at ``now``; the runs it starts run, those it pauses stop."""
    world = World({FAMILY: [replace(s, free=sim.free[(s.cloud, ACC)]) for s in sites]}, dict(sim.free),
                  {key: list(v) for key, v in sim.releases.items()})
    result = run_pass(waiting, world, now, lambda *a: 0.0, previous, rates=seen, running=sim.as_running(now),
                      make_room_for_due=make_room, recent=recent)
    started = set()
    for entry, d in result.started:
        sim.start(entry, d, now)
        started.add(entry.key)
        if "cannot be met" in d.reason:
            sim.out.infeasible[entry.run_id] = d.reason.split(";")[0]
    previous = {key: d for key, d in result.decisions.items() if d.kind != "start"}
    waiting = [e for e in waiting if e.key not in started]
    for entry, d in result.paused:  # it stops after its round: the driver stops it at once, charging the restart
        waiting.append(sim.pause(entry.key, now))
        previous[entry.key] = d
    return waiting, previous, bool(result.paused)


class _Sim:
    """The driver's own state: free devices, when running runs end, and the schedule so far."""

    def __init__(self, free: dict[tuple[str, str], int], out: Schedule, t0: int):
        self.free, self.out, self.t0 = free, out, t0
        self.releases: dict[tuple[str, str], list[tuple[float, int]]] = {key: [] for key in free}
        self.running: dict[tuple[str, str], tuple[Entry, tuple, float, float, list[int]]] = {}

    def finish(self, now: float) -> None:
        """Runs that ended give their devices back."""
        for key, got in self.releases.items():
            self.free[key] += sum(n for t, n in got if t <= now + 1e-6)
            got[:] = [(t, n) for t, n in got if t > now + 1e-6]
        self.running = {k: r for k, r in self.running.items() if r[3] > now + 1e-6}

    def start(self, entry: Entry, d, now: float) -> None:
        hour, end, placed = now / 3600 - self.t0, now + entry.runtime_s, []
        for cloud, _, n in d.parts:
            self.free[(cloud, ACC)] -= n
            self.releases[(cloud, ACC)].append((end, n))
            placed.append(len(self.out.placements))
            self.out.placements.append(Placement(entry.run_id, cloud, round(hour), n * entry.runtime_s / 3600,
                                                 hour + entry.runtime_s / 3600, n))
        self.running[entry.key] = (entry, tuple(d.parts), now, end, placed)

    def as_running(self, now: float) -> list[Running]:
        """What the pass may pause: each run with the devices it holds and its work left."""
        return [Running(replace(e, runtime_s=end - now, parts=parts), end)
                for e, parts, _, end, _ in self.running.values() if end - now > 1e-6]

    def pause(self, key: tuple[str, str], now: float) -> Entry:
        """Stop a run now; it waits again for the same devices with its work left and a restart's cost on top."""
        entry, parts, started, end, placed = self.running.pop(key)
        for cloud, _, n in parts:
            self.free[(cloud, ACC)] += n
            self.releases[(cloud, ACC)].remove((end, n))
        hours = (now - started) / 3600
        for i in placed:
            p = self.out.placements[i]
            self.out.placements[i] = replace(p, device_hours=p.devices * hours, end=p.start + hours)
        self.out.preempted.append(entry.run_id)
        return resumed(replace(entry, runtime_s=end - now, parts=parts))


def _finish(out: Schedule, jobs, batches, waiting: list[Entry]) -> Schedule:
    """Misses: work never started, and work that ended past its deadline."""
    deadline = {j.name: j.deadline for j in jobs} | {b.name: b.deadline for b in batches}
    for e in waiting:
        out.misses.append(e.run_id)
        out.unplaced.append(e.run_id)
    for p in out.placements:
        if p.end > deadline[p.job] + 1e-9 and p.job not in out.misses:
            out.misses.append(p.job)
    return out


def devices_for_batches(clouds: Sequence[CloudSpec]) -> int:
    """A batch runs on a few devices (a quarter of the smallest cloud, at least one), as a serving job would."""
    return max(1, math.floor(min(c.devices for c in clouds) / 4))
