"""Admitting a training run: it enters the queue, a pass decides, and the devices it got are reserved.

Two placements, both behind the same hard constraints (``placement.refusal``):
``spread`` gives every eligible cloud ``devices_per_cloud`` (the cross-cloud
run a user asks for), ``auto`` lets ``placement.place`` choose one cloud or a
split for ``devices`` devices by estimated finish time, cost and balance.
Every caller - the DAG's admission, ``run_job``, ``crosscloud train``, the
baseline calibration - goes through ``admit``, so all of them wait in one
queue, in one order.

``NotAdmitted`` means "not now": the run keeps its place in the queue and
its waiter looks again (the message says its position and why). A run that
is already running gets its own reservation back. ``PlacementError`` means
"never": it fails at once, naming every cloud's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from crosscloud.core.federation import Federation
from crosscloud.core.job import JobSpec, deadline_at
from crosscloud.ledger import Ledger
from crosscloud.ledger.leases import default_holder
from crosscloud.pool.inventory import collect
from crosscloud.pool.placement import ANY_ACCELERATOR, Considered, JobRequest, Part, PlacementError
from crosscloud.scheduler.decide import decide
from crosscloud.scheduler.entry import Entry, Spread
from crosscloud.scheduler.service import Queue, Status
from crosscloud.scheduler.sizing import Sizing, preset_sizing
from crosscloud.store.network import network


class NotAdmitted(RuntimeError):
    """The job fits the federation but not its free devices now: it waits in the queue."""

    def __init__(self, message: str, status: Status | None = None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Admission:
    parts: list[Part]
    considered: list[Considered]


def job_request(fed: Federation, spec: JobSpec, family: str, data_bytes: int, data_at: set[str], devices: int,
                sizing: Sizing | None = None) -> JobRequest:
    """The placement view of a training run: size, run-time estimate, data and the tenant's quota."""
    tenant, sizing = fed.tenant(spec.tenant), sizing or preset_sizing(spec)
    ds = fed.dataset(spec.dataset_name)
    single = spec.mode == "single_cluster"
    return JobRequest(
        name=spec.dataset_name,
        tenant=spec.tenant,
        family=family,
        devices=devices,
        runtime_s={a: s / devices for a, s in sizing.runtime_s(spec).items()},
        data_bytes=data_bytes,
        data_at=frozenset(data_at),
        residency=ds.residency,
        quota=dict(tenant.quotas),
        clouds=frozenset(spec.clouds) if spec.clouds else (frozenset({fed.local_cloud.name}) if single else None),
        splittable=spec.mode == "cross_cloud",
        memory_gb=sizing.memory_gb,
    )


def entry_for(fed: Federation, spec: JobSpec, run_id: str, family: str, data_bytes: int, data_at: set[str],
              now: float, sizing: Sizing | None = None) -> Entry:
    """The run as the queue holds it, resolved once from the federation and its sizing."""
    single = spec.mode == "single_cluster"
    spread = None if spec.placement == "auto" and not single else Spread(spec.devices_per_cloud, bool(spec.clouds) or single)
    devices = spec.devices_per_cloud if spread is not None else spec.devices
    request = job_request(fed, spec, family, data_bytes, data_at, devices, sizing)
    return Entry(spec.tenant, run_id, request, now, spec.priority, deadline_at(spec.deadline, now), spec.deferrable,
                 spec.objective, spread, request.runtime_s[ANY_ACCELERATOR])


def _check_request(fed: Federation, spec: JobSpec) -> None:
    for name in spec.clouds:
        fed.cloud(name)  # an unknown name fails here, with the list of known clouds
    if spec.mode == "single_cluster" and len(spec.clouds) > 1:
        raise PlacementError(f"job parameter clouds: single_cluster mode runs on one cloud, got {spec.clouds}")


