"""Where a job runs: hard constraints first, then the soonest finish, its cost and the network's balance.

One function, ``place``, decides for the DAGs (from the federation, the
reservation ledger and the backends) and for the trace-driven simulator (from
its own event state): both describe the world as ``Site``s and the job as a
``JobRequest``, so the benchmark measures the code that runs.

A site is one accelerator pool of one cloud. Options are every single site
that can ever hold the job, plus one split over the sites with free devices
now (fastest first) when the job may be split; each option's finish time is
its estimated start (queueing, and the transfer of data not yet there) plus
its run time, a split's run time carrying the measured cross-cloud penalty.
A caller that knows the queue in front of a pool (the simulator) gives its
size (``queued_device_s``, ``queued_devices``): the wait then counts the
released devices those jobs take first, and a job may start on devices free
now only if it does not delay them (EASY backfilling, ``Site.backfills``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

ANY_ACCELERATOR = "*"


class PlacementError(ValueError):
    """No valid placement; the message lists every candidate and why it was refused."""


@dataclass(frozen=True)
class Site:
    """One cloud's accelerator pool, as placement sees it at one instant."""

    cloud: str
    accelerator: str
    jurisdiction: str
    total: int
    free: int
    price_per_device_hour: float = 0.0
    speed: float = 1.0  # relative speed of this pool for the job's family (1.0: as in the job's run time)
    families: frozenset[str] = frozenset()  # model families with an adapted image here
    refuses: str = ""  # why the cloud takes no new work now (draining, failed join check...); empty: it does
    queued_device_s: float = 0.0  # device-seconds of work already waiting for this pool
    frees: tuple[tuple[float, int], ...] = ()  # (seconds from now, devices released), ascending
    queued_devices: int = 0  # devices that the work waiting for this pool takes first, as they are released
    memory_gb: float = math.inf  # memory of one device

    def wait_s(self, devices: int) -> float:
        """When ``devices`` of this pool can be held, counting the work queued ahead.

        Without ``queued_devices``: the first release that frees ``devices``,
        plus the queued work spread over the whole pool. With it, the queued
        jobs take the released devices first (in release order), so the wait
        is the release that frees ``devices`` beyond theirs, and never less
        than the queued work spread over the pool; when the known releases do
        not cover the queued jobs too, the last known release plus that spread.
        """
        ahead = self.queued_device_s / self.total
        if self.free >= devices and ahead == 0 and self.queued_devices == 0:
            return 0.0
        have = self.free
        if not self.queued_devices:
            if have >= devices:
                return ahead
            for after, released in self.frees:
                have += released
                if have >= devices:
                    return after + ahead
            return math.inf  # nothing known will release enough devices
        need = devices + self.queued_devices
        last = 0.0
        if have >= need:
            return ahead
        for after, released in self.frees:
            have += released
            last = after
            if have >= need:
                return max(after, ahead)
        if have < devices:
            return math.inf  # even once the queue ahead is done, not enough devices come back
        return last + ahead  # the queued jobs' own ends are not known: after the last known release

    def backfills(self, devices: int, hold_s: float) -> bool:
        """Whether ``devices`` can be held now for ``hold_s`` seconds without delaying the work queued here.

        With nothing queued: whether they are free. With queued work of known
        size (``queued_devices``), EASY backfilling: they must be free now and
        either be given back before the queued jobs could start (the release
        that frees their devices) or be spare devices at that moment. With
        queued work of unknown size: never.
        """
        if self.free < devices:
            return False
        if self.queued_device_s == 0 and self.queued_devices == 0:
            return True
        if not self.queued_devices:
            return False
        have = self.free
        if have >= self.queued_devices:
            return devices <= have - self.queued_devices
        for after, released in self.frees:
            have += released
            if have >= self.queued_devices:
                return hold_s <= after or devices <= have - self.queued_devices
        return False


@dataclass(frozen=True)
class JobRequest:
    """A job to place: its size, its run time per accelerator type and where its data may go."""

    name: str
    tenant: str
    family: str
    devices: int
    runtime_s: Mapping[str, float]  # whole job on ``devices`` devices of that type; "*" for any type
    data_bytes: int = 0
    data_at: frozenset[str] = frozenset()  # clouds that already hold the data
    residency: str | None = None  # jurisdiction the data may not leave
    quota: Mapping[str, int] | None = None  # devices the tenant may still take per cloud; None: no limit
    clouds: frozenset[str] | None = None  # the clouds the user allows; None: any
    splittable: bool = True
    max_parts: int = 4
    split_penalty: float = 0.0  # relative iteration-time penalty of a split job (from bench-gap)
    memory_gb: float = 0.0  # the least memory one device needs to train the job

    def runtime_on(self, site: Site) -> float | None:
        base = self.runtime_s.get(site.accelerator, self.runtime_s.get(ANY_ACCELERATOR))
        return None if base is None else base / site.speed


