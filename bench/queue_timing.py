"""The electricity benchmark's work through the production queue, hour by hour on a simulated clock.

Each training job becomes a queue entry (placement ``auto`` on the clouds it
may use, ``deferrable`` with its deadline, the benchmark's ``--objective``),
each daily batch one entry of ``batch_devices`` devices for its device-hours
(the queue does not split a run over hours). Every hour the driver finishes
the runs that ended, adds the arrivals and runs ``crosscloud.scheduler``'s
pass with the prices and carbon a decision then sees (known, else forecast):
the same ``run_pass`` and ``Timing`` every DAG run's admission goes through.
It only advances the clock, builds the pass's ``World`` from its own state and
records where and when each run started.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from crosscloud.energy.power import energy_price_per_device_hour
from crosscloud.pool.placement import JobRequest, Site
from crosscloud.scheduler.entry import Entry
from crosscloud.scheduler.passes import World, run_pass
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
              band: dict[str, float] | None = None) -> Schedule:
    """The schedule the production queue makes of the work, hours relative to ``t0``."""
    pending = entries(jobs, batches, t0, objective, batch_devices)
    sites = [Site(c.name, ACC, c.jurisdiction, int(c.devices), int(c.devices), families=frozenset({FAMILY}))
             for c in clouds]
    free = {(c.name, ACC): int(c.devices) for c in clouds}
    releases: dict[tuple[str, str], list[tuple[float, int]]] = {k: [] for k in free}
    out, waiting, previous, k = Schedule("queue"), [], {}, 0
    for hour in range(pending[0][0] if pending else 0, horizon):
        now = (t0 + hour) * 3600.0
        for key, got in releases.items():  # runs that ended give their devices back
            free[key] += sum(n for t, n in got if t <= now + 1e-6)
            got[:] = [(t, n) for t, n in got if t > now + 1e-6]
        while k < len(pending) and pending[k][0] <= hour:
            waiting.append(pending[k][1])
            k += 1
        if not waiting:
            if k >= len(pending):
                break
            continue
        world = World({FAMILY: [replace(s, free=free[(s.cloud, ACC)]) for s in sites]}, dict(free),
                      {key: list(v) for key, v in releases.items()})
        seen = rates(clouds, prices, carbon, t0 + hour, t0 + horizon, known_until, band)
        result = run_pass(waiting, world, now, lambda *a: 0.0, previous, rates=seen)
        started = set()
        for entry, d in result.started:
            for cloud, _, n in d.parts:
                free[(cloud, ACC)] -= n
                releases[(cloud, ACC)].append((now + entry.runtime_s, n))
                out.placements.append(Placement(entry.run_id, cloud, hour, n * entry.runtime_s / 3600,
                                                hour + entry.runtime_s / 3600, n))
            started.add(entry.key)
            if "cannot be met" in d.reason:
                out.infeasible[entry.run_id] = d.reason.split(";")[0]
        previous = {key: d for key, d in result.decisions.items() if d.kind != "start"}
        waiting = [e for e in waiting if e.key not in started]
    return _finish(out, jobs, batches, waiting)


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
