"""The queue in production: runs enter it in the ledger, one pass at a time decides, and their waiters look.

``Queue`` binds the pure pass (``passes.run_pass``) to the ledger and the live
inventory: the world a pass sees is the federation's pools less what the
ledger's reservations hold, each tenant's quota left, and when the running
runs are expected to give their devices back (their start plus their
estimated run time). A pass runs when the queue changed (a submission, a
release, a cancellation) or its last pass is ``refresh_s`` old, under a lock
that one pass at a time holds across every host; the ledger's own lock is
held only while the starts are written, and the ledger refuses a start that no
longer fits, so a pool or a quota is never oversubscribed.

A waiting entry is kept alive by its waiter (``touch``): one that nobody has
looked at for a lease expires, so a vanished waiter never blocks the queue.

A running deferrable run with a deadline may be paused by a pass
(``pauses``): its decision turns ``pause``; its watcher, which looks here
(``pause_asked``), has its sub-tasks stop after their next committed round,
then ``pause`` gives its devices back and puts it in line again for exactly
those devices, with the work it has left (measured from its rounds,
``progress``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from crosscloud.core.federation import Federation
from crosscloud.energy.prices import CsvFeed
from crosscloud.ledger import Ledger, Usage, lease_seconds
from crosscloud.ledger import engine as backend
from crosscloud.ledger.queue import WAITING
from crosscloud.ledger.records import QueueRow, Reservation
from crosscloud.pool.inventory import before_admission
from crosscloud.pool.placement import TransferTime, Weights
from crosscloud.scheduler.entry import Decision, Entry, decision_from_json, decision_json, entry_from_row, request_json
from crosscloud.scheduler.expected import LAG_H
from crosscloud.scheduler.order import ordered, rank, share
from crosscloud.scheduler.passes import PassResult, World, run_pass
from crosscloud.scheduler.pauses import Running, pausable, resumed
from crosscloud.scheduler.prices import federation_rates
from crosscloud.scheduler.timing import Rates
from crosscloud.store.network import network

Clock = Callable[[], float]


def wall_clock() -> float:
    """The scheduler's time: the wall clock (the tests move it)."""
    return time.time()


@dataclass(frozen=True)
class Status:
    """Where one run stands: its row, the last decision, and its place in line while it waits (1 first)."""

    row: QueueRow
    decision: Decision | None
    position: int | None

    @property
    def state(self) -> str:
        return self.row.state

    def explain(self) -> str:
        d = self.decision
        where = f"position {self.position}" if self.position else self.state
        return f"{where}: {d.reason if d else 'not decided yet'}"