@dataclass(frozen=True)
class Weights:
    """How the score trades time for money and balance; the score is in seconds."""

    seconds_per_cost_unit: float = 600.0  # one unit of currency is worth ten minutes
    balance: float = 0.1  # finish time is stretched by this fraction of the pool's utilisation after placing
    # False: a job that can start now somewhere starts there (the best of those options), as Slurm's
    # multi-partition jobs and Kueue's flavor fungibility do, so no job waits while devices it fits are idle.
    # True: it may wait for a faster pool when its estimated finish is sooner (the federation's
    # ``wait_for_faster_pools``).
    wait_for_faster: bool = False


@dataclass(frozen=True)
class Part:
    cloud: str
    accelerator: str
    devices: int


@dataclass
class Option:
    parts: list[Part]
    start_s: float
    runtime_s: float
    cost: float
    score: float
    transfer_bytes: int

    @property
    def finish_s(self) -> float:
        return self.start_s + self.runtime_s


@dataclass(frozen=True)
class Considered:
    """One site and what placement made of it: refused (and why) or ranked (and its figures)."""

    cloud: str
    accelerator: str
    chosen: bool
    reason: str


@dataclass
class Decision:
    job: str
    option: Option | None
    considered: list[Considered] = field(default_factory=list)
    starts_now: bool = False  # every device of the option is free now (it may still wait for its data)

    @property
    def placed(self) -> bool:
        return self.option is not None

    def explain(self) -> str:
        return "; ".join(f"{c.cloud}/{c.accelerator}: {c.reason}" for c in self.considered)


# A network says how many seconds it takes to move ``nbytes`` from one cloud to another.
TransferTime = Callable[[str, str, int], float]


def no_network(src: str, dst: str, nbytes: int) -> float:
    return 0.0


def refusal(job: JobRequest, site: Site) -> str:
    """Why ``site`` can never take ``job`` (a hard constraint), or "" when it can."""
    if job.clouds is not None and site.cloud not in job.clouds:
        return "not among the clouds asked for"
    if site.refuses:
        return site.refuses
    if job.residency is not None and site.jurisdiction != job.residency:
        return f"data resident in {job.residency}, cloud is in {site.jurisdiction}"
    if job.family not in site.families:
        return f"no adapted image for family {job.family!r} on {site.accelerator}"
    if job.runtime_on(site) is None:
        return f"no measured throughput for this job on {site.accelerator}"
    if job.memory_gb > site.memory_gb:
        return f"the model needs at least {job.memory_gb:.2f} GB per device to train, a {site.accelerator} here has {site.memory_gb:g} GB"
    if job.quota is not None and job.quota.get(site.cloud, 0) <= 0:
        return f"tenant {job.tenant} has no quota left here"
    return ""


def _transfer(job: JobRequest, cloud: str, network: TransferTime) -> tuple[float, int]:
    """Seconds and bytes to bring the job's data to ``cloud`` from the nearest holder."""
    if not job.data_bytes or cloud in job.data_at or not job.data_at:
        return 0.0, 0
    return min(network(src, cloud, job.data_bytes) for src in job.data_at), job.data_bytes


def _score(start: float, runtime: float, cost: float, utilisation: float, w: Weights) -> float:
    return (start + runtime) * (1 + w.balance * utilisation) + cost * w.seconds_per_cost_unit


def _single(job: JobRequest, site: Site, network: TransferTime, w: Weights) -> tuple[Option | None, str]:
    cap = min(site.total, job.quota.get(site.cloud, 0)) if job.quota is not None else site.total
    if cap < job.devices:
        return None, f"holds at most {cap} of the {job.devices} devices needed"
    transfer_s, nbytes = _transfer(job, site.cloud, network)
    runtime = job.runtime_on(site)
    wait = 0.0 if site.backfills(job.devices, transfer_s + runtime) else site.wait_s(job.devices)
    if math.isinf(wait):
        return None, f"{site.free} free and no known release of {job.devices}"
    cost = job.devices * runtime / 3600 * site.price_per_device_hour
    used_after = (site.total - site.free + job.devices) / site.total
    option = Option([Part(site.cloud, site.accelerator, job.devices)], max(wait, transfer_s), runtime, cost,
                    0.0, nbytes)
    option.score = _score(option.start_s, runtime, cost, min(used_after, 1.0), w)
    return option, ""


