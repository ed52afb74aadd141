"""The federation's queue: order, reservations and backfill, fair share, the ledger's rows, waiting and cancelling."""

from __future__ import annotations

import pytest
from federations import embedded

from crosscloud.core.job import JobSpec, JobSpecError, carbon_weight, deadline_at
from crosscloud.pool.placement import JobRequest, PlacementError, Site, Weights
from crosscloud.scheduler.admission import NotAdmitted, admit, entry_for
from crosscloud.scheduler.entry import Entry, decision_from_json, decision_json, entry_from_row, request_json
from crosscloud.scheduler.order import FairOrder, ordered
from crosscloud.scheduler.passes import World, run_pass
from crosscloud.scheduler.service import Queue

pytestmark = pytest.mark.queue


def _entry(run_id, devices, runtime_s=100.0, tenant="t", at=0.0, priority=0, clouds=None):
    req = JobRequest(name=run_id, tenant=tenant, family="f", devices=devices, runtime_s={"*": runtime_s},
                     clouds=frozenset(clouds) if clouds else None, splittable=False)
    return Entry(tenant, run_id, req, at, priority=priority, runtime_s=runtime_s)


def _world(free=4, total=4, releases=()):
    site = Site("A", "gpu", "X", total, free, families=frozenset({"f"}))
    return World({"f": [site]}, {("A", "gpu"): free}, {("A", "gpu"): list(releases)})


def test_order_is_priority_then_fair_share_then_age():
    entries = [_entry("old", 1, tenant="busy", at=0), _entry("new", 1, tenant="idle", at=5),
               _entry("urgent", 1, tenant="busy", at=9, priority=1)]
    keys = [e.run_id for e in ordered(entries, held={"busy": 4}, weights={})]
    assert keys == ["urgent", "new", "old"]  # the idle tenant's newer run goes before the busy one's older
    # a weight makes a tenant's use count for less: busy with weight 8 holds 4/8, idle 1/1
    assert [e.run_id for e in ordered(entries, held={"busy": 4, "idle": 1}, weights={"busy": 8})] == ["urgent", "old", "new"]


def test_fair_order_updates_a_tenant_share_as_its_entries_start():
    entries = [_entry(f"a{i}", 1, tenant="a", at=i) for i in range(3)] + [_entry(f"b{i}", 1, tenant="b", at=10 + i)
                                                                         for i in range(3)]
    order, got = FairOrder(entries, {}, {}), []
    for e in order:
        got.append(e.run_id)
        order.started(e.tenant, 1)
    assert got == ["a0", "b0", "a1", "b1", "a2", "b2"]  # alternating: each start raises that tenant's share


def test_a_waiting_large_entry_reserves_and_only_what_ends_before_it_backfills():
    world = _world(free=2, releases=[(100.0, 2)])  # 2 free now, 2 more at t=100
    big, short, long_ = _entry("big", 4, 50, at=0), _entry("short", 2, 60, at=1), _entry("long", 2, 500, at=2)
    result = run_pass([big, short, long_], world, 0.0, lambda *a: 0.0)
    kinds = {k[1]: d.kind for k, d in result.decisions.items()}
    assert kinds == {"big": "reserve", "short": "start", "long": "reserve"}
    assert result.decisions[("t", "big")].expected_start_s == 100.0
    assert world.free[("A", "gpu")] == 0 and [e.run_id for e, _ in result.started] == ["short"]


def test_a_run_that_can_start_now_starts_unless_the_federation_lets_it_wait_for_a_faster_pool():
    fast = Site("F", "fast", "X", 4, 0, families=frozenset({"f"}))
    slow = Site("S", "slow", "X", 4, 4, families=frozenset({"f"}))
    req = JobRequest(name="r", tenant="t", family="f", devices=4, runtime_s={"fast": 100.0, "slow": 400.0},
                     splittable=False)

    def decision(weights):
        world = World({"f": [fast, slow]}, {("F", "fast"): 0, ("S", "slow"): 4}, {("F", "fast"): [(60.0, 4)]})
        return run_pass([Entry("t", "r", req, 0.0, runtime_s=100.0)], world, 0.0, lambda *a: 0.0,
                        weights=weights).decisions[("t", "r")]

    # the fast pool frees in 60 s and would finish the run at 160 s, the slow one at 400 s; by default the run
    # does not wait while devices it fits are idle
    now = decision(Weights())
    assert now.kind == "start" and now.parts == (("S", "slow", 4),)
    later = decision(Weights(wait_for_faster=True))
    assert later.kind == "reserve" and later.parts == (("F", "fast", 4),) and later.expected_start_s == 60.0


