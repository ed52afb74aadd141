"""Served models' fleets in the ledger: one record per tenant and model, read and changed from any host.

A record is a JSON object of a few named parts (the replicas, the decision
and grid cuts in force, where the router runs). ``update`` changes some parts
and keeps the others, in one transaction, so two hosts changing different
parts never lose each other's write; ``update_part`` changes one part from
its value read in that same transaction (one cloud's grid cut among the
others'). ``changing`` is held through a whole change of the fleet (replicas
started and stopped, weights set): the hourly placement, a grid request and
an operator's command take turns, whichever host they run on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from crosscloud.ledger import engine as backend
from crosscloud.ledger.schema import serving_fleets as F


class FleetBusy(RuntimeError):
    """Another task is changing the fleet and did not finish within the wait."""


class FleetRecords:
    """The ledger's ``serving_fleets``."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def get(self, tenant: str, name: str) -> dict:
        """The fleet's record (``{}`` when it never served)."""
        query = sa.select(F.c.record).where(F.c.tenant == tenant, F.c.name == name)
        with backend.read(self.engine) as db:
            raw = db.execute(query).scalar()
        return json.loads(raw) if raw else {}

    def update(self, tenant: str, name: str, **parts) -> dict:
        """Set these parts of the record (a part set to None is removed), keep the rest; the record after."""
        return self._change(tenant, name, lambda record: {**record, **parts})

    def update_part(self, tenant: str, name: str, part: str, change: Callable[[Any], Any]) -> dict:
        """Set ``part`` to ``change(its value now)``, read and written in one transaction (the row locked), so two
        hosts changing different entries of one part (grid cuts of two clouds) both keep theirs; the record after."""
        return self._change(tenant, name, lambda record: {**record, part: change(record.get(part))})

    def _change(self, tenant: str, name: str, change: Callable[[dict], dict]) -> dict:
        """The record becomes ``change(record)``: read and written in one transaction, nothing between."""
        key, now = (F.c.tenant == tenant, F.c.name == name), time.time()
        postgres = backend.is_postgres(self.engine)
        new = (postgresql if postgres else sqlite).insert(F).values(tenant=tenant, name=name, record="{}", updated_at=now)
        with backend.write(self.engine, lock=False) as db:  # SQLite: BEGIN IMMEDIATE; PostgreSQL: the row's lock
            db.execute(new.on_conflict_do_nothing())
            query = sa.select(F.c.record).where(*key)
            raw = db.execute(query.with_for_update() if postgres else query).scalar()
            record = {k: v for k, v in change(json.loads(raw)).items() if v is not None}
            db.execute(sa.update(F).where(*key).values(record=json.dumps(record), updated_at=now))
        return record

    def names(self, tenants: list[str] | None = None) -> list[tuple[str, str]]:
        """(tenant, model) of every fleet that has served, of the given tenants (None: all)."""
        query = sa.select(F.c.tenant, F.c.name).order_by(F.c.tenant, F.c.name)
        if tenants is not None:
            query = query.where(F.c.tenant.in_(tenants))
        with backend.read(self.engine) as db:
            return [(r.tenant, r.name) for r in db.execute(query)]

    def delete(self, tenant: str, name: str) -> None:
        """Forget a fleet that no longer serves: it leaves the listings."""
        with backend.write(self.engine, lock=False) as db:
            db.execute(sa.delete(F).where(F.c.tenant == tenant, F.c.name == name))

    @contextmanager
    def changing(self, tenant: str, name: str, wait_s: float = 600.0) -> Iterator[None]:
        """Held while one task changes the fleet; another waits up to ``wait_s``, then ``FleetBusy``."""
        key = backend.lock_key(f"fleet:{tenant}/{name}")
        with backend.session_lock(self.engine, f"fleet-{key & 0xFFFFFFFF:08x}", key, wait_s) as taken:
            if not taken:
                raise FleetBusy(f"{tenant}/{name}: another task has been changing this fleet for over {wait_s:.0f} s "
                                "(a placement or a grid request); try again when it has finished")
            yield