class Queue:
    """The federation's one queue, in ``ledger``; ``clock`` is injectable (the tests move it)."""

    def __init__(self, fed: Federation, ledger: Ledger, clock: Clock | None = None, max_scan: int = 256,
                 refresh_s: float = 30.0, weights: Weights | None = None, net: TransferTime | None = None,
                 rates: Callable[[float], Rates | None] | None = None):
        self.fed, self.ledger = fed, ledger
        self.clock = clock or (lambda: wall_clock())
        self._feed = CsvFeed()
        # the prices and carbon deferrable runs are planned by: the federation's grids through the feeds
        self.rates = rates or (lambda now: federation_rates(fed, now, self._feed))
        self.max_scan, self.refresh_s = max_scan, refresh_s
        self.weights = weights or Weights(wait_for_faster=fed.wait_for_faster_pools)
        self.network = net or network(fed)
        self.quotas = {t.name: dict(t.quotas) for t in fed.tenants}
        self.tenant_weights = {t.name: t.weight for t in fed.tenants}
        self._entries: dict[tuple[int, float, str], Entry] = {}  # rows are immutable once submitted: parsed once

    # -- entering and leaving -------------------------------------------------------------
    def submit(self, entry: Entry, holder: str = "") -> QueueRow:
        """Enter ``entry`` (a run already waiting keeps its place); returns its row."""
        values = {"tenant": entry.tenant, "run_id": entry.run_id, "priority": entry.priority, "deadline": entry.deadline,
                  "deferrable": int(entry.deferrable), "objective": entry.objective, "request": request_json(entry),
                  "runtime_s": entry.runtime_s, "holder": holder}
        return self.ledger.queue.submit(values, self.clock())

    def cancel(self, tenant: str, run_id: str, reason: str = "cancelled") -> str:
        """Take a waiting run out of the queue (its waiter then fails and gives back what it wrote); returns what
        was done. A running run is stopped by its DAG run or its process, whose cleanup releases its devices."""
        if self.ledger.queue.end(tenant, run_id, "cancelled", reason, self.clock()):
            return "cancelled while waiting; its waiter stops and nothing of it holds a device"
        row = self.ledger.queue.get(tenant, run_id)
        if row is not None and row.state == "running":
            return ("not cancelled: it is running; stop its DAG run (mark it failed) or its process, and its cleanup "
                    "gives its devices back")
        return "nothing to cancel: it is not waiting in the queue"

    def touch(self, tenant: str, run_id: str) -> None:
        self.ledger.queue.touch(tenant, run_id, self.clock())

    # -- the pass -------------------------------------------------------------------------
    def run_pass(self, force: bool = False, blocking: bool = True,
                 decided_since: tuple[str, str, float] | None = None) -> PassResult | None:
        """One scheduling pass, if the queue changed or the last is ``refresh_s`` old (or ``force``); None when none
        was due. While another host's pass runs it waits, or with ``blocking=False`` leaves it to that one and to
        the next look: a waiter looks again anyway. ``decided_since`` (tenant, run id, time): no pass is due if
        a pass has decided that run since then (the one this call waited for, most often)."""
        with backend.pass_lock(self.ledger.engine, blocking) as taken:
            if not taken or (decided_since is not None and self._decided(*decided_since)):
                return None
            version, seen, passed_at = self.ledger.queue.version()
            now = self.clock()
            # a clock stepped back (NTP) does not hold passes off
            if not force and version == seen and passed_at is not None and 0 <= now - passed_at < self.refresh_s:
                return None
            expired = self.ledger.queue.expire(now - lease_seconds(), now)
            rows, running = self.ledger.queue.rows(WAITING), self.ledger.queue.rows(("running",))
            result = self._decide(rows, running, now) if rows or running else PassResult({}, [])
            # its own changes (each bumped the version once) are seen; another host's meanwhile are not
            self.ledger.queue.passed(version + bool(expired) + bool(result.started), now)
            return result

    def _decided(self, tenant: str, run_id: str, since: float) -> bool:
        row = self.ledger.queue.get(tenant, run_id)
        return row is not None and (row.state not in WAITING or (row.decided_at or -1.0) >= since)

    def _decide(self, rows: list[QueueRow], running_rows: list[QueueRow], now: float) -> PassResult:
        entries = [self._entry(r) for r in rows]
        active = self.ledger.active()
        running = self._running(running_rows, active, now)
        world = self.world(entries + [r.entry for r in running], now, active)
        previous = {(r.tenant, r.run_id): decision_from_json(r.decision) for r in rows}
        deferrable = running or any(e.deferrable and e.deadline is not None for e in entries)
        rates = self.rates(now) if deferrable else None
        # the last day's submissions: the work expected again, that the plan of deferred runs leaves room for
        recent_rows = self.ledger.queue.submitted_since(now - LAG_H * 3600) if rates else []
        recent = [self._entry(r) for r in recent_rows]
        # the parsed rows kept are this pass's: a long-lived triggerer does not keep every row it ever saw
        used = {self._key(r) for r in (*rows, *running_rows, *recent_rows)}
        self._entries = {k: e for k, e in self._entries.items() if k in used}
        result = run_pass(entries, world, now, self.network, {k: d for k, d in previous.items() if d},
                          self.weights, self.max_scan, rates, running, recent=recent)
        ids = {(r.tenant, r.run_id): r.id for r in rows}
        holders = {r.id: r.holder for r in rows}
        # each under its own waiter's name: where to look when its lease lapses
        starts = [(ids[e.key], e.tenant, e.run_id, list(d.parts), decision_json(d), holders[ids[e.key]])
                  for e, d in result.started]
        started = set(self.ledger.start(starts, self.fed.capacity(), self.quotas, now=now))
        late = [(e, d) for e, d in result.started if ids[e.key] not in started]  # another host took them first
        result.started = [(e, d) for e, d in result.started if ids[e.key] in started]
        for e, d in late:
            result.decisions[e.key] = Decision("wait", "its devices were taken by a run started meanwhile; "
                                               "the next pass decides it again", considered=d.considered)
        changed = [(ids[k], decision_json(d)) for k, d in result.decisions.items()
                   if ids[k] not in started and d != previous.get(k)]
        running_ids = {(r.tenant, r.run_id): r.id for r in running_rows}
        changed += [(running_ids[e.key], decision_json(d)) for e, d in result.paused]
        self.ledger.queue.record(changed, now)
        return result

    def _running(self, rows: list[QueueRow], active: list[Reservation], now: float) -> list[Running]:
        """The running runs a pass may pause: deferrable with a deadline, not asked to pause yet, with the devices
        they hold and the work they have left."""
        held: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
        for r in active:
            held.setdefault((r.tenant, r.run_id), []).append((r.cloud, r.accelerator, r.devices))
        out = []
        for row in rows:
            parts = held.get((row.tenant, row.run_id))
            decision = decision_from_json(row.decision)
            if not parts or (decision is not None and decision.kind == "pause") or row.started_at is None:
                continue
            end = row.started_at + row.runtime_s
            entry = replace(self._entry(row), parts=tuple(sorted(parts)), runtime_s=max(end - now, 0.0))
            if pausable(entry):
                out.append(Running(entry, max(end, now + 60.0)))
        return out

    # -- a running run's side: its progress, and a pause ----------------------------------
    def progress(self, tenant: str, run_id: str, remaining_s: float) -> None:
        """The run's work left, measured from its rounds: its expected end moves with it."""
        row = self.ledger.queue.get(tenant, run_id)
        if row is not None and row.state == "running" and row.started_at is not None:
            self.ledger.queue.estimate(tenant, run_id, max(self.clock() - row.started_at, 0.0) + remaining_s)

    def pause_asked(self, tenant: str, run_id: str) -> Decision | None:
        """The pause a pass decided for this running run, if any (a pass runs first if one is due)."""
        self.run_pass(blocking=False)
        row = self.ledger.queue.get(tenant, run_id)
        decision = decision_from_json(row.decision) if row is not None and row.state == "running" else None
        return decision if decision is not None and decision.kind == "pause" else None

    def pause(self, tenant: str, run_id: str, remaining_s: float) -> int:
        """The run's sub-tasks stopped after a committed round: its devices go back and it waits for exactly them,
        with ``remaining_s`` of work left; returns the devices it gave back."""
        row = self.ledger.queue.get(tenant, run_id)
        if row is None or row.state != "running":
            return 0
        parts = tuple(sorted((r.cloud, r.accelerator, r.devices) for r in self.ledger.active(tenant, run_id)))
        entry = resumed(replace(self._entry(row), parts=parts, runtime_s=remaining_s))
        asked = decision_from_json(row.decision)
        decision = replace(asked, reason=f"paused: {asked.reason}") if asked else Decision("wait", "paused")
        return self.ledger.pause(tenant, run_id, request_json(entry), entry.runtime_s, decision_json(decision),
                                 self.clock())

    @staticmethod
    def _key(row: QueueRow) -> tuple[int, float, str]:
        return row.id, row.submitted_at, row.request

    def _entry(self, row: QueueRow) -> Entry:
        key = self._key(row)
        got = self._entries.get(key)
        if got is None:
            got = self._entries[key] = entry_from_row(row, self.quotas.get(row.tenant, {}))
        return got

    def world(self, entries: list[Entry], now: float, active: list[Reservation] | None = None) -> World:
        """The pools as the pass sees them now: free devices, quotas left, expected releases, each tenant's use."""
        active = self.ledger.active() if active is None else active
        usage = Usage.of(active)
        inventory = before_admission(self.fed, self.ledger).with_usage(usage)
        sites = {f: inventory.sites(f) for f in {e.request.family for e in entries}}
        free = {(c.name, p.accelerator): p.free for c in inventory.clouds for p in c.pools}
        ends = {(r.tenant, r.run_id): (r.started_at or now) + r.runtime_s
                for r in self.ledger.queue.rows(("running",)) if r.runtime_s > 0}
        releases: dict[tuple[str, str], list[tuple[float, int]]] = {}
        for res in active:
            end = ends.get((res.tenant, res.run_id))
            if end is not None:  # a run admitted before the queue, or of unknown length, frees nothing known
                releases.setdefault((res.cloud, res.accelerator), []).append((max(end, now + 60.0), res.devices))
        for got in releases.values():
            got.sort()
        quota_left = {t: {c: q - usage.tenant(t, c) for c, q in quota.items()} for t, quota in self.quotas.items()}
        return World(sites, free, releases, quota_left, usage.by_tenant(), dict(self.tenant_weights))

    # -- looking ------------------------------------------------------------------------
    def listing(self, tenant: str | None = None) -> list[Status]:
        """The waiting runs in the order the next pass considers them, then the running ones; a tenant sees its own."""
        waiting = self.ledger.queue.rows(WAITING)
        held = self.ledger.usage().by_tenant()
        line = ordered([self._entry(r) for r in waiting], held, self.tenant_weights)
        by_key = {(r.tenant, r.run_id): r for r in waiting}
        out = [Status(by_key[e.key], decision_from_json(by_key[e.key].decision), i) for i, e in enumerate(line, start=1)]
        out += [Status(r, decision_from_json(r.decision), None) for r in self.ledger.queue.rows(("running",))]
        return [s for s in out if tenant is None or s.row.tenant == tenant]

    def status(self, tenant: str, run_id: str) -> Status:
        row = self.ledger.queue.get(tenant, run_id)
        if row is None:
            raise KeyError(f"run {run_id} of tenant {tenant} is not in the queue")
        return Status(row, decision_from_json(row.decision), self._position(row) if row.state in WAITING else None)

    def _position(self, row: QueueRow) -> int:
        """Its place in the order the next pass considers the waiting runs (from their terms alone: cheap)."""
        held = self.ledger.usage().by_tenant()

        def key(tenant: str, priority: int, submitted_at: float, run_id: str) -> tuple:
            return rank(priority, share(held.get(tenant, 0.0), self.tenant_weights.get(tenant)), submitted_at, tenant,
                        run_id)

        mine = key(row.tenant, row.priority, row.submitted_at, row.run_id)
        return 1 + sum(key(*other) < mine for other in self.ledger.queue.line())


def expected_start(status: Status, now: float) -> float:
    """Epoch seconds the run is expected to start; infinite when nothing known frees its devices."""
    d = status.decision
    if d is None or d.expected_start_s is None or math.isinf(d.expected_start_s):
        return math.inf
    return (status.row.decided_at or now) + d.expected_start_s
