"""Job traces in the Philly-derived Gavel format, and run times from Gavel's measured throughputs.

A trace file has one job a line, seven tab-separated fields and no header::

    job_type  command  num_steps_arg  needs_data_dir  total_steps  arrival_time_s  num_gpus

``simulation_throughputs.json`` maps a worker type to
``{"('<job_type>', <num_gpus>)": {"null": steps_per_s, "<co-located job>": [...], ...}}``.
Only the plain worker types (``k80``, ``p100``, ``v100``; not the ``*_unconsolidated``
ones) and the ``"null"`` entry (the job alone on its devices) are used.

The run time of a job on an accelerator type is ``total_steps / steps_per_s``
for its job type and GPU count on that type. See ``Throughputs.steps_per_s``
for how a GPU count that was not measured is derived.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from pathlib import Path

WORKER_TYPES = ("k80", "p100", "v100")


class TraceError(ValueError):
    """Malformed trace or throughput file; the message names the file (and line)."""


@dataclass(frozen=True)
class TraceJob:
    """One line of a trace."""

    job_type: str
    num_gpus: int
    total_steps: int
    arrival_s: float
    source: str = ""  # "file:line", for messages

    def runtime_s(self, throughputs: "Throughputs", accelerator: str) -> float:
        return self.total_steps / throughputs.steps_per_s(accelerator, self.job_type, self.num_gpus)


def read_trace(path: str | Path) -> list[TraceJob]:
    """The jobs of one trace file, in file order (arrival times ascending is not required)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace: {e}") from e
    jobs = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        where = f"{path}:{n}"
        if len(fields) != 7:
            raise TraceError(f"{where}: expected 7 tab-separated fields "
                             "(job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s, num_gpus), "
                             f"found {len(fields)}")
        job_type, _command, _steps_arg, _needs_data, total_steps, arrival, gpus = fields
        if not job_type.strip():
            raise TraceError(f"{where}: empty job_type")
        try:
            steps = int(total_steps)
        except ValueError:
            raise TraceError(f"{where}: total_steps {total_steps!r} is not an integer") from None
        try:
            arrival_s = float(arrival)
        except ValueError:
            raise TraceError(f"{where}: arrival_time_s {arrival!r} is not a number") from None
        try:
            num_gpus = int(gpus)
        except ValueError:
            raise TraceError(f"{where}: num_gpus {gpus!r} is not an integer") from None
        if steps <= 0:
            raise TraceError(f"{where}: total_steps must be positive, got {steps}")
        if num_gpus <= 0:
            raise TraceError(f"{where}: num_gpus must be positive, got {num_gpus}")
        if not math.isfinite(arrival_s) or arrival_s < 0:
            raise TraceError(f"{where}: arrival_time_s must be a finite number >= 0, got {arrival!r}")
        jobs.append(TraceJob(job_type, num_gpus, steps, arrival_s, where))
    return jobs


class Throughputs:
    """Measured steps per second of a job type on ``num_gpus`` devices of a worker type, the job alone."""

    def __init__(self, table: dict[str, dict[tuple[str, int], float]], source: str = ""):
        self.table = table  # worker type -> (job_type, num_gpus) -> steps/s (> 0 only)
        self.source = source
        self._cache: dict[tuple[str, str, int], float] = {}

    @property
    def worker_types(self) -> tuple[str, ...]:
        return tuple(self.table)

    def steps_per_s(self, worker: str, job_type: str, num_gpus: int) -> float:
        """Steps per second of ``job_type`` on ``num_gpus`` devices of ``worker``.

        A measured (job_type, num_gpus) entry is used as is. When the entry is
        missing (e.g. 7, 24 or 64 GPUs, or a multi-GPU Recommendation job) or
        its throughput is 0 (the job did not fit in that device's memory), the
        nearest measured GPU count ``m`` of the same job type on the same worker
        type is taken (on a tie, the larger count) and scaled linearly:
        ``steps_per_s(m) * num_gpus / m``, i.e. each device keeps the per-device
        throughput measured at the nearest size.
        """
        key = (worker, job_type, num_gpus)
        if key in self._cache:
            return self._cache[key]
        measured = self.table.get(worker)
        if measured is None:
            raise TraceError(f"{self.source}: no throughputs for worker type {worker!r} "
                             f"(have {', '.join(self.table)})")
        value = measured.get((job_type, num_gpus))
        if value is None:
            counts = [g for (t, g) in measured if t == job_type]
            if not counts:
                raise TraceError(f"{self.source}: no measured throughput for job type {job_type!r} on {worker}")
            nearest = min(counts, key=lambda g: (abs(g - num_gpus), -g))
            value = measured[(job_type, nearest)] * num_gpus / nearest
        self._cache[key] = value
        return value


def read_throughputs(path: str | Path, worker_types: tuple[str, ...] = WORKER_TYPES) -> Throughputs:
    """The ``"null"`` (job alone) throughputs of ``worker_types`` from a Gavel throughputs JSON file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise TraceError(f"{path}: cannot read throughputs: {e}") from e
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
    if not isinstance(raw, dict):
        raise TraceError(f"{path}: expected an object of worker types at the top level")
    table: dict[str, dict[tuple[str, int], float]] = {}
    for worker in worker_types:
        if worker not in raw:
            continue
        entries = raw[worker]
        if not isinstance(entries, dict):
            raise TraceError(f"{path}: worker type {worker!r}: expected an object of job keys")
        measured = {}
        for k, v in entries.items():
            try:
                job_type, gpus = ast.literal_eval(k)
                gpus = int(gpus)
                if not isinstance(job_type, str):
                    raise ValueError
            except (ValueError, SyntaxError, TypeError):
                raise TraceError(f"{path}: worker type {worker!r}: key {k!r} is not \"('<job_type>', <num_gpus>)\"") from None
            if not isinstance(v, dict) or "null" not in v:
                raise TraceError(f"{path}: {worker} {k}: no \"null\" (job alone) entry")
            try:
                rate = float(v["null"])
            except (TypeError, ValueError):
                raise TraceError(f"{path}: {worker} {k}: \"null\" throughput {v['null']!r} is not a number") from None
            if rate > 0 and math.isfinite(rate):
                measured[(job_type, gpus)] = rate  # a 0 means "did not run": derived from a neighbour instead
        table[worker] = measured
    if not table:
        raise TraceError(f"{path}: none of the worker types {', '.join(worker_types)} found")
    return Throughputs(table, str(path))
