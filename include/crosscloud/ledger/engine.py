"""One SQLAlchemy Engine per ledger URL per process, and the ledger's write transaction on each backend.

SQLite: pysqlite's own transaction handling is switched off and the engine
issues ``BEGIN`` itself (SQLAlchemy's documented recipe), so a write
transaction can be ``BEGIN IMMEDIATE``: it takes the file's write lock before
it reads, and a second admission waits (up to ``timeout`` 60 s) instead of
deciding on the same usage. The file is in WAL mode, so reads (the
inventory, the UI) neither wait for the writer nor hold up its commit. PostgreSQL: each write transaction that decides
on usage first takes one transaction-scoped advisory lock for the whole
ledger (``pg_advisory_xact_lock``), so admissions, releases, renewals and the
reaper run one at a time while reads go on; advisory locks are per database,
so two ledgers in two databases do not wait for each other.

Airflow's LocalExecutor and Celery fork workers: a child must never use the
parent's pooled connections (both would talk over one socket), so after a
fork every cached engine gets a fresh pool without closing the parent's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

# one key for the whole ledger's write lock, another for migrations ("crosscloud" ledger, in ASCII)
LEDGER_LOCK = 0x63636C6564676572
MIGRATE_LOCK = LEDGER_LOCK + 1
SQLITE_TIMEOUT_S = 60
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


def engine_for(url: URL) -> Engine:
    """The process's engine for ``url``, made on first use."""
    key = url.render_as_string(hide_password=False)
    with _guard:
        if key not in _engines:
            if url.get_backend_name() == "sqlite":
                _engines[key] = _sqlite_engine(url)
            else:
                _engines[key] = sa.create_engine(url, pool_pre_ping=True)
        return _engines[key]


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


@contextmanager
def write(engine: Engine, lock: bool = True, durable: bool = True) -> Iterator[Connection]:
    """A write transaction; with ``lock``, one at a time for the whole ledger (see the module docstring).

    ``durable=False`` (PostgreSQL): the commit returns before its WAL reaches
    the disk, so the lock is not held through the flush. Only for what the
    leases repair if a server crash loses it: a release or a renewal.
    """
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            if is_postgres(engine) and (lock or not durable):
                sync = "" if durable else "set_config('synchronous_commit', 'off', true), "
                conn.exec_driver_sql(f"SELECT {sync}{f'pg_advisory_xact_lock({LEDGER_LOCK})' if lock else 1}")
            yield conn


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    """A connection for one read, no lock taken; PostgreSQL's autocommits (a statement is its own snapshot),
    which spares the BEGIN and COMMIT round trips every admission would otherwise pay for its reads."""
    with engine.connect() as conn:
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


def _after_fork_in_child() -> None:
    """The child's engines start with empty pools; the parent's connections are left to the parent."""
    global _guard
    _guard = threading.Lock()  # a thread of the parent may have held it at the fork
    for engine in _engines.values():
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork_in_child)
