"""Alembic's environment for the ledger: migrations run on the connection ``crosscloud.ledger.migrate`` hands over.

``migrate.upgrade`` passes a connection already inside its transaction and
holding its lock (``config.attributes["connection"]``); without one (Alembic
commands run by hand, e.g. ``command.revision(migrate.config(), ..., autogenerate=True)``)
the ledger's own URL is used, as ``Ledger()`` would choose it.
"""

from __future__ import annotations

from alembic import context

from crosscloud.ledger.engine import engine_for
from crosscloud.ledger.schema import VERSION_TABLE, metadata
from crosscloud.ledger.url import ledger_url


def run(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("the ledger's migrations run against a database (Ledger() runs them); offline SQL is not supported")
given = context.config.attributes.get("connection")
if given is not None:
    run(given)
else:
    with engine_for(ledger_url()).connect() as own:
        run(own)
        own.commit()
