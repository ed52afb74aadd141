"""The reservation ledger on SQLite and PostgreSQL: capacity and quota, leases, events, migrations, which database.

Behaviour tests take ``any_ledger`` and run on both backends (PostgreSQL's
runs are marked ``multihost``); choosing the database and the SQLite-only
ledger's upgrade are checked without a server.
"""

from __future__ import annotations

import sqlite3
import time
import types

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from crosscloud.core import deployment
from crosscloud.core.deployment import SingleHostOnly
from crosscloud.ledger import Ledger, LedgerNotConfigured, ReservationError, lease_seconds, ledger_url, set_url_provider
from crosscloud.ledger import ledger as ledger_module
from crosscloud.ledger import migrate, url
from crosscloud.ledger.schema import VERSION_TABLE, metadata

CAPACITY = {("beijing", "cpu"): 4}
QUOTA = {"beijing": 3}


def _take(ledger, run_id, devices, tenant="team-a", **lease):
    return ledger.admit(tenant, run_id, lambda usage: [("beijing", "cpu", devices)], CAPACITY, QUOTA, **lease)


def test_admissions_count_and_a_release_gives_back(any_ledger):
    _take(any_ledger, "a", 2)
    _take(any_ledger, "b", 1, tenant="team-b")
    assert any_ledger.usage().pools == {("beijing", "cpu"): 3}
    assert any_ledger.usage().tenant("team-b", "beijing") == 1
    assert [r.run_id for r in any_ledger.active("team-a")] == ["a"]
    assert any_ledger.release("team-a", "a") == 2
    assert any_ledger.release("team-a", "a") == 0
    assert any_ledger.usage().pools == {("beijing", "cpu"): 1}


def test_the_ledger_refuses_a_decision_beyond_capacity_or_quota(any_ledger):
    with pytest.raises(ReservationError, match="beijing/cpu: 5 device"):
        any_ledger.admit("team-a", "x", lambda usage: [("beijing", "cpu", 5)], CAPACITY, {"beijing": 8})
    with pytest.raises(ReservationError, match="quota 3"):
        _take(any_ledger, "x", 4)
    assert any_ledger.active() == []  # nothing half-reserved


def test_a_retried_admission_gets_its_own_back_renewed_without_deciding_again(any_ledger):
    first = _take(any_ledger, "r", 2, lease_s=30, holder="scheduler-1:42")

    def must_not_decide(usage):
        raise AssertionError("a retried admission decided again")

    again = any_ledger.admit("team-a", "r", must_not_decide, CAPACITY, QUOTA, lease_s=300)
    assert [(r.cloud, r.devices, r.holder) for r in again] == [("beijing", 2, "scheduler-1:42")]
    assert again[0].lease_expires_at > first[0].lease_expires_at + 200
    assert any_ledger.usage().pools == {("beijing", "cpu"): 2}


def test_a_lapsed_lease_holds_nothing_and_the_next_admission_releases_it(any_ledger):
    _take(any_ledger, "dead", 3, lease_s=0.2, holder="worker-7:123")
    assert any_ledger.usage().pools == {("beijing", "cpu"): 3}
    time.sleep(0.3)
    assert any_ledger.usage().pools == {} and any_ledger.active() == []  # not counted, though not yet reaped
    _take(any_ledger, "next", 3)  # 3 + 3 would exceed the pool and the quota, had the lapsed one counted
    [event] = any_ledger.events(run_id="dead")
    assert (event.kind, event.tenant, event.cloud, event.devices) == ("lapsed", "team-a", "beijing", 3)
    assert event.detail.startswith("lease lapsed (holder worker-7:123 stopped renewing at ")
    assert any_ledger.renew("team-a", "dead") == 0  # too late
    assert any_ledger.reap() == []


def test_renewing_keeps_a_reservation_past_its_first_lease(any_ledger, monkeypatch):
    # the ledger's clock is the test's: a loaded machine must not let a 0.4 s lease lapse between two renewals
    now = [time.time()]
    monkeypatch.setattr(ledger_module, "time", types.SimpleNamespace(time=lambda: now[0]))
    _take(any_ledger, "alive", 2, lease_s=0.4)
    for _ in range(3):
        now[0] += 0.2
        assert any_ledger.renew("team-a", "alive", lease_s=0.4) == 2
    assert [r.devices for r in any_ledger.active(run_id="alive")] == [2]  # 0.6 s on, past the first 0.4 s lease
    assert any_ledger.reap() == [] and any_ledger.events() == []
    now[0] += 0.5  # one more step without renewal, and it lapses
    assert any_ledger.active(run_id="alive") == [] and any_ledger.renew("team-a", "alive") == 0
    assert any_ledger.renew("team-a", "never-admitted") == 0


