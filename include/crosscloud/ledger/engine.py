"""One SQLAlchemy Engine per ledger URL per process, and the ledger's write transaction on each backend.

SQLite: pysqlite's own transaction handling is switched off and the engine
issues ``BEGIN`` itself (SQLAlchemy's documented recipe), so a write
transaction can be ``BEGIN IMMEDIATE``: it takes the file's write lock before
it reads, and a second admission waits (up to ``timeout`` 60 s) instead of
deciding on the same usage. The file is in WAL mode, so reads (the
inventory, the UI) neither wait for the writer nor hold up its commit.

PostgreSQL: each write transaction that decides on usage first takes one
transaction-scoped advisory lock for the whole ledger
(``pg_advisory_xact_lock``), so admissions, releases, renewals and the reaper
run one at a time while reads go on; advisory locks are per database, so two
ledgers in two databases do not wait for each other.

Airflow's LocalExecutor and Celery fork workers: a child must never use the
parent's pooled connections (both would talk over one socket), so after a
fork every cached engine gets a fresh pool without closing the parent's.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from crosscloud.core.interrupt import deferred

# one key for the whole ledger's write lock, another for migrations ("crosscloud" ledger, in ASCII)
LEDGER_LOCK = 0x63636C6564676572
MIGRATE_LOCK = LEDGER_LOCK + 1
PASS_LOCK = LEDGER_LOCK + 2  # one scheduling pass at a time (crosscloud.scheduler)
SQLITE_TIMEOUT_S = 60
PING_AFTER_IDLE_S = 10.0  # a pooled server connection idle this long is pinged before use
# a server restarting (a crash, a failover) refuses connections, then answers "starting up", for seconds: a new
# connection waits this long for it ($CROSSCLOUD_LEDGER_CONNECT_PATIENCE_S) before the error reaches the caller
CONNECT_PATIENCE_S = 20.0
_RESTARTING = ("starting up", "shutting down", "in recovery mode", "Connection refused", "server closed the connection")
_WRITE = "crosscloud_write"  # execution option: this transaction writes (SQLite: BEGIN IMMEDIATE)

_engines: dict[str, Engine] = {}
_guard = threading.Lock()


def _sqlite_engine(url: URL) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_TIMEOUT_S})

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # the engine says BEGIN, not pysqlite
        dbapi_connection.execute("PRAGMA journal_mode=WAL")  # readers never hold up the writer (kept in the file)

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")

    return engine


def _server_engine(url: URL) -> Engine:
    """A database server's engine. A pooled connection that sat idle is pinged before use (the server may have
    restarted meanwhile; a dead one is replaced); one given back a moment ago is not, which spares each
    admission a round trip per connection it takes (SQLAlchemy's ``pool_pre_ping`` pings every time)."""
    engine = sa.create_engine(url)

    @sa.event.listens_for(engine, "do_connect")
    def _connect_patiently(dialect, _record, cargs, cparams):
        return connect_patiently(lambda: dialect.dbapi.connect(*cargs, **cparams), dialect.dbapi.OperationalError)

    @sa.event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection, record) -> None:
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection, record, _proxy) -> None:
        if time.monotonic() - record.info.get("idle_since", time.monotonic()) < PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa.exc.DisconnectionError(f"the ledger's database did not answer a ping: {exc}") from exc

    return engine


def connect_patiently(connect, transient: type[Exception], patience_s: float | None = None):
    """``connect()``, again with backoff while the server is restarting (a transient error naming it), for up to
    ``patience_s``; any other error, or one past the patience, at once. The soak found tasks failing all their tries
    on "the database system is starting up" while the ledger's PostgreSQL restarted."""
    patience = float(os.environ.get("CROSSCLOUD_LEDGER_CONNECT_PATIENCE_S") or CONNECT_PATIENCE_S) \
        if patience_s is None else patience_s
    deadline, delay = time.monotonic() + patience, 0.2
    while True:
        try:
            return connect()
        except transient as exc:
            if not any(sign in str(exc) for sign in _RESTARTING) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 2.0)


def engine_for(url: URL) -> Engine:
    """The process's engine for ``url``, made on first use."""
    key = url.render_as_string(hide_password=False)
    with _guard:
        if key not in _engines:
            if url.get_backend_name() == "sqlite":
                _engines[key] = _sqlite_engine(url)
            else:
                _engines[key] = _server_engine(url)
        return _engines[key]


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


