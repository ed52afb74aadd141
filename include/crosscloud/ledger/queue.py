"""The queue's rows in the ledger: what was submitted, the last decision, and when the last pass ran.

The scheduler (``crosscloud.scheduler``) owns what the rows mean; this module
only stores them, in the same database as the reservations, so a run's start
(its reservation and its entry turning ``running``) is one transaction, and
the queue survives a restart of every component. Every change bumps the
queue's version, so a pass runs when something changed, not on every look.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from crosscloud.ledger import engine as backend
from crosscloud.ledger.records import QueueRow
from crosscloud.ledger.schema import queue_entries, scheduler_state

Q = queue_entries.c
ENDED = ("done", "cancelled", "expired", "refused")
WAITING = ("queued", "paused")
COLUMNS = [c.name for c in queue_entries.columns]


def row(r) -> QueueRow:
    values = dict(r._mapping)
    values["deferrable"] = bool(values["deferrable"])
    return QueueRow(**values)


def bump(db: Connection) -> None:
    """The queue changed: the next look runs a pass."""
    dialect = postgresql if db.engine.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(scheduler_state).values(name="queue", version=1)
    db.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"version": scheduler_state.c.version + 1}))


def end(db: Connection, tenant: str, run_id: str, states: Iterable[str], state: str, reason: str, now: float) -> int:
    """Rows of the run in ``states`` become ``state`` (an end); returns how many."""
    done = db.execute(sa.update(queue_entries).where(Q.tenant == tenant, Q.run_id == run_id, Q.state.in_(list(states)))
                      .values(state=state, ended_at=now, end_reason=reason)).rowcount
    if done:
        bump(db)
    return done


class QueueStore:
    """The queue's table of one ledger (``Ledger.queue``)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def submit(self, values: dict, now: float) -> QueueRow:
        """Enter a run, or find it there: a run waiting already keeps its place (its age); one that ended before is
        entered again. Returns its row."""
        with backend.write(self.engine, lock=False) as db:
            found = db.execute(sa.select(queue_entries).where(Q.tenant == values["tenant"], Q.run_id == values["run_id"])).first()
            if found is None:
                db.execute(sa.insert(queue_entries).values(**values, state="queued", submitted_at=now, seen_at=now))
            elif found.state in ENDED:
                db.execute(sa.update(queue_entries).where(Q.id == found.id).values(
                    **values, state="queued", submitted_at=now, seen_at=now, decision=None, decided_at=None,
                    started_at=None, ended_at=None, end_reason=None))
            else:
                db.execute(sa.update(queue_entries).where(Q.id == found.id).values(seen_at=now))
            if found is None or found.state in ENDED:
                bump(db)
            return row(db.execute(sa.select(queue_entries).where(Q.tenant == values["tenant"], Q.run_id == values["run_id"])).one())

    def get(self, tenant: str, run_id: str) -> QueueRow | None:
        with backend.read(self.engine) as db:
            found = db.execute(sa.select(queue_entries).where(Q.tenant == tenant, Q.run_id == run_id)).first()
        return None if found is None else row(found)

    def rows(self, states: Iterable[str], tenant: str | None = None) -> list[QueueRow]:
        query = sa.select(queue_entries).where(Q.state.in_(list(states))).order_by(Q.id)
        if tenant is not None:
            query = query.where(Q.tenant == tenant)
        with backend.read(self.engine) as db:
            return [row(r) for r in db.execute(query)]

    def submitted_since(self, since: float) -> list[QueueRow]:
        """Every run submitted at ``since`` or later, whatever became of it but a refusal: the demand of late."""
        query = sa.select(queue_entries).where(Q.submitted_at >= since, Q.state != "refused").order_by(Q.id)
        with backend.read(self.engine) as db:
            return [row(r) for r in db.execute(query)]

    def line(self) -> list[tuple[str, int, float, str]]:
        """(tenant, priority, submitted_at, run_id) of every waiting run: what its order needs, nothing more."""
        query = sa.select(Q.tenant, Q.priority, Q.submitted_at, Q.run_id).where(Q.state.in_(WAITING))
        with backend.read(self.engine) as db:
            return [tuple(r) for r in db.execute(query)]

    def estimate(self, tenant: str, run_id: str, runtime_s: float) -> None:
        """A running run's run time, measured from its rounds so far (the releases a pass expects move with it)."""
        with backend.write(self.engine, lock=False, durable=False) as db:
            db.execute(sa.update(queue_entries).where(Q.tenant == tenant, Q.run_id == run_id, Q.state == "running")
                       .values(runtime_s=runtime_s))

    def touch(self, tenant: str, run_id: str, now: float) -> None:
        """The run's waiter is still there (an entry nobody looks at expires)."""
        with backend.write(self.engine, lock=False, durable=False) as db:
            db.execute(sa.update(queue_entries).where(Q.tenant == tenant, Q.run_id == run_id).values(seen_at=now))

    def end(self, tenant: str, run_id: str, state: str, reason: str, now: float,
            states: Iterable[str] = WAITING) -> bool:
        """End a waiting run (cancelled, expired, refused); False when it was not waiting."""
        with backend.write(self.engine, lock=False) as db:
            return bool(end(db, tenant, run_id, states, state, reason, now))

    def expire(self, unseen_since: float, now: float) -> list[QueueRow]:
        """Waiting runs whose waiter has not looked since ``unseen_since`` end as expired; returns them."""
        with backend.write(self.engine, lock=False) as db:
            gone = [row(r) for r in db.execute(sa.select(queue_entries).where(Q.state.in_(WAITING), Q.seen_at < unseen_since))]
            if gone:
                db.execute(sa.update(queue_entries).where(Q.id.in_([r.id for r in gone])).values(
                    state="expired", ended_at=now, end_reason="nobody waited for it any more (its waiter stopped looking)"))
                bump(db)
            return gone

    def record(self, decisions: list[tuple[int, str]], now: float) -> None:
        """The pass's decisions of the entries it looked at (id, decision JSON), and that a pass ran."""
        with backend.write(self.engine, lock=False, durable=False) as db:
            if decisions:
                db.execute(sa.update(queue_entries).where(Q.id == sa.bindparam("rid"))
                           .values(decision=sa.bindparam("d"), decided_at=now),
                           [{"rid": i, "d": d} for i, d in decisions])

    def version(self) -> tuple[int, int, float | None]:
        """(the queue's version, the version the last pass saw, when that pass ran)."""
        with backend.read(self.engine) as db:
            found = db.execute(sa.select(scheduler_state).where(scheduler_state.c.name == "queue")).first()
        return (0, -1, None) if found is None else (found.version, found.passed_version, found.passed_at)

    def passed(self, version: int, now: float) -> None:
        dialect = postgresql if backend.is_postgres(self.engine) else sqlite
        stmt = dialect.insert(scheduler_state).values(name="queue", version=version, passed_version=version, passed_at=now)
        with backend.write(self.engine, lock=False, durable=False) as db:
            db.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"passed_version": version, "passed_at": now}))