def _split(job: JobRequest, sites: list[Site], network: TransferTime, w: Weights) -> Option | None:
    """The job over several sites' free devices now, fastest sites first; None if they cannot hold it."""
    ready = sorted((s for s in sites if s.free > 0 and s.queued_device_s == 0), key=lambda s: job.runtime_on(s))
    parts, left, taken = [], job.devices, {}
    for site in ready:
        if left == 0 or len(parts) == job.max_parts:
            break
        if site.cloud in taken:  # one sub-task per cloud: its pools are one part, never two
            continue
        quota_left = job.quota.get(site.cloud, 0) - taken.get(site.cloud, 0) if job.quota is not None else left
        n = min(site.free, left, quota_left)
        if n > 0:
            parts.append((site, n))
            taken[site.cloud] = taken.get(site.cloud, 0) + n
            left -= n
    if left or len(parts) < 2:
        return None
    # each part trains at its own speed; shares follow throughput, so rates add up
    rate = sum(n / job.devices / job.runtime_on(s) for s, n in parts)
    runtime = (1 + job.split_penalty) / rate
    transfers = [_transfer(job, s.cloud, network) for s, _ in parts]
    start = max(t for t, _ in transfers)
    cost = sum(n * runtime / 3600 * s.price_per_device_hour for s, n in parts)
    utilisation = max((s.total - s.free + n) / s.total for s, n in parts)
    option = Option([Part(s.cloud, s.accelerator, n) for s, n in parts], start, runtime, cost, 0.0,
                    sum(b for _, b in transfers))
    option.score = _score(start, runtime, cost, utilisation, w)
    return option


def _figures(o: Option) -> str:
    return f"start {o.start_s:.0f} s, run {o.runtime_s:.0f} s, finish {o.finish_s:.0f} s, cost {o.cost:.2f}, score {o.score:.0f}"


def place(job: JobRequest, sites: list[Site], network: TransferTime = no_network, weights: Weights = Weights()) -> Decision:
    """The best option for ``job`` over ``sites``, with every site's verdict."""
    verdicts: dict[tuple[str, str], str] = {}
    eligible, options = [], []
    for site in sites:
        why = refusal(job, site)
        if not why:
            eligible.append(site)
            option, why = _single(job, site, network, weights)
            if option is not None:
                options.append(option)
                why = f"alone: {_figures(option)}"
        verdicts[(site.cloud, site.accelerator)] = why
    split = _split(job, eligible, network, weights) if job.splittable and job.devices > 1 else None
    if split is not None:
        options.append(split)
    best, now = _best(options, sites, weights)
    held = {(p.cloud, p.accelerator): p.devices for p in best.parts} if best else {}
    considered = []
    for site in sites:
        key = (site.cloud, site.accelerator)
        reason = verdicts[key]
        if key in held and len(best.parts) > 1:
            reason = f"chosen for {held[key]} device(s) of a split over {len(best.parts)} clouds: {_figures(best)}"
        elif key in held:
            reason = f"chosen: {_figures(best)}"
        considered.append(Considered(site.cloud, site.accelerator, key in held, reason))
    return Decision(job.name, best, considered, starts_now=now)


def _starts_now(option: Option, sites: list[Site]) -> bool:
    """Whether every device of ``option`` is free now and delays none of the work queued ahead."""
    held = {(p.cloud, p.accelerator): p.devices for p in option.parts}
    return all(s.backfills(held[(s.cloud, s.accelerator)], option.finish_s) for s in sites
               if (s.cloud, s.accelerator) in held)


def _best(options: list[Option], sites: list[Site], w: Weights) -> tuple[Option | None, bool]:
    """The best-scored option and whether it starts now; unless ``w.wait_for_faster``, the best of those that start
    now when there are any."""
    best = min(options, key=lambda o: o.score, default=None)
    if best is None:
        return None, False
    if _starts_now(best, sites):
        return best, True
    now = [] if w.wait_for_faster else [o for o in options if _starts_now(o, sites)]
    return (min(now, key=lambda o: o.score), True) if now else (best, False)
