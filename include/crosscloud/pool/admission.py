"""Admitting a training run: place it over the live inventory and reserve its devices, atomically.

Two placements, both behind the same hard constraints (``placement.refusal``):
``spread`` gives every eligible cloud ``devices_per_cloud`` (the cross-cloud
run a user asks for), ``auto`` lets ``placement.place`` choose one cloud or a
split for ``devices`` devices by estimated finish time, cost and balance. The
decision and the reservation happen in one ledger transaction, so concurrent
runs never hold more than a pool or a quota has.

``NotAdmitted`` means "not now": the admission task waits and tries again, and
the next try may choose another cloud (the job is forwarded with its data).
``PlacementError`` means "never": it fails at once, naming every cloud's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from crosscloud.core.federation import Federation
from crosscloud.core.job import JobSpec
from crosscloud.core.presets import PRESETS, SAMPLE_SECONDS
from crosscloud.ledger import Ledger, Usage
from crosscloud.pool.inventory import before_admission, collect
from crosscloud.pool.placement import Considered, JobRequest, Part, PlacementError, Site, place, refusal
from crosscloud.store.network import network

FIX = ("Change the job parameters clouds, model_size or devices, or the federation "
       "(the tenant's quotas, the clouds' pools and images)")


class NotAdmitted(RuntimeError):
    """The job fits the federation but not its free devices now; retry later."""


@dataclass(frozen=True)
class Admission:
    parts: list[Part]
    considered: list[Considered]


def job_request(fed: Federation, spec: JobSpec, family: str, data_bytes: int, data_at: set[str], devices: int) -> JobRequest:
    """The placement view of a training run: size, run-time estimate, data and the tenant's quota."""
    tenant = fed.tenant(spec.tenant)
    ds = fed.dataset(spec.dataset_name)
    samples = spec.rounds * spec.inner_steps * spec.global_batch
    return JobRequest(
        name=spec.dataset_name,
        tenant=spec.tenant,
        family=family,
        devices=devices,
        runtime_s={"*": samples * SAMPLE_SECONDS[spec.model_size] / devices},
        data_bytes=data_bytes,
        data_at=frozenset(data_at),
        residency=ds.residency,
        quota=dict(tenant.quotas),
        clouds=frozenset(spec.clouds) if spec.clouds else None,
        splittable=spec.mode == "cross_cloud",
        memory_gb=PRESETS[spec.model_size].min_train_memory_gb(),
    )


def _eligible_later(job: JobRequest, site: Site) -> bool:
    """Whether ``site`` passes the hard constraints once it takes work again (draining and joining are temporary)."""
    return not refusal(job, replace(site, refuses=""))


def _spread(job: JobRequest, sites: list[Site], per_cloud: int, pinned: bool) -> tuple[list[Part], list[Considered]]:
    """``per_cloud`` devices (or what is free and allowed) on every eligible cloud, its fastest pool."""
    parts, considered, later = [], [], set()
    for cloud in dict.fromkeys(s.cloud for s in sites):
        pools = [s for s in sites if s.cloud == cloud]
        reasons = {s.accelerator: refusal(job, s) for s in pools}
        later |= {cloud for s in pools if _eligible_later(job, s)}
        usable = [s for s in pools if not reasons[s.accelerator] and s.free > 0]
        best = max(usable, key=lambda s: s.speed) if usable else None
        if best is not None:
            n = min(per_cloud, best.free)
            parts.append(Part(cloud, best.accelerator, n))
        for s in pools:
            if s is best:
                why = f"{n} x {s.accelerator} ({s.free} free, throughput {s.speed:g} each)"
            else:
                why = reasons[s.accelerator] or (f"full: 0 of {s.total} free to {job.tenant} (in use, or its quota taken)" if s.free == 0 else "a faster pool was chosen")
            considered.append(Considered(cloud, s.accelerator, s is best, why))
    explained = "; ".join(f"{c.cloud}/{c.accelerator}: {c.reason}" for c in considered)
    never = (job.clouds - later) if pinned else (set() if later else {"any"})
    if never:
        raise PlacementError(f"no placement for tenant {job.tenant} on {sorted(never)}: {explained}. {FIX}")
    if not parts or (pinned and later - {p.cloud for p in parts}):  # every cloud asked for, or wait
        raise NotAdmitted(f"waiting for devices: {explained}")
    return parts, considered


