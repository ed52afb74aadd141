"""What a queued run asks for, and what a pass decided for it.

An entry is resolved once, at submission, into the placement's own view of
the job (``JobRequest``) plus what only the queue needs: priority, deadline,
whether it may wait for cheap hours, and what "cheap" means (``objective``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from crosscloud.pool.placement import JobRequest

KINDS = ("start", "reserve", "plan", "wait", "never", "pause")
Parts = tuple[tuple[str, str, int], ...]  # (cloud, accelerator, devices)
STATES = ("queued", "running", "paused", "done", "cancelled", "expired")


@dataclass(frozen=True)
class Spread:
    """A run that asks for ``per_cloud`` devices on every eligible cloud (placement ``spread``).

    ``pinned``: the user named its clouds, so every one of them must take part.
    """

    per_cloud: int
    pinned: bool


@dataclass(frozen=True)
class Entry:
    """One queued run: the job as placement sees it and the queue's own terms."""

    tenant: str
    run_id: str
    request: JobRequest
    submitted_at: float
    priority: int = 0
    deadline: float | None = None  # epoch seconds by which it should have finished
    deferrable: bool = False  # may wait for cheaper (or cleaner) hours, within its deadline
    objective: str = "cost"
    spread: Spread | None = None  # None: placement ``auto`` over ``request.devices``
    runtime_s: float = 0.0  # estimated run time on the job's devices, for reservations and fair share
    # a paused run asks for exactly the devices it trained on: its clouds keep its saved states
    parts: Parts | None = None
    paused_before: bool = False  # a run is paused at most once: its deadline's slack is spent once

    @property
    def key(self) -> tuple[str, str]:
        return self.tenant, self.run_id

    @property
    def device_hours(self) -> float:
        """What the run is known to cost: devices x estimated hours."""
        return self.devices * self.runtime_s / 3600

    @property
    def devices(self) -> int:
        """Devices it asks for in all."""
        if self.parts is not None:
            return sum(n for _, _, n in self.parts)
        if self.spread is not None:
            return self.spread.per_cloud * max(1, len(self.request.clouds or ()))
        return self.request.devices


@dataclass(frozen=True)
class Decision:
    """A pass's verdict for one entry, with its reason.

    ``start``: its ``parts`` are reserved now. ``reserve``: it waits for
    ``parts``, expected free in ``expected_start_s``; later work only
    backfills around them. ``plan``: deferrable work set to start at
    ``planned_at`` on ``parts`` for price or carbon. ``pause``: a running
    deferrable run stops after its next committed round and waits, with its
    progress, for ``planned_at``. A start's
    ``expected_start_s`` is the time its data takes to arrive. ``wait``: nothing known
    frees its devices yet. ``never``: no cloud can ever take it.
    """

    kind: str
    reason: str
    parts: tuple[tuple[str, str, int], ...] = ()
    expected_start_s: float | None = None  # seconds after the pass
    planned_at: float | None = None  # epoch seconds
    position: int = 0  # 1 = first in line
    runtime_s: float = 0.0  # how long its parts run once started (the option's run time)
    transfer_bytes: int = 0  # data moved to clouds that lack it before it runs (``expected_start_s`` of a start)
    # a deferrable run: (USD, kg CO2 or None) had it started when first planned, and, once started, what it saved
    first_cost: tuple[float, float | None] | None = None
    saved: tuple[float, float | None] | None = None
    # why its deadline could not be met with the work admitted before it, named when it was submitted: it is not
    # protected by the deadline guard and runs as soon as it can (carried from pass to pass)
    at_risk: str = ""

    @property
    def hold_s(self) -> float:
        """How long a start holds its devices: its data's transfer, then its run."""
        return (self.expected_start_s or 0.0) + self.runtime_s
    considered: tuple[tuple[str, str, bool, str], ...] = field(default=(), compare=False)  # cloud, acc, chosen, why

    def waits_for(self) -> tuple[tuple[str, str, int], ...]:
        """The devices a reservation holds back from later work."""
        return self.parts if self.kind == "reserve" else ()  # a plan for a later hour holds nothing now


def request_json(entry: Entry) -> str:
    """The job and its placement, as the queue's row stores them (the tenant's quota is read again at each pass)."""
    r = entry.request
    return json.dumps({
        "name": r.name, "family": r.family, "devices": r.devices, "runtime_s": dict(r.runtime_s),
        "data_bytes": r.data_bytes, "data_at": sorted(r.data_at), "residency": r.residency,
        "clouds": None if r.clouds is None else sorted(r.clouds), "splittable": r.splittable, "max_parts": r.max_parts,
        "split_penalty": r.split_penalty, "memory_gb": r.memory_gb,
        "spread": None if entry.spread is None else {"per_cloud": entry.spread.per_cloud, "pinned": entry.spread.pinned},
        "parts": None if entry.parts is None else [list(p) for p in entry.parts],
        "paused_before": entry.paused_before,
    }, sort_keys=True)


def entry_from_row(row, quota: dict[str, int] | None) -> Entry:
    """A queue row (``crosscloud.ledger.records.QueueRow``) as the pass takes it, with the tenant's quota now."""
    raw = json.loads(row.request)
    spread = raw.pop("spread")
    parts = raw.pop("parts", None)
    paused_before = raw.pop("paused_before", False)
    raw["data_at"] = frozenset(raw["data_at"])
    raw["clouds"] = None if raw["clouds"] is None else frozenset(raw["clouds"])
    request = JobRequest(tenant=row.tenant, quota=quota, **raw)
    return Entry(row.tenant, row.run_id, request, row.submitted_at, row.priority, row.deadline, row.deferrable,
                 row.objective, None if spread is None else Spread(**spread), row.runtime_s,
                 None if parts is None else tuple(tuple(p) for p in parts), paused_before)


def decision_json(d: Decision) -> str:
    return json.dumps({"kind": d.kind, "reason": d.reason, "parts": [list(p) for p in d.parts],
                       "expected_start_s": d.expected_start_s, "planned_at": d.planned_at, "runtime_s": d.runtime_s,
                       "transfer_bytes": d.transfer_bytes, "considered": [list(c) for c in d.considered],
                       "first_cost": d.first_cost, "saved": d.saved, "at_risk": d.at_risk})


def decision_from_json(text: str | None) -> Decision | None:
    if not text:
        return None
    raw = json.loads(text)
    raw["parts"] = tuple(tuple(p) for p in raw["parts"])
    raw["considered"] = tuple(tuple(c) for c in raw.get("considered", ()))
    for field_ in ("first_cost", "saved"):
        raw[field_] = tuple(raw[field_]) if raw.get(field_) is not None else None
    return Decision(**raw)
