"""One scheduling pass: every queued entry in order gets a decision, and the devices of those that start are taken.

The pass is the simulator's global queue, now the production policy: entries
are considered in fair-share order (``order``); one that cannot start now
reserves the devices it waits for (``Decision.waits_for``), and those count as
work queued ahead of every entry behind it (``Site.queued_devices``), which
then starts only where it delays none of them (EASY backfilling). Its cost is
bounded: at most ``max_scan`` entries that do not start are decided afresh; an
entry whose earlier decision still holds (it cannot start now) keeps it at the
price of a few comparisons (none once no device is free). A deferrable run
with a deadline is planned by ``timing``: deferred to a cheaper or cleaner
hour when the deadline guard allows, which holds nothing meanwhile.

Nothing here reads a clock or a database: the caller gives ``now`` and the
``World``, so the DAGs' admission and the benchmarks run the same pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from crosscloud.pool.placement import Site, TransferTime, Weights, refusal
from crosscloud.scheduler.decide import decide
from crosscloud.scheduler.entry import Decision, Entry
from crosscloud.scheduler.expected import expected_work
from crosscloud.scheduler.order import FairOrder
from crosscloud.scheduler.pauses import Running, decide_pauses, make_room, pausable, resumed
from crosscloud.scheduler.timing import Rates, Timing

Key = tuple[str, str]  # (cloud, accelerator)


@dataclass
class World:
    """The pools as one pass sees them; the pass takes devices from it as it starts entries.

    ``sites``: per model family, every pool as placement sees it (its ``free``
    and ``frees`` are replaced by the pass's own). ``releases``: per pool,
    (epoch seconds, devices) the running work gives back, ascending.
    ``quota_left``: per tenant and cloud, the devices it may still take (None:
    no quotas). ``held``: devices each tenant holds now, for fair share.
    """

    sites: dict[str, list[Site]]
    free: dict[Key, int]
    releases: dict[Key, list[tuple[float, int]]] = field(default_factory=dict)
    quota_left: dict[str, dict[str, int]] | None = None
    held: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def any_free(self) -> bool:
        return any(n > 0 for n in self.free.values())

    def room(self, tenant: str, key: Key) -> int:
        """Devices of pool ``key`` the tenant may take now."""
        free = self.free.get(key, 0)
        if self.quota_left is None:
            return free
        return max(0, min(free, self.quota_left.get(tenant, {}).get(key[0], 0)))

    def take(self, tenant: str, parts: Iterable[tuple[str, str, int]], until: float) -> None:
        """The devices of a start, held until ``until`` (epoch seconds)."""
        for cloud, accelerator, n in parts:
            key = (cloud, accelerator)
            if n > self.free.get(key, 0):
                raise AssertionError(f"{cloud}/{accelerator}: {n} taken with {self.free.get(key, 0)} free")
            self.free[key] -= n
            bisect.insort(self.releases.setdefault(key, []), (until, n))
            if self.quota_left is not None:
                left = self.quota_left.setdefault(tenant, {})
                left[cloud] = left.get(cloud, 0) - n
            self.held[tenant] = self.held.get(tenant, 0.0) + n


@dataclass
class PassResult:
    decisions: dict[tuple[str, str], Decision]  # (tenant, run_id) -> decision of the entries looked at
    started: list[tuple[Entry, Decision]]
    decided: int = 0  # entries decided afresh (``decide`` calls)
    unseen: list[Entry] = field(default_factory=list)  # the rest, in order: they keep their earlier decision
    paused: list[tuple[Entry, Decision]] = field(default_factory=list)  # running runs to pause after their round

    def positions(self) -> dict[tuple[str, str], int]:
        """Every entry still queued after the pass and its place in line, 1 first."""
        waiting = [k for k, d in self.decisions.items() if d.kind not in ("start", "never")]
        return {k: i for i, k in enumerate(waiting + [e.key for e in self.unseen], start=1)}


class _Pass:
    """The state of one pass: the work queued ahead per pool, and the sites built from it."""

    def __init__(self, world: World, now: float, network: TransferTime, weights: Weights, timing: Timing | None = None):
        self.world, self.now, self.network, self.weights, self.timing = world, now, network, weights, timing
        self.ahead: dict[Key, list[float]] = {}  # pool -> [device-seconds, devices] of work waiting for it
        self.frees: dict[Key, tuple[tuple[float, int], ...]] = {}
        self.pools: dict[tuple[str, str], list[Key]] = {}  # entry -> the pools it may ever use

    def _frees(self, key: Key) -> tuple[tuple[float, int], ...]:
        got = self.frees.get(key)
        if got is None:
            got = self.frees[key] = tuple((max(t - self.now, 0.0), n) for t, n in self.world.releases.get(key, ()))
        return got

    def sites(self, entry: Entry) -> list[Site]:
        out = []
        for s in self.world.sites.get(entry.request.family, ()):
            key = (s.cloud, s.accelerator)
            ahead = self.ahead.get(key, (0.0, 0))
            out.append(replace(s, free=self.world.room(entry.tenant, key), queued_device_s=ahead[0],
                               queued_devices=int(ahead[1]), frees=self._frees(key)))
        return out

    def eligible(self, entry: Entry) -> list[Key]:
        got = self.pools.get(entry.key)
        if got is None and entry.parts is not None:  # a paused run: the pools of its saved state, nowhere else
            got = self.pools[entry.key] = [(c, a) for c, a, _ in entry.parts]
        if got is None:
            got = self.pools[entry.key] = [(s.cloud, s.accelerator) for s in self.world.sites.get(entry.request.family, ())
                                           if not refusal(entry.request, s)]
        return got

    def could_start(self, entry: Entry) -> bool:
        """Whether ``entry`` might start now: cheap, and never False where ``decide`` would start it."""
        job, rooms = entry.request, []
        if entry.parts is not None:
            return all(self.world.room(entry.tenant, (c, a)) >= n for c, a, n in entry.parts)
        for key in self.eligible(entry):
            room = self.world.room(entry.tenant, key)
            if room >= job.devices or (entry.spread is not None and room > 0):
                return True
            if room > 0 and self.ahead.get(key, (0, 0))[1] == 0:
                rooms.append(room)
        rooms.sort(reverse=True)
        return job.splittable and job.devices > 1 and len(rooms) > 1 and sum(rooms[: job.max_parts]) >= job.devices

    def hold_back(self, decision: Decision) -> None:
        """Later entries see the devices ``decision`` waits for as work queued ahead of them."""
        for cloud, accelerator, n in decision.waits_for():
            got = self.ahead.setdefault((cloud, accelerator), [0.0, 0])
            got[0] += n * decision.runtime_s
            got[1] += n

    def start(self, entry: Entry, decision: Decision) -> None:
        self.world.take(entry.tenant, decision.parts, self.now + decision.hold_s)
        for cloud, accelerator, n in decision.parts:
            self.frees.pop((cloud, accelerator), None)
            if self.timing is not None:
                self.timing.hold((cloud, accelerator), n, self.now + decision.hold_s)
        if self.timing is not None:
            self.timing.started(entry)

    def timed(self, entry: Entry, prev: Decision | None = None) -> Decision:
        """A deferrable run with a deadline: deferred to its cheapest hour unless the deadline guard says it is due,
        else decided now, on the pools cheapest now first (see ``timing``). Its cost had it started when first
        planned is carried from ``prev``, so a start says what waiting saved."""
        eligible, timing = self.eligible(entry), self.timing
        why = timing.infeasible(entry)
        choice = None if why else timing.choose(entry, eligible)
        first = prev.first_cost if prev is not None and prev.first_cost else (
            (choice.usd_now, choice.kg_now) if choice is not None else None)
        due = timing.is_due(entry)
        if choice is not None and choice.start > 0 and not due:
            timing.defer(entry, choice)
            return replace(timing.plan(entry, choice), first_cost=first)
        decision = self._now(entry, choice)
        if decision.kind == "start" and not due and not timing.may_start(entry, decision.parts, decision.hold_s):
            return Decision("wait", "waits: starting it now would leave a deferred run's deadline without a schedule",
                            considered=decision.considered, first_cost=first)
        if why:
            decision = replace(decision, reason=f"{why}; it runs as soon as it can: {decision.reason}",
                               at_risk=timing.named.get(entry.key, ""))
        elif due:
            decision = replace(decision, reason=f"due now (waiting longer would leave a deadline without a schedule): "
                                                f"{decision.reason}")
        return replace(decision, first_cost=first, saved=_saved(first, timing.cost_now(entry, decision.parts))
                       if decision.kind == "start" else None)

    def _now(self, entry: Entry, choice) -> Decision:
        """The decision now: on the pools ``choice`` found cheapest, else on the others by what starting on them now
        costs, cheapest first; placement over them all only where none of them starts it (to reserve or wait)."""
        sites = self.sites(entry)
        if entry.spread is None and entry.parts is None:
            options = [choice.keys] if choice is not None else []
            options += [o for o in self.timing.cheapest_now(entry, self.eligible(entry)) if o not in options]
            for keys in options:
                pools = [s for s in sites if (s.cloud, s.accelerator) in keys and s.free > 0]
                if pools and (decision := decide(entry, pools, self.network, self.weights)).kind == "start":
                    return decision
        return decide(entry, sites, self.network, self.weights)


def _saved(first, now) -> tuple[float, float | None] | None:
    """What starting now saves against starting when first planned: USD, and kg CO2 where both are known."""
    if first is None or now is None:
        return None
    kg = first[1] - now[1] if first[1] is not None and now[1] is not None else None
    return first[0] - now[0], kg


def run_pass(entries: Iterable[Entry], world: World, now: float, network: TransferTime,
             previous: Mapping[tuple[str, str], Decision] | None = None, weights: Weights = Weights(),
             max_scan: int = 256, rates: Rates | None = None, running: Iterable[Running] = (),
             make_room_for_due: bool = True, recent: Iterable[Entry] = ()) -> PassResult:
    """Decide every entry of the queue at ``now`` (epoch or simulated seconds); see the module docstring.

    ``previous``: each entry's decision of the last pass. ``world`` is changed:
    the devices of the entries that start are taken from it. ``rates``: the
    hourly prices and carbon that deferrable runs are planned by (``timing``);
    without them every run is decided as if it were not deferrable.
    ``running``: the running runs that may be paused (``pauses``): for prices, and with ``make_room_for_due`` for a
    run that must start within the hour to meet its deadline and finds no devices.
    ``recent``: the runs submitted in the last day, whatever became of them: the work expected again (``expected``)
    that the plan of deferred runs leaves room for.
    """
    previous = previous or {}
    entries, running = list(entries), [r for r in running if pausable(r.entry)]
    timing = _timing(entries, running, world, now, rates)
    order = FairOrder(entries, world.held, world.weights)
    state = _Pass(world, now, network, weights, timing)
    out, due = PassResult({}, []), []
    if timing is not None:  # every waiting deferrable run's deadline is protected; some must start now
        timing.named = {k: d.at_risk for k, d in previous.items() if d.at_risk}
        timed = [e for e in entries if e.deferrable and e.deadline is not None]
        for e in timed:  # the work admitted before this pass, then what arrived since, in order
            if e.key in previous:
                timing.admit(e, state.eligible(e))
        arrived = sorted((e for e in timed if e.key not in previous), key=lambda e: e.submitted_at)
        timing.arrive([(e, state.eligible(e)) for e in arrived],
                      [(resumed(r.entry), r.until) for r in running] if make_room_for_due else [])
        timing.settle()
        # a paused run stops after its round: its devices free up for the hours it waits, not for this pass
        out.paused = decide_pauses(running, timing)
        timing.plan_jointly([(e, state.eligible(e)) for e in timed if not timing.infeasible(e)],
                            [(e, state.eligible(e)) for e in expected_work(recent, now)])
        due = sorted((e for e in entries if timing.is_due(e)), key=lambda e: (e.deadline, e.submitted_at))
    for entry in due:  # a run whose deadline is due goes first: waiting longer would lose it
        _consider(entry, state, order, out, previous.get(entry.key), timed=True)
    seen, scanned = {e.key for e in due}, 0
    for entry in order:
        if entry.key in seen:
            continue
        if scanned >= max_scan:  # the rest are not looked at: they keep what they had
            out.unseen = [entry] + [e for e in order.rest() if e.key not in seen]
            break
        prev = previous.get(entry.key)
        timed = timing is not None and entry.deferrable and entry.deadline is not None
        if not timed and prev is not None and prev.kind in ("reserve", "wait") and not (
                world.any_free() and state.could_start(entry)):
            out.decisions[entry.key] = decision = prev
            state.hold_back(decision)
        else:
            decision = _consider(entry, state, order, out, prev, timed)
        if decision.kind in ("reserve", "wait", "plan"):
            scanned += 1
    if make_room_for_due and timing is not None and running:  # pause running deferrable work for what must start now
        short = sorted((e for e in entries if e.deferrable and e.deadline is not None and e.key in out.decisions
                        and out.decisions[e.key].kind != "start" and not timing.hopeless(e)
                        and e.deadline - e.runtime_s < (timing.h0 + 1) * 3600), key=lambda e: e.deadline)
        out.paused += make_room(short, running, timing, state.eligible, world.room, {e.key for e, _ in out.paused})
    return out


def _timing(entries: list[Entry], running: list[Running], world: World, now: float, rates: Rates | None) -> Timing | None:
    """The pass's plan of deferrable work, when there is any and prices to plan it by."""
    if rates is None or not (running or any(e.deferrable and e.deadline is not None for e in entries)):
        return None
    totals = {(s.cloud, s.accelerator): s.total for sites in world.sites.values() for s in sites}
    return Timing(rates, totals, world.releases, now)


def _consider(entry: Entry, state: _Pass, order: FairOrder, out: PassResult, prev: Decision | None,
              timed: bool) -> Decision:
    """Decide ``entry`` afresh: start it (its devices taken) or hold back what it waits for."""
    decision = state.timed(entry, prev) if timed else decide(entry, state.sites(entry), state.network, state.weights)
    out.decided += 1
    if decision.kind == "start":
        state.start(entry, decision)
        order.started(entry.tenant, sum(n for _, _, n in decision.parts))
        out.started.append((entry, decision))
    elif decision.kind in ("reserve", "wait", "plan"):
        state.hold_back(decision)
    out.decisions[entry.key] = decision
    return decision


UNSEEN = Decision("wait", "queued: not decided yet (the entries ahead of it take every free device)")