@contextmanager
def write(engine: Engine, lock: bool = True, durable: bool = True) -> Iterator[Connection]:
    """A write transaction; with ``lock``, one at a time for the whole ledger (see the module docstring).

    PostgreSQL: a locked transaction's commit does not wait for the disk, so
    the lock, which every other writer queues for, is not held through the
    flush; with ``durable`` a second transaction of its own then waits for the
    flush of the WAL up to its commit, and so past this one (concurrent
    writers share one flush). That transaction must write WAL, or its commit
    would not wait either: it emits an empty logical message (prefix
    ``crosscloud``, executable by any role, ignored by decoders that do not
    ask for it). What another admission decided on is never on disk later
    than its own decision. ``durable=False`` skips that wait: only for the
    queue's bookkeeping that the next pass or poll writes again (estimates,
    touches, decisions); admissions, releases and renewals are durable.
    """
    postgres = is_postgres(engine)
    with deferred(), engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            if postgres and (lock or not durable):
                exclusive = f", pg_advisory_xact_lock({LEDGER_LOCK})" if lock else ""
                conn.exec_driver_sql(f"SELECT set_config('synchronous_commit', 'off', true){exclusive}")
            yield conn
        if postgres and lock and durable:  # a transaction that writes WAL: its commit flushes, past this one's
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("SELECT pg_logical_emit_message(true, 'crosscloud', '')")


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    """A connection for one read, no lock taken; PostgreSQL's autocommits (a statement is its own snapshot),
    which spares the BEGIN and COMMIT round trips every admission would otherwise pay for its reads."""
    with deferred(), engine.connect() as conn:
        if is_postgres(engine):
            conn.execution_options(isolation_level="AUTOCOMMIT")
        with conn.begin():
            yield conn


@contextmanager
def migration_lock(engine: Engine) -> Iterator[Connection]:
    """A transaction that no other process's migration of the same database runs beside.

    PostgreSQL: a session advisory lock, held from before the revision is read
    until after the upgrade committed. SQLite: ``BEGIN IMMEDIATE`` does it.
    """
    if not is_postgres(engine):
        with write(engine, lock=False) as conn:
            yield conn
        return
    with engine.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATE_LOCK})")
        conn.commit()
        try:
            with conn.begin():
                yield conn
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATE_LOCK})")
            conn.commit()


_lock_threads: dict[tuple[str, str], threading.Lock] = {}


@contextmanager
def pass_lock(engine: Engine, blocking: bool = True) -> Iterator[bool]:
    """Held by one scheduling pass at a time across every host; yields whether it was taken (never False when
    ``blocking``). PostgreSQL's lock is apart from the ledger's write lock, so admissions go on during a pass."""
    with session_lock(engine, "pass", PASS_LOCK, None if blocking else 0) as taken:
        yield taken


def lock_key(name: str) -> int:
    """A PostgreSQL advisory lock key (signed 64 bits) for a named lock, apart from the ledger's fixed ones."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def session_lock(engine: Engine, name: str, key: int, wait_s: float | None = None) -> Iterator[bool]:
    """One holder at a time across every host for the lock ``name``; yields whether it was taken within ``wait_s``
    (None: wait as long as it takes; 0: one try). A holder that dies gives it back with its connection or process.

    PostgreSQL: a session advisory lock (``key``) on a connection of its own.
    SQLite (one host): an advisory lock on a file beside the ledger, and a
    thread lock within the process.
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    if is_postgres(engine):
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            if deadline is None:  # the server queues the waiter (no polling); it returns void once the lock is held
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({key})")
                taken = True
            else:
                taken = _poll(lambda: bool(conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({key})").scalar()), deadline)
            try:
                yield taken
            finally:
                if taken:
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")
        return
    db = engine.url.database or ":memory:"
    with _guard:
        lock = _lock_threads.setdefault((db, name), threading.Lock())
    if not _poll(lambda: lock.acquire(blocking=False), deadline):
        yield False
        return
    try:
        if db == ":memory:":
            yield True
            return
        with open(f"{db}.{name}-lock", "a") as f:
            if not _poll(lambda: _flock(f), deadline):
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        lock.release()


def _flock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _poll(take, deadline: float | None, every_s: float = 0.05) -> bool:
    """Try ``take`` until it succeeds or ``deadline`` (monotonic; None: never) passes; whether it was taken."""
    while not take():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def _after_fork_in_child() -> None:
    """The child's engines start with empty pools; the parent's connections are left to the parent."""
    global _guard
    _guard = threading.Lock()  # a thread of the parent may have held it at the fork
    _lock_threads.clear()  # the same: a lock of the parent's is not the child's
    for engine in _engines.values():
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork_in_child)
