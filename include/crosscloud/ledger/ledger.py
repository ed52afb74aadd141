"""The reservation ledger: who holds which devices, for how long, and each cloud's membership state.

Concurrent DAG runs place jobs at the same time; each admission reads what is
reserved, decides and writes its reservation inside one write transaction
that no other admission runs beside (``engine.write``), so two runs can never
both take the last devices of a pool or of a tenant's quota. The ledger also
checks every reservation against the capacity and quota it is given, so a
wrong decision is refused rather than recorded.

A reservation is a lease: the run renews it while it works, and one whose run
stopped renewing is released by the next admission (``reap``) and never
counted as held. Every release, by its run or by the lease, is an event.

Cloud membership lives here too, not in the federation file, so that joining
or draining a cloud takes effect at the next placement without a restart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection

from crosscloud.ledger import engine as backend
from crosscloud.ledger import migrate
from crosscloud.ledger import queue as queue_rows
from crosscloud.ledger.figures import FigureStore
from crosscloud.ledger.fleets import FleetRecords
from crosscloud.ledger.leases import default_holder, lapse_reason, lease_seconds
from crosscloud.ledger.records import STATES, Event, Membership, Reservation, ReservationError, Usage
from crosscloud.ledger.schema import clouds, events, pins, queue_entries, reservations
from crosscloud.ledger.url import ledger_url

R = reservations.c
HELD = (R.tenant, R.run_id, R.cloud, R.accelerator, R.devices, R.created_at, R.holder, R.lease_expires_at)


def _live(now: float):
    """Not released, and not lapsed at ``now`` (a lapsed reservation holds nothing, reaped or not)."""
    return sa.and_(R.released_at.is_(None), sa.or_(R.lease_expires_at.is_(None), R.lease_expires_at > now))


def _of(query, columns, tenant: str | None, run_id: str | None):
    """``query`` narrowed to a tenant's or a run's rows of the table whose ``columns`` are given."""
    if tenant is not None:
        query = query.where(columns.tenant == tenant)
    return query if run_id is None else query.where(columns.run_id == run_id)


def _check(tenant: str, asked: dict[tuple[str, str], int], usage: Usage, capacity: dict[tuple[str, str], int],
           quota: dict[str, int]) -> None:
    """Refuse a decision beyond a pool's devices or the tenant's quota on a cloud."""
    per_cloud: dict[str, int] = {}
    for (cloud, accelerator), devices in asked.items():
        total, used = capacity.get((cloud, accelerator), 0), usage.pool(cloud, accelerator)
        if used + devices > total:
            raise ReservationError(f"{cloud}/{accelerator}: {devices} device(s) asked, {total - used} of {total} free")
        per_cloud[cloud] = per_cloud.get(cloud, 0) + devices
    for cloud, devices in per_cloud.items():
        if usage.tenant(tenant, cloud) + devices > quota.get(cloud, 0):
            raise ReservationError(f"tenant {tenant} on {cloud}: {devices} device(s) asked, quota {quota.get(cloud, 0)}, "
                                   f"{usage.tenant(tenant, cloud)} in use")


class Ledger:
    """The ledger at ``path_or_url`` (a SQLite file's path, or a SQLAlchemy URL); see ``crosscloud.ledger.url``."""

    def __init__(self, path_or_url: str | URL | os.PathLike | None = None):
        self.url = ledger_url(path_or_url)
        self.path = Path(self.url.database) if self.url.get_backend_name() == "sqlite" and self.url.database else None
        self.engine = backend.engine_for(self.url)
        migrate.upgrade(self.engine)

        self.queue = queue_rows.QueueStore(self.engine)
        self.figures = FigureStore(self.engine)
        self.fleets = FleetRecords(self.engine)

    def __repr__(self) -> str:
        return f"Ledger({self.url.render_as_string(hide_password=True)!r})"

    # -- reading ----------------------------------------------------------------------
    @staticmethod
    def _open(db: Connection, now: float) -> tuple[list, list]:
        """(live, lapsed) rows of the reservations not released yet: few, at most one per device held."""
        live, lapsed = [], []
        for row in db.execute(sa.select(R.id, *HELD).where(R.released_at.is_(None)).order_by(R.id)):
            (lapsed if row.lease_expires_at is not None and row.lease_expires_at <= now else live).append(row)
        return live, lapsed

    def usage(self) -> Usage:
        with backend.read(self.engine) as db:
            return Usage.of(self._open(db, time.time())[0])

    def active(self, tenant: str | None = None, run_id: str | None = None) -> list[Reservation]:
        """Reservations held now; a tenant sees only its own."""
        query = _of(sa.select(*HELD).where(_live(time.time())), R, tenant, run_id).order_by(R.id)
        with backend.read(self.engine) as db:
            return [Reservation(*row) for row in db.execute(query)]

    def events(self, tenant: str | None = None, run_id: str | None = None, limit: int = 100) -> list[Event]:
        """Releases, newest first: by whom or why (``detail``), and which devices."""
        query = _of(sa.select(events), events.c, tenant, run_id).order_by(events.c.id.desc()).limit(limit)
        with backend.read(self.engine) as db:
            return [Event(*row) for row in db.execute(query)]

    # -- admitting, renewing, releasing: one at a time -----------------------------------
    def admit(
        self,
        tenant: str,
        run_id: str,
        decide: Callable[[Usage], Iterable[tuple[str, str, int]]],
        capacity: dict[tuple[str, str], int],
        quota: dict[str, int],
        lease_s: float | None = None,
        holder: str = "",
    ) -> list[Reservation]:
        """Reserve what ``decide`` chooses given current usage, atomically; a retried admission gets its own back.

        ``decide`` returns (cloud, accelerator, devices) parts, or raises to admit
        nothing; it runs inside the transaction, so it must not be slow.
        ``capacity`` is each pool's device count and ``quota`` the tenant's
        devices per cloud; a part beyond either raises ReservationError. The
        reservation lapses ``lease_s`` (default ``lease_seconds()``) after now
        unless renewed. Lapsed reservations are released first.
        """
        lease = lease_s or lease_seconds()
        with backend.write(self.engine) as db:
            now = time.time()
            live, lapsed = self._open(db, now)
            self._lapse(db, now, lapsed)
            if any(r.tenant == tenant and r.run_id == run_id for r in live):  # a retried admission: its own, renewed
                return self._renew(db, tenant, run_id, now, lease)
            usage = Usage.of(live)
            asked: dict[tuple[str, str], int] = {}
            for cloud, accelerator, devices in decide(usage):
                asked[(cloud, accelerator)] = asked.get((cloud, accelerator), 0) + devices
            _check(tenant, asked, usage, capacity, quota)
            made = [Reservation(tenant, run_id, c, a, n, now, holder or default_holder(), now + lease)
                    for (c, a), n in asked.items()]
            if made:
                db.execute(sa.insert(reservations), [
                    {"tenant": r.tenant, "run_id": r.run_id, "cloud": r.cloud, "accelerator": r.accelerator,
                     "devices": r.devices, "created_at": now, "holder": r.holder, "lease_expires_at": r.lease_expires_at}
                    for r in made])
            return made

    def start(self, starts: list[tuple[int, str, str, list[tuple[str, str, int]], str, str]],
              capacity: dict[tuple[str, str], int], quotas: dict[str, dict[str, int]],
              lease_s: float | None = None, now: float | None = None) -> list[int]:
        """Reserve each queued run's parts and mark it running, in order, in one transaction; returns the ids started.

        ``starts``: (queue id, tenant, run id, parts, decision JSON, holder) as a
        scheduling pass decided them. A run whose parts no longer fit a pool or
        its tenant's quota as the reservations are now (a run admitted
        meanwhile) is left queued for the next pass: never oversubscribed; a run
        no longer waiting (cancelled, or started already) is never started again.
        ``now``: the scheduler's clock, which the queue's times are in.
        """
        lease = lease_s or lease_seconds()
        started = []
        with backend.write(self.engine) as db:
            wall = time.time()
            now = wall if now is None else now
            live, lapsed = self._open(db, wall)
            self._lapse(db, wall, lapsed)
            usage = Usage.of(live)
            for rid, tenant, run_id, parts, decision, holder in starts:
                asked: dict[tuple[str, str], int] = {}
                for cloud, accelerator, devices in parts:
                    asked[(cloud, accelerator)] = asked.get((cloud, accelerator), 0) + devices
                try:
                    _check(tenant, asked, usage, capacity, quotas.get(tenant, {}))
                except ReservationError:
                    continue
                turned = db.execute(sa.update(queue_entries).where(queue_entries.c.id == rid,
                                                                   queue_entries.c.state.in_(queue_rows.WAITING))
                                    .values(state="running", started_at=now, decision=decision, decided_at=now)).rowcount
                if not turned:  # cancelled, or started by another pass meanwhile: never started twice
                    continue
                db.execute(sa.insert(reservations), [
                    {"tenant": tenant, "run_id": run_id, "cloud": c, "accelerator": a, "devices": n, "created_at": wall,
                     "holder": holder or default_holder(), "lease_expires_at": wall + lease} for (c, a), n in asked.items()])
                for (c, a), n in asked.items():
                    usage.pools[(c, a)] = usage.pool(c, a) + n
                    usage.tenants[(tenant, c)] = usage.tenant(tenant, c) + n
                started.append(rid)
            if started:
                queue_rows.bump(db)
        return started

    @staticmethod
    def _renew(db: Connection, tenant: str, run_id: str, now: float, lease: float) -> list[Reservation]:
        extend = (sa.update(reservations).where(_live(now), R.tenant == tenant, R.run_id == run_id)
                  .values(lease_expires_at=now + lease).returning(R.id, *HELD))
        return [Reservation(*row[1:]) for row in sorted(db.execute(extend).all())]

    def renew(self, tenant: str, run_id: str, lease_s: float | None = None) -> int:
        """Extend a run's lease to ``lease_s`` from now; returns the devices it holds (0: released or lapsed)."""
        # on disk before it returns: the clouds' heartbeat (run.heartbeat) tells sub-tasks the new expiry, which a
        # renewal lost in a server crash would leave them trusting while the ledger gave the devices away
        with backend.write(self.engine) as db:
            return sum(r.devices for r in self._renew(db, tenant, run_id, time.time(), lease_s or lease_seconds()))

    def release(self, tenant: str, run_id: str, reason: str = "released") -> int:
        """Give back a run's devices; returns how many were held (0 when already released or lapsed).

        On disk before it returns, as an admission is: a release is what its
        caller then acts on (a queued run started on those devices, a run
        reported finished).
        """
        with backend.write(self.engine) as db:
            now = time.time()
            held = self._release(db, tenant, run_id, now, reason, reason)
            queue_rows.end(db, tenant, run_id, ("running", "paused"), "done", reason, now)
            return held

    def _release(self, db: Connection, tenant: str, run_id: str, now: float, reason: str, detail: str) -> int:
        """End the run's live reservations at ``now``, each recorded as a release with ``detail``; the devices held."""
        end = (sa.update(reservations).where(_live(now), R.tenant == tenant, R.run_id == run_id)
               .values(released_at=now, release_reason=reason).returning(*HELD))
        rows = db.execute(end).all()
        self._record(db, now, "released", rows, [detail] * len(rows))
        return sum(row.devices for row in rows)

    def pause(self, tenant: str, run_id: str, request: str, runtime_s: float, decision: str, now: float) -> int:
        """A running run paused: its devices given back and its entry waiting again, with what it asks for to resume
        (``request``, ``runtime_s``), in one transaction; returns the devices it held (0: it was not running)."""
        with backend.write(self.engine) as db:
            turned = db.execute(sa.update(queue_entries).where(
                queue_entries.c.tenant == tenant, queue_entries.c.run_id == run_id, queue_entries.c.state == "running")
                .values(state="paused", request=request, runtime_s=runtime_s, started_at=None, decision=decision,
                        decided_at=now, seen_at=now)).rowcount
            if not turned:
                return 0
            held = self._release(db, tenant, run_id, time.time(), "paused", "paused: it resumes from its saved state")
            queue_rows.bump(db)
            return held

    def reap(self, now: float | None = None) -> list[Reservation]:
        """Release every reservation whose lease lapsed (each with its reason, as an event); returns them."""
        with backend.write(self.engine) as db:
            now = time.time() if now is None else now
            lapsed = self._open(db, now)[1]
            self._lapse(db, now, lapsed)
            return [Reservation(*row[1:]) for row in lapsed]

    def _lapse(self, db: Connection, now: float, rows) -> None:
        """Release lapsed ``rows`` at ``now``, each with why: who stopped renewing, and when its lease ran out."""
        if not rows:
            return
        reasons = [lapse_reason(row.holder, row.lease_expires_at) for row in rows]
        db.execute(sa.update(reservations).where(R.id == sa.bindparam("rid"))
                   .values(released_at=now, release_reason=sa.bindparam("why")),
                   [{"rid": row.id, "why": why} for row, why in zip(rows, reasons)])
        self._record(db, now, "lapsed", rows, reasons)
        for tenant, run_id in {(row.tenant, row.run_id) for row in rows}:
            queue_rows.end(db, tenant, run_id, ("running",), "done", "its lease lapsed", now)

    @staticmethod
    def _record(db: Connection, now: float, kind: str, rows, reasons: list[str]) -> None:
        """Each of ``rows`` as an event of ``kind`` at ``now``."""
        if rows:
            db.execute(sa.insert(events), [
                {"at": now, "kind": kind, "tenant": row.tenant, "run_id": row.run_id, "cloud": row.cloud,
                 "devices": row.devices, "detail": why} for row, why in zip(rows, reasons)])

    # -- pins and cloud membership: plain upserts, no decision on usage -------------------
    def _upsert(self, table: sa.Table, keys: list[str], **values) -> None:
        dialect = postgresql if backend.is_postgres(self.engine) else sqlite
        stmt = dialect.insert(table).values(**values)
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_={k: stmt.excluded[k] for k in values if k not in keys})
        with backend.write(self.engine, lock=False) as db:
            db.execute(stmt)

    def pin(self, tenant: str, artifact: str, cloud: str, expires_at: float) -> None:
        """Keep an artifact warm on a cloud until ``expires_at``, whatever its demand."""
        self._upsert(pins, ["tenant", "artifact", "cloud"], tenant=tenant, artifact=artifact, cloud=cloud,
                     expires_at=expires_at)

    def pins(self, tenant: str) -> list[tuple[str, str, float]]:
        """(artifact, cloud, expires_at) of a tenant's pins, expired ones included (the planner ignores them)."""
        query = sa.select(pins.c.artifact, pins.c.cloud, pins.c.expires_at).where(pins.c.tenant == tenant)
        with backend.read(self.engine) as db:
            return [tuple(row) for row in db.execute(query)]

    def set_state(self, cloud: str, state: str) -> None:
        if state not in STATES:
            raise ValueError(f"cloud state {state!r} is unknown; choose one of {list(STATES)}")
        self._upsert(clouds, ["cloud"], cloud=cloud, state=state)

    def record_check(self, cloud: str, ok: bool, detail: str) -> None:
        self._upsert(clouds, ["cloud"], cloud=cloud, check_ok=int(ok), checked_at=time.time(), detail=detail)

    def memberships(self) -> dict[str, Membership]:
        query = sa.select(clouds.c.cloud, clouds.c.state, clouds.c.check_ok, clouds.c.checked_at, clouds.c.detail)
        with backend.read(self.engine) as db:
            rows = db.execute(query).all()
        return {c: Membership(s, None if ok is None else bool(ok), at, d) for c, s, ok, at, d in rows}