def preflight(fed: Federation, spec: JobSpec, family: str, ledger: Ledger | None = None,
              sizing: Sizing | None = None) -> None:
    """Refuse a job no cloud could ever take before anything of it is written; having to wait is no refusal.

    The same decision as a pass makes, over every pool as if no run held a device.
    """
    _check_request(fed, spec)
    sites = [replace(s, free=s.total) for s in collect(fed, ledger, spec.tenant, electricity=False, clusters=False).sites(family)]
    decision = decide(entry_for(fed, spec, "preflight", family, 0, set(), 0.0, sizing), sites, network(fed))
    if decision.kind == "never":
        raise PlacementError(decision.reason)


def _admitted(ledger: Ledger, tenant: str, run_id: str, why: str) -> Admission | None:
    held = ledger.active(tenant, run_id)
    if not held:
        return None
    ledger.renew(tenant, run_id)
    parts = [Part(r.cloud, r.accelerator, r.devices) for r in held]
    return Admission(parts, [Considered(p.cloud, p.accelerator, True, why) for p in parts])


def admit(fed: Federation, spec: JobSpec, run_id: str, family: str, data_bytes: int, data_at: set[str],
          ledger: Ledger | None = None, holder: str = "", queue: Queue | None = None,
          sizing: Sizing | None = None) -> Admission:
    """Enter the run in the queue (or find it there), run a pass if one is due, and return what it holds.

    Raises ``NotAdmitted`` while it waits and ``PlacementError`` when no cloud could ever take it.
    """
    ledger = ledger or Ledger()
    _check_request(fed, spec)
    again = _admitted(ledger, spec.tenant, run_id, "reserved by an earlier try")
    if again is not None:  # a retried admission: the ledger gives its devices back
        return again
    queue = queue or Queue(fed, ledger)
    submitted = queue.clock()
    queue.submit(entry_for(fed, spec, run_id, family, data_bytes, data_at, submitted, sizing),
                 holder or default_holder())
    queue.run_pass(decided_since=(spec.tenant, run_id, submitted))
    status = queue.status(spec.tenant, run_id)
    decision = status.decision
    if status.state == "running":  # its lease was taken just now: no renewal needed
        parts = [Part(r.cloud, r.accelerator, r.devices) for r in ledger.active(spec.tenant, run_id)]
        considered = [Considered(*c) for c in decision.considered] if decision else []
        return Admission(parts, considered or [Considered(p.cloud, p.accelerator, True, "") for p in parts])
    if decision is not None and decision.kind == "never":
        queue.ledger.queue.end(spec.tenant, run_id, "refused", decision.reason, queue.clock())
        raise PlacementError(decision.reason)
    if status.state != "queued":
        raise NotAdmitted(f"run {run_id} is {status.state} in the queue: {status.row.end_reason}", status)
    raise NotAdmitted(f"queued at {status.explain()}", status)


def admit_waiting(fed: Federation, spec: JobSpec, run_id: str, family: str, data_bytes: int, data_at: set[str],
                  ledger: Ledger | None = None, log: Callable[[str], None] = print, poll_s: float = 5.0,
                  timeout_s: float | None = None, sizing: Sizing | None = None) -> Admission:
    """``admit``, waiting in the queue until the run starts; the log says each new position and reason.

    However the wait ends without a start - Ctrl-C, SIGTERM, ``timeout_s`` -
    the entry leaves the queue, so nothing waits on in the waiter's name.
    """
    ledger = ledger or Ledger()
    queue, said, since = Queue(fed, ledger), None, time.monotonic()
    try:
        while True:
            try:
                return admit(fed, spec, run_id, family, data_bytes, data_at, ledger, queue=queue, sizing=sizing)
            except NotAdmitted as waiting:
                if str(waiting) != said:
                    said = str(waiting)
                    log(f"run {run_id} {said}")
                if timeout_s is not None and time.monotonic() - since > timeout_s:
                    raise
            time.sleep(poll_s)
    except BaseException:
        queue.ledger.queue.end(spec.tenant, run_id, "cancelled", "its waiter stopped waiting", queue.clock())
        raise