def test_the_federation_file_says_whether_runs_wait_for_faster_pools(ledger):
    fed = embedded()
    assert not Queue(fed, ledger).weights.wait_for_faster
    assert Queue(fed.model_copy(update={"wait_for_faster_pools": True}), ledger).weights.wait_for_faster


def test_a_pass_never_takes_more_than_a_pool_or_a_quota_has():
    world = _world(free=4)
    world.quota_left = {"t": {"A": 3}}
    result = run_pass([_entry(f"r{i}", 1, at=i) for i in range(6)], world, 0.0, lambda *a: 0.0)
    assert len(result.started) == 3 and world.free[("A", "gpu")] == 1
    assert result.positions() == {("t", "r3"): 1, ("t", "r4"): 2, ("t", "r5"): 3}


def test_the_pass_cost_is_bounded_and_the_rest_keep_their_place():
    result = run_pass([_entry(f"r{i}", 3, at=i) for i in range(50)], _world(free=2, releases=[(10.0, 2)]), 0.0,
                      lambda *a: 0.0, max_scan=5)
    assert result.decided == 5 and len(result.unseen) == 45
    assert list(result.positions().values()) == list(range(1, 51))


def test_entry_and_decision_round_trip_through_the_ledger_rows(ledger):
    fed = embedded()
    e = entry_for(fed, JobSpec(placement="auto", devices=2, priority=3, deadline="6", deferrable=True,
                               objective="carbon"), "r1", "byte-lm", 10, {"beijing"}, 1000.0)
    assert (e.priority, e.deadline, e.deferrable, e.objective) == (3, 1000.0 + 6 * 3600, True, "carbon")
    queue = Queue(fed, ledger, clock=lambda: 1000.0)
    row = queue.submit(e)
    assert entry_from_row(row, e.request.quota) == e and request_json(e) == row.request
    d = run_pass([e], queue.world([e], 1000.0), 1000.0, queue.network).decisions[e.key]
    assert decision_from_json(decision_json(d)) == d


def _run(fed, ledger, run_id, **job):
    return admit(fed, JobSpec(**job), run_id, "byte-lm", 0, {"beijing"}, ledger)


def test_runs_beyond_capacity_start_in_queue_order_as_devices_come_back(ledger):
    fed = embedded()
    _run(fed, ledger, "first", clouds=["beijing"], devices_per_cloud=4)
    waiting = ["w1", "w2", "w3"]
    for run_id in waiting:  # placement auto: exactly 3 devices (spread would start on what is free)
        with pytest.raises(NotAdmitted, match="queued at position"):
            _run(fed, ledger, run_id, clouds=["beijing"], placement="auto", devices=3)
    assert [s.row.run_id for s in Queue(fed, ledger).listing() if s.position] == waiting
    started = []
    for expected in waiting:
        ledger.release("team-a", started[-1] if started else "first")
        for run_id in [w for w in waiting if w not in started]:  # each waiter looks; only the head of the line starts
            try:
                _run(fed, ledger, run_id, clouds=["beijing"], placement="auto", devices=3)
                started.append(run_id)
            except NotAdmitted:
                pass
        assert started[-1] == expected and sum(r.devices for r in ledger.active()) == 3
    assert [s.row.state for s in Queue(fed, ledger).listing()] == ["running"]


