"""Discrete-event simulator of several compute centers fed by one job stream each.

Jobs arrive at their home center unknown before their arrival, wait, hold
their devices from dispatch to finish and run for their measured run time on
the accelerator they got. Its ``crosscloud`` policy calls the placement the
DAGs use, so ``bench-scheduling`` measures that code against the policies of
independent centers, MultiKueue and Karmada; the policies are described in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from crosscloud.pool.placement import JobRequest, Site, Weights, place

POLICIES = ("independent", "first_fit", "static_split", "crosscloud")
FAMILY = "trace"


@dataclass(frozen=True)
class Center:
    name: str
    accelerator: str
    devices: int
    jurisdiction: str
    price_per_device_hour: float = 0.0


@dataclass(frozen=True)
class SimJob:
    """A job of a trace: where it arrives, its size and its run time per accelerator type."""

    id: str
    home: str
    arrival_s: float
    devices: int
    runtime_s: dict  # accelerator type -> seconds, the whole job alone on ``devices`` devices of that type
    data_bytes: int = 0
    resident: bool = False  # its data may not leave the home center's jurisdiction
    job_type: str = ""


@dataclass
class Outcome:
    job: SimJob
    dispatch_s: float  # devices held from here (data transfer, then run)
    run_start_s: float
    finish_s: float
    parts: tuple[tuple[str, int], ...]
    bytes_forwarded: int

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.job.arrival_s

    @property
    def forwarded(self) -> bool:
        return any(c != self.job.home for c, _ in self.parts)


@dataclass
class SimResult:
    policy: str
    centers: list[Center]
    window_s: float
    outcomes: list[Outcome]
    unfinished: list[SimJob]
    busy_device_s: dict[str, float]  # per center, within [0, window)
    useful_device_s: float  # device-seconds at the ideal rate done within [0, window)
    events: int = 0
    place_calls: int = 0


def ideal_s(job: SimJob, accelerators) -> float:
    """The job's run time alone on the fastest accelerator type of the federation, no waiting, no split."""
    return min(job.runtime_s[a] for a in accelerators)


def metrics(result: SimResult) -> dict:
    """Per-policy figures; see the bench module's docstring for the definitions."""
    accs = {c.accelerator for c in result.centers}
    by_name = {c.name: c for c in result.centers}
    effs = [ideal_s(o.job, accs) / o.jct_s for o in result.outcomes]
    effs += [0.0] * len(result.unfinished)  # a job that never ran has efficiency 0
    jcts = sorted(o.jct_s for o in result.outcomes)
    n = len(jcts)
    p95 = jcts[min(n - 1, max(0, math.ceil(0.95 * n) - 1))] if n else math.nan
    w = result.window_s
    return {
        "jobs": n + len(result.unfinished),
        "unfinished": len(result.unfinished),
        "efficiency": sum(effs) / len(effs) if effs else math.nan,
        "mean_jct_s": sum(jcts) / n if n else math.nan,
        "p95_jct_s": p95,
        "useful_device_hours_per_hour": result.useful_device_s / w,
        "utilization": {c.name: result.busy_device_s[c.name] / (c.devices * w) for c in result.centers},
        "forwarded_jobs": sum(o.forwarded for o in result.outcomes),
        "split_jobs": sum(len(o.parts) > 1 for o in result.outcomes),
        "faster_jobs": sum(_faster(o, by_name) for o in result.outcomes),
        "bytes_forwarded": sum(o.bytes_forwarded for o in result.outcomes),
    }


def _faster(o: Outcome, by_name: dict) -> bool:
    """Whether the job ran faster than it would have alone on its home center's accelerator."""
    home = o.job.runtime_s[by_name[o.job.home].accelerator]
    return o.finish_s - o.run_start_s < home * (1 - 1e-9)


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


