"""Bringing a ledger's database to the newest schema, as ``airflow db migrate`` does for Airflow's.

Opening a Ledger runs it, once per process per URL; processes opening the
same database at once take turns (``engine.migration_lock``), and the check
and the upgrade are one transaction. A database the SQLite-only ledger made
(its tables, no version table) is stamped at the first revision, which is
that schema, and upgraded from there with its rows.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from crosscloud.ledger.engine import migration_lock
from crosscloud.ledger.schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
FIRST = "0001"  # the SQLite-only ledger's schema

_done: set[str] = set()
_guard = threading.Lock()


def config(connection: Connection | None = None) -> Config:
    """Alembic's configuration of the ledger's migrations, on ``connection`` when given.

    Alembic is imported here, not with the module: every process that imports
    the ledger (sub-tasks too) would pay for it, and only a migration needs it.
    """
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(config()).get_current_head()


def current(conn: Connection) -> str | None:
    """The revision ``conn``'s database is at; None when it has no version table."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade(engine: Engine) -> None:
    """Bring ``engine``'s database to the newest revision (see the module docstring)."""
    key = engine.url.render_as_string(hide_password=False)
    with _guard:
        if key in _done:
            return
        with migration_lock(engine) as conn:
            at = current(conn)
            if at != head():
                from alembic import command

                cfg = config(conn)
                if at is None and sa.inspect(conn).has_table("reservations"):
                    command.stamp(cfg, FIRST)
                command.upgrade(cfg, "head")
        _done.add(key)


def _after_fork_in_child() -> None:
    global _guard
    _guard = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