def test_a_cancelled_entry_leaves_the_queue_and_holds_nothing(ledger):
    fed = embedded()
    _run(fed, ledger, "holder", clouds=["beijing"], devices_per_cloud=4)
    with pytest.raises(NotAdmitted):
        _run(fed, ledger, "later", clouds=["beijing"], devices_per_cloud=2)
    queue = Queue(fed, ledger)
    assert "cancelled while waiting" in queue.cancel("team-a", "later")
    ledger.release("team-a", "holder")
    queue.run_pass(force=True)
    assert queue.status("team-a", "later").state == "cancelled" and ledger.active() == []
    assert "running" in queue.cancel("team-a", "holder") or "nothing to cancel" in queue.cancel("team-a", "holder")


def test_an_entry_nobody_looks_at_expires_on_the_injected_clock(ledger, monkeypatch):
    monkeypatch.setenv("CROSSCLOUD_LEASE_S", "60")
    fed, now = embedded(), [1000.0]
    queue = Queue(fed, ledger, clock=lambda: now[0])
    _run(fed, ledger, "holder", clouds=["beijing"], devices_per_cloud=4)
    queue.submit(entry_for(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "gone", "byte-lm", 0, set(), now[0]))
    now[0] += 30
    queue.run_pass(force=True)
    assert queue.status("team-a", "gone").state == "queued"
    now[0] += 61
    queue.run_pass(force=True)
    assert queue.status("team-a", "gone").state == "expired"


def test_a_pass_runs_when_the_queue_changed_or_is_old(ledger):
    fed, now = embedded(), [1000.0]
    queue = Queue(fed, ledger, clock=lambda: now[0], refresh_s=30)
    queue.submit(entry_for(fed, JobSpec(), "r", "byte-lm", 0, set(), now[0]))
    assert queue.run_pass() is not None  # a submission changed the queue
    now[0] += 5
    assert queue.run_pass() is None  # nothing changed since (its start bumped the version once: one more pass)
    now[0] += 31
    assert queue.run_pass() is not None


def test_a_run_no_cloud_can_ever_take_is_refused_at_once(ledger):
    with pytest.raises(PlacementError, match="no cloud can ever run this job"):
        _run(embedded(), ledger, "huge", placement="auto", devices=64)
    assert Queue(embedded(), ledger).status("team-a", "huge").state == "refused"


def test_queue_terms_are_checked_with_the_field_named():
    assert (carbon_weight("cost"), carbon_weight("carbon"), carbon_weight("0.25")) == (0.0, 1.0, 0.25)
    assert deadline_at("2", 100.0) == 100.0 + 7200 and deadline_at("1970-01-01T01:00Z", 0.0) == 3600.0
    for bad, field in [({"objective": "cheap"}, "objective"), ({"deadline": "soon"}, "deadline"),
                       ({"deadline": "-1"}, "deadline"), ({"deferrable": True}, "deferrable")]:
        with pytest.raises(JobSpecError, match=f"job parameter {field}"):
            JobSpec(**bad)


def test_the_ledger_never_starts_a_run_twice_nor_a_cancelled_one(ledger):
    fed = embedded()
    queue = Queue(fed, ledger)
    row = queue.submit(entry_for(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "once", "byte-lm", 0, set(), 0.0))
    start = (row.id, "team-a", "once", [("beijing", "cpu", 1)], "{}", "test")
    capacity, quotas = {("beijing", "cpu"): 4}, {"team-a": {"beijing": 4}}
    assert ledger.start([start, start], capacity, quotas) == [row.id]  # two passes deciding the same start
    assert sum(r.devices for r in ledger.active()) == 1
    other = queue.submit(entry_for(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "gone", "byte-lm", 0, set(), 0.0))
    queue.cancel("team-a", "gone")
    assert ledger.start([(other.id, "team-a", "gone", [("beijing", "cpu", 1)], "{}", "test")], capacity, quotas) == []