class Simulation:
    """One run of one policy over one scenario; ``run()`` returns a ``SimResult``."""

    def __init__(self, centers: list[Center], jobs: list[SimJob], policy: str, *, window_s: float | None = None,
                 bandwidth_bytes_per_s: float = 1.25e9, split_penalty: float = 0.0, weights: Weights = Weights(),
                 max_parts: int = 4, max_scan: int = 256, observe: Callable[[float, dict[str, int]], None] | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        names = [c.name for c in centers]
        if len(set(names)) != len(names):
            raise ValueError("center names must be unique")
        self.centers = list(centers)
        self.by_name = {c.name: c for c in centers}
        for j in jobs:
            if j.home not in self.by_name:
                raise ValueError(f"job {j.id}: home center {j.home!r} is not simulated")
            missing = {c.accelerator for c in centers} - set(j.runtime_s)
            if missing:
                raise ValueError(f"job {j.id}: no run time on {', '.join(sorted(missing))}")
        self.jobs = sorted(jobs, key=lambda j: j.arrival_s)  # stable: file order among equal arrivals
        self.policy = policy
        self.window_s = window_s if window_s is not None else max((j.arrival_s for j in jobs), default=0.0) or 1.0
        self.bandwidth = bandwidth_bytes_per_s
        self.split_penalty = split_penalty
        self.weights = weights
        self.max_parts = max_parts
        self.max_scan = max_scan  # crosscloud: a pass places at most this many queued jobs that do not start
        self.observe = observe
        self.accelerators = {c.accelerator for c in centers}
        self.free = {c.name: c.devices for c in centers}
        self.releases: dict[str, list[tuple[float, int]]] = {c.name: [] for c in centers}  # sorted (time, devices)
        self.running: list = []  # heap of (finish, seq, parts)
        self.seq = 0
        self.outcomes: list[Outcome] = []
        self.busy = {c.name: 0.0 for c in centers}
        self.useful = 0.0
        self.place_calls = 0
        self.events = 0
        self.queues: dict[str, list[SimJob]] = {c.name: [] for c in centers}  # independent
        self.queue: list[SimJob] = []  # the global queue of the other policies
        self._requests: dict[str, JobRequest] = {}
        self._waits_for: dict[str, list[tuple[str, int, float]]] = {}  # crosscloud: where a queued job waits
        self._swrr: dict[tuple[str, ...], dict[str, int]] = {}
        self.allowed = {}  # job id -> centers it may use (residency)

    # ----------------------------------------------------------------- helpers
    def _allowed(self, job: SimJob) -> list[Center]:
        got = self.allowed.get(job.id)
        if got is None:
            if job.resident:
                j = self.by_name[job.home].jurisdiction
                got = [c for c in self.centers if c.jurisdiction == j]
            else:
                got = self.centers
            self.allowed[job.id] = got
        return got

    def transfer_s(self, src: str, dst: str, nbytes: int) -> float:
        return 0.0 if src == dst or not nbytes else nbytes / self.bandwidth

    def _start(self, now: float, job: SimJob, parts: list[tuple[str, int]], runtime: float, transfer: float,
               nbytes: int) -> None:
        for name, n in parts:
            if n > self.free[name]:
                raise AssertionError(f"t={now}: {job.id} takes {n} on {name} with {self.free[name]} free")
        run_start = now + transfer
        finish = run_start + runtime
        for name, n in parts:
            self.free[name] -= n
            bisect.insort(self.releases[name], (finish, n))
            self.busy[name] += n * _overlap(now, finish, 0.0, self.window_s)
        if runtime > 0:
            ideal = ideal_s(job, self.accelerators)
            self.useful += job.devices * ideal * _overlap(run_start, finish, 0.0, self.window_s) / runtime
        self.seq += 1
        heapq.heappush(self.running, (finish, self.seq, tuple(parts)))
        self.outcomes.append(Outcome(job, now, run_start, finish, tuple(parts), nbytes))

    def _shadow(self, name: str, devices: int, now: float) -> tuple[float, int]:
        """EASY backfill: when ``devices`` are free on ``name``, and how many spare devices then."""
        have = self.free[name]
        for t, n in self.releases[name]:
            have += n
            if have >= devices:
                return t, have - devices
        return math.inf, 0

    def _split_runtime(self, job: SimJob, parts: list[tuple[str, int]]) -> float:
        """The split model of placement: each part at its own speed, rates add up, plus the split penalty."""
        if len(parts) == 1:
            return job.runtime_s[self.by_name[parts[0][0]].accelerator]
        rate = sum(n / job.devices / job.runtime_s[self.by_name[c].accelerator] for c, n in parts)
        return (1 + self.split_penalty) / rate

    # ------------------------------------------------------ reference policies
    def _fits(self, name: str, devices: int, finish: float, res: dict) -> bool:
        if devices > self.free[name]:
            return False
        r = res.get(name)
        return r is None or finish <= r[0] or devices <= r[1]

    def _take(self, name: str, devices: int, finish: float, res: dict) -> None:
        r = res.get(name)
        if r is not None and finish > r[0]:
            res[name] = (r[0], r[1] - devices)

    def _reserve(self, res: dict, name: str, devices: int, now: float) -> None:
        if name not in res:
            res[name] = self._shadow(name, devices, now)

    def _sched_independent(self, now: float) -> None:
        for c in self.centers:
            q, name = self.queues[c.name], c.name
            if not q or self.free[name] == 0:
                continue
            res, keep = {}, []
            for i, job in enumerate(q):
                if self.free[name] == 0:
                    keep.extend(q[i:])
                    break
                rt = job.runtime_s[c.accelerator]
                if self._fits(name, job.devices, now + rt, res):
                    self._take(name, job.devices, now + rt, res)
                    self._start(now, job, [(name, job.devices)], rt, 0.0, 0)
                else:
                    if job.devices <= c.devices:
                        self._reserve(res, name, job.devices, now)
                    keep.append(job)
            self.queues[name] = keep

    def _any_free(self) -> bool:
        return any(self.free.values())

    def _sched_first_fit(self, now: float) -> None:
        res, keep = {}, []
        for i, job in enumerate(self.queue):
            if not self._any_free():
                keep.extend(self.queue[i:])
                break
            allowed = self._allowed(job)
            order = sorted(allowed, key=lambda c: c.name != job.home)  # own center first, then in order
            for c in order:
                transfer = self.transfer_s(job.home, c.name, job.data_bytes)
                rt = job.runtime_s[c.accelerator]
                if self._fits(c.name, job.devices, now + transfer + rt, res):
                    self._take(c.name, job.devices, now + transfer + rt, res)
                    self._start(now, job, [(c.name, job.devices)], rt, transfer,
                                job.data_bytes if c.name != job.home else 0)
                    break
            else:
                cands = [c for c in order if c.devices >= job.devices]
                if cands:
                    best = min(cands, key=lambda c: self._shadow(c.name, job.devices, now)[0])
                    self._reserve(res, best.name, job.devices, now)
                keep.append(job)
        self.queue = keep

    def _divide(self, job: SimJob) -> list[tuple[str, int]]:
        allowed = self._allowed(job)
        total_w = sum(c.devices for c in allowed)
        base = {c.name: job.devices * c.devices // total_w for c in allowed}
        key = tuple(c.name for c in allowed)
        state = self._swrr.setdefault(key, {c.name: 0 for c in allowed})
        for _ in range(job.devices - sum(base.values())):  # smooth weighted round robin for the remainder
            for c in allowed:
                state[c.name] += c.devices
            pick = max(allowed, key=lambda c: state[c.name])  # first of equals: deterministic
            state[pick.name] -= total_w
            base[pick.name] += 1
        return [(c.name, base[c.name]) for c in allowed if base[c.name] > 0]

    def _sched_static_split(self, now: float) -> None:
        res, keep = {}, []
        for i, job in enumerate(self.queue):
            if not self._any_free():
                keep.extend(self.queue[i:])
                break
            parts = self._parts.get(job.id)
            if parts is None:
                parts = self._parts[job.id] = self._divide(job)
            rt = self._split_runtime(job, parts)
            transfer = max(self.transfer_s(job.home, c, job.data_bytes) for c, _ in parts)
            finish = now + transfer + rt
            if all(self._fits(c, n, finish, res) for c, n in parts):
                for c, n in parts:
                    self._take(c, n, finish, res)
                nbytes = sum(job.data_bytes for c, _ in parts if c != job.home)
                self._start(now, job, parts, rt, transfer, nbytes)
            else:
                for c, n in parts:
                    if n > self.free[c]:
                        self._reserve(res, c, n, now)
                keep.append(job)
        self.queue = keep

    # --------------------------------------------------------------- crosscloud
    def request(self, job: SimJob) -> JobRequest:
        req = self._requests.get(job.id)
        if req is None:
            home = self.by_name[job.home]
            req = JobRequest(
                name=job.id, tenant="trace", family=FAMILY, devices=job.devices, runtime_s=dict(job.runtime_s),
                data_bytes=job.data_bytes, data_at=frozenset({job.home}),
                residency=home.jurisdiction if job.resident else None,
                max_parts=self.max_parts, split_penalty=self.split_penalty,
            )
            self._requests[job.id] = req
        return req

    def site(self, c: Center, now: float, queued_device_s: float = 0.0, queued_devices: int = 0) -> Site:
        return Site(
            cloud=c.name, accelerator=c.accelerator, jurisdiction=c.jurisdiction, total=c.devices,
            free=self.free[c.name], price_per_device_hour=c.price_per_device_hour, families=frozenset({FAMILY}),
            queued_device_s=queued_device_s, queued_devices=queued_devices, frees=tuple((t - now, n) for t, n in self.releases[c.name]),
        )

    def _could_start_now(self, job: SimJob, ahead: dict) -> bool:
        """Whether any option of ``job`` could start now (necessary for ``starts_now``, cheap to check)."""
        names = [c.name for c in self._allowed(job)]
        if any(self.free[n] >= job.devices for n in names):
            return True
        spare = [self.free[n] for n in names if self.free[n] > 0 and ahead[n] == 0]
        return job.devices > 1 and len(spare) > 1 and sum(spare[: self.max_parts]) >= job.devices

    def _sched_crosscloud(self, now: float) -> None:
        ahead = {c.name: 0.0 for c in self.centers}
        ahead_n = {c.name: 0 for c in self.centers}
        sites = {c.name: self.site(c, now) for c in self.centers}
        stale: set[str] = set()
        network = self.transfer_s
        keep = []
        for i, job in enumerate(self.queue):
            if not self._any_free() or len(keep) >= self.max_scan:
                keep.extend(self.queue[i:])
                break
            waits_for = self._waits_for.get(job.id)
            if waits_for is None or self._could_start_now(job, ahead):
                for name in stale:
                    sites[name] = self.site(self.by_name[name], now, ahead[name], ahead_n[name])
                stale.clear()
                self.place_calls += 1
                decision = place(self.request(job), list(sites.values()), network, self.weights)
                option = decision.option
                if decision.starts_now:
                    parts = [(p.cloud, p.devices) for p in option.parts]
                    self._start(now, job, parts, option.runtime_s, option.start_s, option.transfer_bytes)
                    self._waits_for.pop(job.id, None)
                    stale.update(name for name, _ in parts)
                    continue
                waits_for = [(p.cloud, p.devices, p.devices * option.runtime_s) for p in option.parts] if option else []
                self._waits_for[job.id] = waits_for
            # it waits for these devices (its latest decision while it cannot start anywhere):
            # later jobs see the work queued ahead of them
            for name, n, device_s in waits_for:
                ahead[name] += device_s
                ahead_n[name] += n
                stale.add(name)
            keep.append(job)
        self.queue = keep

    # -------------------------------------------------------------------- loop
    def run(self) -> SimResult:
        self._parts: dict[str, list[tuple[str, int]]] = {}
        schedule = getattr(self, f"_sched_{self.policy}")
        arrivals, a = self.jobs, 0
        while a < len(arrivals) or self.running:
            t_arr = arrivals[a].arrival_s if a < len(arrivals) else math.inf
            t_fin = self.running[0][0] if self.running else math.inf
            now = min(t_arr, t_fin)
            changed = False
            while self.running and self.running[0][0] <= now:
                finish, _, parts = heapq.heappop(self.running)
                for name, n in parts:
                    self.free[name] += n
                    rel = self.releases[name]
                    del rel[bisect.bisect_left(rel, (finish, n))]
                changed = True
            while a < len(arrivals) and arrivals[a].arrival_s <= now:
                job = arrivals[a]
                if self.policy == "independent":
                    self.queues[job.home].append(job)
                else:
                    self.queue.append(job)
                a += 1
                changed = True
            if changed:
                self.events += 1
                schedule(now)
                self._check(now)
        unfinished = self.queue + [j for q in self.queues.values() for j in q]
        return SimResult(self.policy, self.centers, self.window_s, self.outcomes, unfinished, dict(self.busy),
                         self.useful, self.events, self.place_calls)

    def _check(self, now: float) -> None:
        used = {}
        for c in self.centers:
            f = self.free[c.name]
            if not 0 <= f <= c.devices:
                raise AssertionError(f"t={now}: center {c.name} has {f} free of {c.devices}")
            used[c.name] = c.devices - f
        if self.observe is not None:
            self.observe(now, used)


def simulate(centers: list[Center], jobs: list[SimJob], policy: str, **kw) -> SimResult:
    return Simulation(centers, jobs, policy, **kw).run()