def test_reap_releases_only_what_lapsed_and_returns_it(any_ledger):
    _take(any_ledger, "short", 1, lease_s=10)
    _take(any_ledger, "long", 1, lease_s=1000)
    lapsed = any_ledger.reap(now=time.time() + 100)
    assert [r.run_id for r in lapsed] == ["short"]
    assert [r.run_id for r in any_ledger.active()] == ["long"]


def test_every_release_is_an_event_with_its_reason_newest_first(any_ledger):
    for run in ("a", "b", "c"):
        _take(any_ledger, run, 1)
        any_ledger.release("team-a", run, reason=f"run {run} ended")
    assert [(e.kind, e.run_id, e.detail) for e in any_ledger.events(tenant="team-a", limit=2)] == [
        ("released", "c", "run c ended"), ("released", "b", "run b ended")]
    assert any_ledger.events(tenant="team-b") == []
    assert [e.run_id for e in any_ledger.events(run_id="a")] == ["a"]


def test_pins_and_cloud_membership_are_upserts(any_ledger):
    any_ledger.pin("team-a", "sha", "beijing", 5.0)
    any_ledger.pin("team-a", "sha", "beijing", 6.0)
    assert any_ledger.pins("team-a") == [("sha", "beijing", 6.0)] and any_ledger.pins("team-b") == []
    any_ledger.set_state("shanghai", "draining")
    any_ledger.record_check("shanghai", False, "store: access denied")
    member = any_ledger.memberships()["shanghai"]
    assert (member.state, member.check_ok, member.detail) == ("draining", False, "store: access denied")
    with pytest.raises(ValueError, match="unknown"):
        any_ledger.set_state("shanghai", "gone")


def test_a_new_database_is_brought_to_the_newest_schema(any_ledger):
    with any_ledger.engine.connect() as conn:
        assert migrate.current(conn) == migrate.head() == "0007"
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        assert compare_metadata(context, metadata) == []  # the migrations build what the queries use