def test_the_queue_command_lists_explains_and_cancels_a_tenant_s_runs(tmp_path, monkeypatch, capsys):
    import json

    from crosscloud import cli
    from crosscloud.ledger import Ledger

    monkeypatch.setenv("CROSSCLOUD_LEDGER_URL", f"sqlite:///{tmp_path / 'cli-ledger.sqlite'}")
    fed, ledger = embedded(), Ledger()
    _run(fed, ledger, "holder", clouds=["beijing"], devices_per_cloud=4)
    for tenant, run_id in (("team-a", "a-waits"), ("team-b", "b-waits")):
        with pytest.raises(NotAdmitted):
            _run(fed, ledger, run_id, tenant=tenant, clouds=["beijing"], placement="auto", devices=2)
    assert cli.main(["queue", "--tenant", "team-b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # team-b holds nothing and team-a holds beijing: by fair share, team-b's newer run goes first
    assert [(r["run_id"], r["state"], r["position"], r["decision"]) for r in rows] == [("b-waits", "queued", 1, "reserve")]
    assert cli.main(["queue", "explain", "--tenant", "team-a", "--run-id", "a-waits"]) == 0
    out = capsys.readouterr().out
    assert "run a-waits of team-a: queued, position 2" in out and "why: reserved 2 x cpu on beijing" in out
    assert cli.main(["queue", "cancel", "--tenant", "team-a", "--run-id", "a-waits"]) == 0
    assert "cancelled while waiting" in capsys.readouterr().out
    assert ledger.queue.get("team-a", "a-waits").state == "cancelled"
    with pytest.raises(SystemExit, match="name the run's tenant with one --tenant"):
        cli.main(["queue", "cancel", "--run-id", "a-waits"])


def test_a_paused_run_gives_its_devices_back_and_waits_for_exactly_them(ledger):
    fed, now = embedded(), [1000.0]
    queue = Queue(fed, ledger, clock=lambda: now[0])
    queue.submit(entry_for(fed, JobSpec(clouds=["beijing"], devices_per_cloud=2), "long", "byte-lm", 0, set(), now[0]))
    queue.run_pass(force=True)
    assert queue.status("team-a", "long").state == "running"
    now[0] += 60
    queue.progress("team-a", "long", 500.0)  # measured from its rounds: 500 s of work left
    assert ledger.queue.get("team-a", "long").runtime_s == pytest.approx(560.0)
    assert queue.pause("team-a", "long", 500.0) == 2  # its sub-tasks stopped after a round
    row = ledger.queue.get("team-a", "long")
    assert row.state == "paused" and ledger.active() == [] and row.started_at is None
    assert row.runtime_s > 500.0  # its work left and what a pause costs
    entry = entry_from_row(row, None)
    assert entry.parts == (("beijing", "cpu", 2),) and entry.devices == 2
    assert queue.pause("team-a", "long", 500.0) == 0  # paused already: nothing more to give back
    queue.run_pass(force=True)  # nothing else wants beijing: it resumes at once on the same devices
    assert queue.status("team-a", "long").state == "running"
    assert [(r.cloud, r.devices) for r in ledger.active("team-a", "long")] == [("beijing", 2)]
    assert "resumes now" in queue.status("team-a", "long").decision.reason


def test_a_pass_expects_again_the_runs_submitted_in_the_last_day(ledger, monkeypatch):
    """The ledger keeps what was submitted; each pass hands the last day of it to the plan (``expected``)."""
    from crosscloud.scheduler import service
    from crosscloud.scheduler.timing import Rates

    fed, now, seen = embedded(), [1000.0], []
    real = service.run_pass
    monkeypatch.setattr(service, "run_pass", lambda *a, **kw: seen.append(sorted(e.run_id for e in kw["recent"]))
                        or real(*a, **kw))
    queue = Queue(fed, ledger, clock=lambda: now[0], rates=lambda t: Rates(int(t // 3600), {}))

    def submit(run_id, **job):
        queue.submit(entry_for(fed, JobSpec(clouds=["beijing"], deferrable=True, deadline="30", **job), run_id,
                               "byte-lm", 0, set(), now[0]))

    submit("two-days-ago")
    now[0] += 25 * 3600
    submit("today")
    ledger.queue.end("team-a", "two-days-ago", "done", "finished", now[0])
    queue.run_pass(force=True)
    assert seen[-1] == ["today"]
    # the queue keeps parsed what its passes use, not every row it ever saw
    assert [e.run_id for e in queue._entries.values()] == ["today"]
    assert [r.run_id for r in ledger.queue.submitted_since(0.0)] == ["two-days-ago", "today"]
