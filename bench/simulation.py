"""Discrete-event simulator of several compute centers fed by one job stream each.

Jobs arrive at their home center unknown before their arrival, wait, hold
their devices from dispatch to finish and run for their measured run time on
the accelerator they got. Its ``crosscloud`` policy is the production
scheduler's pass (``crosscloud.scheduler.passes.run_pass``), the one every
DAG run's admission goes through, fed the simulation's state and clock; the
reference policies (independent centers, MultiKueue-like first fit,
Karmada-like static split, and ``greedy``: production admission before the
queue) live here. They are described in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from crosscloud.pool.placement import JobRequest, Site, Weights, place
from crosscloud.scheduler.entry import Decision, Entry
from crosscloud.scheduler.passes import World, run_pass

POLICIES = ("independent", "first_fit", "static_split", "greedy", "crosscloud")
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
    tenant: str = "trace"
    priority: int = 0


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


def largest(jobs: list[SimJob], share: float = 0.05) -> set[str]:
    """The ids of the ``share`` largest jobs by devices (then by their longest run time): those a queue can starve."""
    ranked = sorted(jobs, key=lambda j: (j.devices, max(j.runtime_s.values()), j.id), reverse=True)
    return {j.id for j in ranked[: max(1, math.ceil(share * len(jobs)))]}


def max_wait_s(result: SimResult, ids: set[str]) -> float:
    """The longest wait (arrival to dispatch) of the jobs ``ids``; infinite when one never ran."""
    if any(j.id in ids for j in result.unfinished):
        return math.inf
    return max((o.dispatch_s - o.job.arrival_s for o in result.outcomes if o.job.id in ids), default=0.0)


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
                 max_parts: int = 4, max_scan: int = 256, observe: Callable[[float, dict[str, int]], None] | None = None,
                 tenant_weights: dict[str, float] | None = None):
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
        self.running: list = []  # heap of (finish, seq, parts, tenant)
        self.held: dict[str, float] = {}  # devices each tenant holds now (the queue's fair share)
        self.tenant_weights = dict(tenant_weights or {})
        self.seq = 0
        self.outcomes: list[Outcome] = []
        self.busy = {c.name: 0.0 for c in centers}
        self.useful = 0.0
        self.place_calls = 0
        self.events = 0
        self.queues: dict[str, list[SimJob]] = {c.name: [] for c in centers}  # independent
        self.queue: list[SimJob] = []  # the global queue of the other policies
        self._entries: dict[str, Entry] = {}  # crosscloud: each job as the production queue holds it
        self._jobs: dict[str, SimJob] = {}
        self._decisions: dict[tuple[str, str], Decision] = {}  # crosscloud: each queued job's last decision
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
        heapq.heappush(self.running, (finish, self.seq, tuple(parts), job.tenant))
        self.held[job.tenant] = self.held.get(job.tenant, 0) + sum(n for _, n in parts)
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

    def _sched_greedy(self, now: float) -> None:
        """Production admission before the queue: each waiting job, in arrival order, starts where placement finds
        its devices free now, and reserves nothing; whichever job asks first after a release wins."""
        keep = []
        for i, job in enumerate(self.queue):
            if not self._any_free():
                keep.extend(self.queue[i:])
                break
            sites = [Site(cloud=c.name, accelerator=c.accelerator, jurisdiction=c.jurisdiction, total=c.devices,
                          free=self.free[c.name], price_per_device_hour=c.price_per_device_hour,
                          families=frozenset({FAMILY})) for c in self.centers]
            decision = place(self.entry(job).request, sites, self.transfer_s, self.weights)
            self.place_calls += 1
            if decision.starts_now:
                o = decision.option
                self._start(now, job, [(p.cloud, p.devices) for p in o.parts], o.runtime_s, o.start_s, o.transfer_bytes)
            else:
                keep.append(job)
        self.queue = keep

    # --------------------------------------------------------------- crosscloud
    def entry(self, job: SimJob) -> Entry:
        """The job as the production queue holds it (built once)."""
        got = self._entries.get(job.id)
        if got is None:
            home = self.by_name[job.home]
            req = JobRequest(
                name=job.id, tenant=job.tenant, family=FAMILY, devices=job.devices, runtime_s=dict(job.runtime_s),
                data_bytes=job.data_bytes, data_at=frozenset({job.home}),
                residency=home.jurisdiction if job.resident else None,
                max_parts=self.max_parts, split_penalty=self.split_penalty,
            )
            got = self._entries[job.id] = Entry(job.tenant, job.id, req, job.arrival_s, priority=job.priority,
                                                runtime_s=min(job.runtime_s.values()))
            self._jobs[job.id] = job
        return got

    def world(self) -> World:
        """The centers as the production pass sees them, from the simulation's state."""
        sites = [Site(cloud=c.name, accelerator=c.accelerator, jurisdiction=c.jurisdiction, total=c.devices,
                      free=self.free[c.name], price_per_device_hour=c.price_per_device_hour,
                      families=frozenset({FAMILY})) for c in self.centers]
        return World({FAMILY: sites}, {(c.name, c.accelerator): self.free[c.name] for c in self.centers},
                     {(c.name, c.accelerator): list(self.releases[c.name]) for c in self.centers},
                     held=dict(self.held), weights=self.tenant_weights)

    def _sched_crosscloud(self, now: float) -> None:
        """The production scheduler's pass over the global queue (``crosscloud.scheduler.passes``)."""
        result = run_pass([self.entry(j) for j in self.queue], self.world(), now, self.transfer_s, self._decisions,
                          self.weights, self.max_scan)
        self.place_calls += result.decided
        for entry, decision in result.started:
            job = self._jobs[entry.run_id]
            self._start(now, job, [(c, n) for c, _, n in decision.parts], decision.runtime_s,
                        decision.expected_start_s or 0.0, decision.transfer_bytes)
            self._decisions.pop(entry.key, None)
        self._decisions.update((k, d) for k, d in result.decisions.items() if d.kind != "start")
        started = {e.run_id for e, _ in result.started}
        self.queue = [j for j in self.queue if j.id not in started]

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
                finish, _, parts, tenant = heapq.heappop(self.running)
                self.held[tenant] -= sum(n for _, n in parts)
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