# The SQLite-only ledger's schema, verbatim from include/crosscloud/pool/ledger.py at commit 374627b.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    cloud TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    devices INTEGER NOT NULL CHECK (devices > 0),
    created_at REAL NOT NULL,
    released_at REAL
);
CREATE INDEX IF NOT EXISTS reservations_active ON reservations (released_at, tenant, run_id);
CREATE TABLE IF NOT EXISTS pins (
    tenant TEXT NOT NULL,
    artifact TEXT NOT NULL,
    cloud TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (tenant, artifact, cloud)
);
CREATE TABLE IF NOT EXISTS clouds (
    cloud TEXT PRIMARY KEY,
    state TEXT,
    check_ok INTEGER,
    checked_at REAL,
    detail TEXT NOT NULL DEFAULT ''
);
"""


def test_a_ledger_of_the_sqlite_only_code_is_upgraded_with_its_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSCLOUD_LEASE_S", "100")
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
        db.executemany("INSERT INTO reservations (tenant, run_id, cloud, accelerator, devices, created_at, released_at) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       [("team-a", "old", "beijing", "cpu", 2, 1.0, None), ("team-a", "done", "beijing", "cpu", 1, 1.0, 2.0)])
        db.execute("INSERT INTO pins VALUES ('team-a', 'sha', 'beijing', 9.0)")
        db.execute("INSERT INTO clouds (cloud, state) VALUES ('shanghai', 'draining')")
    db.close()
    upgraded_at = time.time()
    ledger = Ledger(path)
    [held] = ledger.active()
    # a reservation made before leases gets one from the upgrade on: a run still alive renews it, a dead one's
    # devices come back once it lapses
    assert (held.run_id, held.devices, held.holder) == ("old", 2, "before leases")
    assert upgraded_at + 100 <= held.lease_expires_at <= time.time() + 100
    assert ledger.renew("team-a", "old") == 2
    assert ledger.pins("team-a") == [("sha", "beijing", 9.0)] and ledger.memberships()["shanghai"].state == "draining"
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(reservations)")}
        assert {"holder", "lease_expires_at", "release_reason"} <= columns
        assert db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [("0007",)]
    db.close()
    assert ledger.reap(now=time.time() + 1000) and ledger.active() == []
    assert [e.detail.split(" (")[0] for e in ledger.events()] == ["lease lapsed"]


@pytest.fixture()
def choosing(monkeypatch):
    """No URL from the environment, the plugin or the executor: each test sets what it checks."""
    for name in ("CROSSCLOUD_LEDGER_URL", "CROSSCLOUD_EXECUTOR", "AIRFLOW__CORE__EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(url, "_provider", None)
    monkeypatch.setattr(deployment, "_executor", None)
    return monkeypatch


def test_several_hosts_refuse_a_ledger_in_a_file(choosing, tmp_path):
    choosing.setenv("CROSSCLOUD_EXECUTOR", "CeleryExecutor")
    message = ("several hosts would each get their own empty ledger; set CROSSCLOUD_LEDGER_URL or the Airflow "
               "Connection crosscloud_ledger to a PostgreSQL database")
    with pytest.raises(LedgerNotConfigured, match=message):
        Ledger()
    for sqlite_given in (f"sqlite:///{tmp_path / 'l.sqlite'}", tmp_path / "l.sqlite"):
        with pytest.raises(SingleHostOnly, match="CeleryExecutor"):
            Ledger(sqlite_given)
    choosing.setenv("CROSSCLOUD_LEDGER_URL", f"sqlite:///{tmp_path / 'l.sqlite'}")
    with pytest.raises(LedgerNotConfigured):
        Ledger()


def test_which_database_one_url_says(choosing, tmp_path):
    choosing.setenv("CROSSCLOUD_LEDGER", str(tmp_path / "embedded.sqlite"))
    assert ledger_url().database == str(tmp_path / "embedded.sqlite")
    set_url_provider(lambda: "postgres://cc:secret@db.example:5432/ledger?__extra__=%7B%7D&sslmode=require")
    from_airflow = ledger_url()
    assert from_airflow.drivername == "postgresql+psycopg2" and from_airflow.database == "ledger"
    assert dict(from_airflow.query) == {"sslmode": "require"}
    choosing.setenv("CROSSCLOUD_LEDGER_URL", "postgresql://cc@elsewhere/ledger")
    assert ledger_url().host == "elsewhere"  # the environment wins over the Connection
    assert ledger_url(tmp_path / "given.sqlite").database == str(tmp_path / "given.sqlite")  # a path: SQLite there
    assert ledger_url(ledger_url()) == ledger_url()  # a URL object as it is
    set_url_provider(lambda: None)
    choosing.delenv("CROSSCLOUD_LEDGER_URL")
    assert ledger_url().get_backend_name() == "sqlite"


def test_lease_seconds_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("CROSSCLOUD_LEASE_S", raising=False)
    assert lease_seconds() == 600
    monkeypatch.setenv("CROSSCLOUD_LEASE_S", "90")
    assert lease_seconds() == 90
    monkeypatch.setenv("CROSSCLOUD_LEASE_S", "soon")
    with pytest.raises(ValueError, match="CROSSCLOUD_LEASE_S='soon' is not a number"):
        lease_seconds()


def test_a_run_that_gave_its_devices_back_renews_nothing_and_warns_of_no_lapse(any_ledger, monkeypatch):
    from crosscloud.run import lease

    monkeypatch.setenv("CROSSCLOUD_LEASE_S", "2")  # the lease thread renews every 0.5 s
    _take(any_ledger, "done", 2)
    said = []
    with lease.held("team-a", "done", said.append, any_ledger) as hold:
        assert hold.release() == 2  # training over: the devices go back before the baseline calibration
        time.sleep(1.2)  # the calibration runs; the thread's renewals find nothing and must not call it a lapse
    assert said == [] and any_ledger.active(run_id="done") == []
    # a lease that lapsed, which nobody gave back, is still reported
    _take(any_ledger, "dead", 1, lease_s=0.1)
    time.sleep(0.2)
    _take(any_ledger, "next", 1)  # the next admission releases the lapsed one
    late = lease.Lease("team-a", "dead", any_ledger, log=said.append)
    late.renew(force=True)
    assert late.lapsed and "holds no reservation any more" in said[0]


@pytest.mark.multihost
@pytest.mark.soak  # durable before they return
def test_releases_and_renewals_survive_a_server_crash_the_moment_they_return():
    from pgserver import PostgresServer

    # the WAL writer waits 10 s: only a commit that flushed itself survives a crash within that
    with PostgresServer({"fsync": "off", "wal_writer_delay": "10000ms"}) as server:
        url_ = server.create_database("crash")
        ledger = Ledger(url_)
        for i in range(3):
            _take(ledger, f"r{i}", 1, lease_s=60)
        renewed_at = time.time()
        ledger.renew("team-a", "r0", lease_s=3600)
        assert ledger.release("team-a", "r1") == 1
        ledger.renew("team-a", "r2", lease_s=3600)
        server.crash()
        after = Ledger(url_ + "?application_name=after-crash")  # a new engine: the old one's connections died
        active = {r.run_id: r for r in after.active()}
        assert sorted(active) == ["r0", "r2"]  # the release held
        assert all(r.lease_expires_at >= renewed_at + 3000 for r in active.values())  # and the renewals


@pytest.mark.multihost
@pytest.mark.soak
def test_a_ledger_call_during_a_server_restart_waits_for_the_server_instead_of_failing():
    import threading

    from pgserver import PostgresServer

    with PostgresServer() as server:
        url_ = server.create_database("restart")
        _take(Ledger(url_), "before", 1, lease_s=60)
        restart = threading.Thread(target=server.crash, kwargs={"down_s": 3.0})
        restart.start()
        time.sleep(1.0)  # down: connections refused, then "the database system is starting up"
        asked = time.monotonic()
        active = Ledger(url_ + "?application_name=during-restart").active()  # a new engine, a new connection
        waited = time.monotonic() - asked
        restart.join()
        assert [r.run_id for r in active] == ["before"]
        assert waited > 0.5  # it did wait for the server, and then answered


def test_a_fleet_record_changes_by_parts_and_one_change_at_a_time(any_ledger):
    import threading

    from crosscloud.ledger.fleets import FleetBusy

    fleets = any_ledger.fleets
    assert fleets.get("team-a", "lm") == {} and fleets.names() == []
    fleets.update("team-a", "lm", replicas=[["beijing", 0]], decision={"shares": {"beijing": 1}})
    fleets.update("team-a", "lm", cuts={"beijing": {"reduce_pct": 10}})  # another part: the others are kept
    fleets.update("team-b", "lm", decision=None)
    assert fleets.get("team-a", "lm") == {"replicas": [["beijing", 0]], "decision": {"shares": {"beijing": 1}},
                                          "cuts": {"beijing": {"reduce_pct": 10}}}
    assert fleets.update("team-a", "lm", cuts=None) == {"replicas": [["beijing", 0]], "decision": {"shares": {"beijing": 1}}}
    assert fleets.names() == [("team-a", "lm"), ("team-b", "lm")] and fleets.names(["team-b"]) == [("team-b", "lm")]
    held, release = threading.Event(), threading.Event()

    def change():
        with fleets.changing("team-a", "lm"):
            held.set()
            release.wait(10)

    other = threading.Thread(target=change)
    other.start()
    assert held.wait(10)
    with pytest.raises(FleetBusy, match="another task"):
        with fleets.changing("team-a", "lm", wait_s=0.3):
            pass
    with fleets.changing("team-b", "lm", wait_s=0.3):  # another fleet is not held up
        pass
    release.set()
    other.join()
    with fleets.changing("team-a", "lm", wait_s=5):
        fleets.delete("team-a", "lm")
    assert fleets.names() == [("team-b", "lm")]


def test_grid_cuts_set_at_once_from_two_hosts_both_survive(any_ledger, tmp_path, monkeypatch):
    import threading

    from crosscloud.serving import fleet as fleet_module

    fleets, now = any_ledger.fleets, time.time()
    fleets.update("team-a", "lm", decision={"shares": {"beijing": 1}}, cuts={"ended": {"until": now - 1}})
    started, in_force = threading.Barrier(2), fleet_module._in_force

    def slow(cuts, at):  # each change dwells between its read and its write: the other must wait, not read past it
        time.sleep(0.3)
        return in_force(cuts, at)

    monkeypatch.setattr(fleet_module, "_in_force", slow)

    def cut(cloud):
        started.wait(10)
        fleet_module.Fleet("team-a", "lm", tmp_path, any_ledger).set_cut(cloud, {"reduce_pct": 10, "until": now + 600})

    threads = [threading.Thread(target=cut, args=(c,)) for c in ("beijing", "shanghai")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    record = fleets.get("team-a", "lm")
    assert sorted(record["cuts"]) == ["beijing", "shanghai"] and record["decision"] == {"shares": {"beijing": 1}}
    fleet_module.Fleet("team-a", "lm", tmp_path, any_ledger).set_cut("beijing", None)
    assert list(fleets.get("team-a", "lm")["cuts"]) == ["shanghai"]


def test_a_session_lock_is_held_by_one_and_a_blocking_taker_waits_for_it(any_ledger):
    import threading

    from crosscloud.ledger import engine as backend

    engine, key, got = any_ledger.engine, backend.lock_key("test:held"), []

    def take(wait_s):
        with backend.session_lock(engine, "test-held", key, wait_s) as taken:
            got.append(taken)

    with backend.session_lock(engine, "test-held", key) as taken:  # blocking: taken once it returns
        assert taken is True
        other = threading.Thread(target=take, args=(0,))  # one try while held: not taken
        other.start()
        other.join(10)
        assert got == [False]
        waiter = threading.Thread(target=take, args=(None,))
        waiter.start()
        time.sleep(0.5)
        assert got == [False] and waiter.is_alive()  # it waits for the holder
    waiter.join(10)
    assert got == [False, True]
    take(0)
    assert got == [False, True, True]