def _could_ever(job: JobRequest, sites: list[Site]) -> bool:
    """Whether the job fits the eligible pools once other runs (the tenant's own included) give devices back."""
    room = [min(s.total, job.quota.get(s.cloud, 0)) for s in sites if _eligible_later(job, s)]
    return any(r >= job.devices for r in room) or (job.splittable and sum(room) >= job.devices)


def _check_request(fed: Federation, spec: JobSpec) -> None:
    for name in spec.clouds:
        fed.cloud(name)  # an unknown name fails here, with the list of known clouds
    if spec.mode == "single_cluster" and len(spec.clouds) > 1:
        raise PlacementError(f"job parameter clouds: single_cluster mode runs on one cloud, got {spec.clouds}")


def _decide(fed: Federation, spec: JobSpec, family: str, data_bytes: int, data_at: set[str], sites: list[Site]) -> Admission:
    """Where the run goes over ``sites`` as the tenant sees them; raises PlacementError or NotAdmitted."""
    single = spec.mode == "single_cluster"
    devices = spec.devices_per_cloud if single or spec.placement == "spread" else spec.devices
    job = job_request(fed, spec, family, data_bytes, data_at, devices)
    if single and not spec.clouds:
        job = replace(job, clouds=frozenset({fed.local_cloud.name}))
    if spec.placement == "spread" and not single:
        return Admission(*_spread(job, sites, spec.devices_per_cloud, pinned=bool(spec.clouds)))
    decision = place(job, sites, network(fed))
    if not decision.placed and not _could_ever(job, sites):
        raise PlacementError(f"no cloud can ever run this job for tenant {spec.tenant}: {decision.explain()}. {FIX}")
    if not decision.starts_now:
        raise NotAdmitted(f"waiting for devices: {decision.explain()}")
    return Admission(decision.option.parts, decision.considered)


def preflight(fed: Federation, spec: JobSpec, family: str, ledger: Ledger | None = None) -> None:
    """Refuse a job no cloud could ever take before anything of it is written; having to wait is no refusal.

    The same decision as ``admit``, over every pool as if no run held a device.
    """
    _check_request(fed, spec)
    sites = [replace(s, free=s.total) for s in collect(fed, ledger, spec.tenant, electricity=False, clusters=False).sites(family)]
    try:
        _decide(fed, spec, family, 0, set(), sites)
    except NotAdmitted:
        pass


def admit(fed: Federation, spec: JobSpec, run_id: str, family: str, data_bytes: int, data_at: set[str],
          ledger: Ledger | None = None, holder: str = "") -> Admission:
    """Choose where the run trains and reserve its devices; see the module docstring for the two errors.

    Memberships and the backends' running sub-tasks are read before the
    ledger's transaction; inside it only the reservations are, so the lock
    every other admission waits for is held for the decision alone. A run
    that does not fit the reservations as one read finds them is told so
    without waiting for the lock: "not now" was true at that instant.
    """
    ledger = ledger or Ledger()
    _check_request(fed, spec)
    inventory = before_admission(fed, ledger)
    quotas = dict(fed.tenant(spec.tenant).quotas)
    result: list[Admission] = []

    def decide(usage: Usage) -> list[tuple[str, str, int]]:
        # the tenant sees a pool's free devices within what its quota leaves it there
        left = {c: q - usage.tenant(spec.tenant, c) for c, q in quotas.items()}
        sites = [replace(s, free=max(min(s.free, left.get(s.cloud, 0)), 0)) for s in inventory.with_usage(usage).sites(family)]
        result.append(_decide(fed, spec, family, data_bytes, data_at, sites))
        return [(p.cloud, p.accelerator, p.devices) for p in result[-1].parts]

    try:
        decide(ledger.usage())
    except (NotAdmitted, PlacementError):
        if not ledger.active(spec.tenant, run_id):  # else a retried admission: the ledger gives its devices back
            raise
    result.clear()  # the decision that counts is the one inside the transaction
    capacity = {(c.name, p.accelerator): p.count for c in fed.clouds for p in c.pools}
    held = ledger.admit(spec.tenant, run_id, decide, capacity, quotas, holder=holder)
    if not result:  # a retried admission: the run already holds its devices
        parts = [Part(r.cloud, r.accelerator, r.devices) for r in held]
        return Admission(parts, [Considered(p.cloud, p.accelerator, True, "reserved by an earlier try") for p in parts])
    return result[-1]
