"""One entry's verdict over the sites as a pass sees them: start now, reserve what it waits for, wait, or never.

Both of a run's placements sit behind the same hard constraints
(``placement.refusal``): ``auto`` lets ``placement.place`` choose one cloud or
a split by estimated finish time, cost and balance; a ``Spread`` entry gets
its devices on every eligible cloud. The sites carry the work queued ahead of
the entry (``Site.queued_devices``), so an entry starts now only where it
delays none of it (EASY backfilling).
"""

from __future__ import annotations

from dataclasses import replace

from crosscloud.pool.placement import Considered, JobRequest, Site, TransferTime, Weights, place, refusal
from crosscloud.scheduler.entry import Decision, Entry

FIX = ("Change the job parameters clouds, model_size or devices, or the federation "
       "(the tenant's quotas, the clouds' pools and images)")


def eligible_later(job: JobRequest, site: Site) -> bool:
    """Whether ``site`` passes the hard constraints once it takes work again (draining and joining are temporary)."""
    return not refusal(job, replace(site, refuses=""))


def could_ever(job: JobRequest, sites: list[Site]) -> bool:
    """Whether the job fits the eligible pools once other runs (the tenant's own included) give devices back."""
    room = [s.total if job.quota is None else min(s.total, job.quota.get(s.cloud, 0))
            for s in sites if eligible_later(job, s)]
    return any(r >= job.devices for r in room) or (job.splittable and sum(room) >= job.devices)


def _considered(items: list[Considered]) -> tuple[tuple[str, str, bool, str], ...]:
    return tuple((c.cloud, c.accelerator, c.chosen, c.reason) for c in items)


def explain(considered) -> str:
    return "; ".join(f"{c[0]}/{c[1]}: {c[3]}" for c in considered)


def decide_auto(entry: Entry, sites: list[Site], network: TransferTime, weights: Weights) -> Decision:
    """``placement.place`` over ``sites``: the option it ranks best, now or reserved for later."""
    job = entry.request
    decision = place(job, sites, network, weights)
    considered = _considered(decision.considered)
    if decision.option is None:
        if could_ever(job, sites):
            return Decision("wait", f"waiting for devices: {decision.explain()}", considered=considered)
        return Decision("never", f"no cloud can ever run this job for tenant {job.tenant}: {decision.explain()}. {FIX}",
                        considered=considered)
    parts = tuple((p.cloud, p.accelerator, p.devices) for p in decision.option.parts)
    where = ", ".join(f"{n} x {a} on {c}" for c, a, n in parts)
    if decision.starts_now:
        return Decision("start", f"starts now: {where}", parts, decision.option.start_s,
                        runtime_s=decision.option.runtime_s, transfer_bytes=decision.option.transfer_bytes,
                        considered=considered)
    return Decision("reserve", f"reserved {where}, expected free in {decision.option.start_s / 60:.0f} min "
                    f"(later work only backfills around it)", parts, decision.option.start_s,
                    runtime_s=decision.option.runtime_s, considered=considered)


def decide_spread(entry: Entry, sites: list[Site]) -> Decision:
    """``per_cloud`` devices (or what is free and delays nobody) on every eligible cloud, its fastest pool."""
    job, spread = entry.request, entry.spread
    parts, considered, later, waits = [], [], set(), []
    for cloud in dict.fromkeys(s.cloud for s in sites):
        pools = [s for s in sites if s.cloud == cloud]
        reasons = {s.accelerator: refusal(job, s) for s in pools}
        later |= {cloud for s in pools if eligible_later(job, s)}
        ok = [s for s in pools if not reasons[s.accelerator]]
        usable = [s for s in ok if s.backfills(min(spread.per_cloud, s.free), entry.runtime_s) and s.free > 0]
        best = max(usable, key=lambda s: s.speed) if usable else None
        if best is not None:
            n = min(spread.per_cloud, best.free)
            parts.append((cloud, best.accelerator, n))
        elif ok:
            fastest = max(ok, key=lambda s: s.speed)
            waits.append((cloud, fastest.accelerator, min(spread.per_cloud, fastest.total)))
        for s in pools:
            if s is best:
                why = f"{n} x {s.accelerator} ({s.free} free, throughput {s.speed:g} each)"
            elif reasons[s.accelerator]:
                why = reasons[s.accelerator]
            elif best is None:
                why = f"full: {s.free} of {s.total} free to {job.tenant} (in use, its quota taken, or held for work ahead)"
            else:
                why = "a faster pool was chosen"
            considered.append((cloud, s.accelerator, s is best, why))
    never = (job.clouds - later) if spread.pinned else (set() if later else {"any"})
    if never:
        return Decision("never", f"no placement for tenant {job.tenant} on {sorted(never)}: {explain(considered)}. {FIX}",
                        considered=tuple(considered))
    missing = later - {c for c, _, _ in parts}
    if parts and not (spread.pinned and missing):
        return Decision("start", "starts now: " + ", ".join(f"{n} x {a} on {c}" for c, a, n in parts), tuple(parts), 0.0,
                        runtime_s=entry.runtime_s, considered=tuple(considered))
    # a run that needs all its clouds holds what it waits for; one that takes any cloud starts at the first free device
    held = tuple(p for p in waits if p[0] in later) + tuple(parts) if spread.pinned else ()
    return Decision("reserve" if held else "wait", f"waiting for devices: {explain(considered)}", held,
                    runtime_s=entry.runtime_s, considered=tuple(considered))


def decide_parts(entry: Entry, sites: list[Site]) -> Decision:
    """A paused run: exactly the devices it trained on, all at once, since only its clouds hold its saved states."""
    by_key = {(s.cloud, s.accelerator): s for s in sites}
    considered, waits = [], []
    for cloud, accelerator, n in entry.parts:
        s = by_key.get((cloud, accelerator))
        if s is None or not eligible_later(entry.request, s):
            why = "not in the federation any more" if s is None else refusal(entry.request, s)
            return Decision("never", f"it cannot resume: its saved state is on {cloud}/{accelerator}, which cannot "
                            f"take it: {why}", considered=tuple(considered))
        if s.free >= n and s.backfills(n, entry.runtime_s):
            considered.append((cloud, accelerator, True, f"{n} x {accelerator} ({s.free} free)"))
        else:
            waits.append(s.wait_s(n))
            considered.append((cloud, accelerator, True, f"{n} x {accelerator}: {s.free} of {s.total} free to "
                                                         f"{entry.tenant} (in use, its quota taken, or held for work ahead)"))
    where = ", ".join(f"{n} x {a} on {c}" for c, a, n in entry.parts)
    if not waits:
        return Decision("start", f"resumes now: {where}", entry.parts, 0.0, runtime_s=entry.runtime_s,
                        considered=tuple(considered))
    return Decision("reserve", f"reserved {where}, where its saved state is: {explain(considered)}", entry.parts,
                    max(waits), runtime_s=entry.runtime_s, considered=tuple(considered))


def decide(entry: Entry, sites: list[Site], network: TransferTime, weights: Weights = Weights()) -> Decision:
    """The verdict for ``entry`` over ``sites`` (as the tenant sees them, with the work queued ahead)."""
    if entry.parts is not None:
        return decide_parts(entry, sites)
    if entry.spread is not None:
        return decide_spread(entry, sites)
    return decide_auto(entry, sites, network, weights)
