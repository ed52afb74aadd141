"""The reservation ledger: who holds which devices, and each cloud's membership state.

Concurrent DAG runs place jobs at the same time; each admission reads what is
reserved, decides and writes its reservation inside one write transaction
(SQLite ``BEGIN IMMEDIATE``), so two runs can never both take the last
devices of a pool or of a tenant's quota. The ledger also checks every
reservation against the capacity and quota it is given, so a wrong decision
is refused rather than recorded. Reservations are released when a run ends,
fails or is killed (the DAG's teardown and the operators' kill handlers).

Cloud membership lives here too, not in the federation file, so that joining
or draining a cloud takes effect at the next placement without a restart.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from crosscloud.core.paths import state_dir

SCHEMA = """
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

STATES = ("active", "draining")


class ReservationError(RuntimeError):
    """A reservation that would exceed a pool or a tenant's quota."""


@dataclass(frozen=True)
class Reservation:
    tenant: str
    run_id: str
    cloud: str
    accelerator: str
    devices: int
    created_at: float


@dataclass(frozen=True)
class Usage:
    """Devices reserved now, per pool and per tenant and cloud."""

    pools: dict[tuple[str, str], int]
    tenants: dict[tuple[str, str], int]

    def pool(self, cloud: str, accelerator: str) -> int:
        return self.pools.get((cloud, accelerator), 0)

    def tenant(self, tenant: str, cloud: str) -> int:
        return self.tenants.get((tenant, cloud), 0)


@dataclass(frozen=True)
class Membership:
    """A cloud's runtime state: drained or not, and its last join check."""

    state: str | None  # overrides the federation file's state when set
    check_ok: bool | None  # None: never checked
    checked_at: float | None
    detail: str


def ledger_path() -> Path:
    return Path(os.environ.get("CROSSCLOUD_LEDGER") or state_dir() / "ledger.sqlite")


class Ledger:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else ledger_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(SCHEMA)

    def _connect(self) -> closing[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        return closing(db)

    @contextmanager
    def _write(self):
        """One write transaction: the whole ledger is locked against other writers until it ends."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _usage(db: sqlite3.Connection) -> Usage:
        pools, tenants = {}, {}
        rows = db.execute(
            "SELECT tenant, cloud, accelerator, SUM(devices) FROM reservations WHERE released_at IS NULL "
            "GROUP BY tenant, cloud, accelerator"
        )
        for tenant, cloud, accelerator, n in rows:
            pools[(cloud, accelerator)] = pools.get((cloud, accelerator), 0) + n
            tenants[(tenant, cloud)] = tenants.get((tenant, cloud), 0) + n
        return Usage(pools, tenants)

    def usage(self) -> Usage:
        with self._connect() as db:
            return self._usage(db)

    def admit(
        self,
        tenant: str,
        run_id: str,
        decide: Callable[[Usage], Iterable[tuple[str, str, int]]],
        capacity: dict[tuple[str, str], int],
        quota: dict[str, int],
    ) -> list[Reservation]:
        """Reserve what ``decide`` chooses given current usage, atomically; a retried admission gets its own back.

        ``decide`` returns (cloud, accelerator, devices) parts, or raises to admit
        nothing. ``capacity`` is each pool's device count and ``quota`` the
        tenant's devices per cloud; a part beyond either raises ReservationError.
        """
        with self._write() as db:
            held = self._active(db, tenant, run_id)
            if held:
                return held
            usage = self._usage(db)
            now = time.time()
            asked: dict[tuple[str, str], int] = {}
            for cloud, accelerator, devices in decide(usage):
                asked[(cloud, accelerator)] = asked.get((cloud, accelerator), 0) + devices
            per_cloud: dict[str, int] = {}
            for (cloud, accelerator), devices in asked.items():
                total = capacity.get((cloud, accelerator), 0)
                if usage.pool(cloud, accelerator) + devices > total:
                    raise ReservationError(
                        f"{cloud}/{accelerator}: {devices} device(s) asked, {total - usage.pool(cloud, accelerator)} of {total} free"
                    )
                per_cloud[cloud] = per_cloud.get(cloud, 0) + devices
            for cloud, devices in per_cloud.items():
                if usage.tenant(tenant, cloud) + devices > quota.get(cloud, 0):
                    raise ReservationError(
                        f"tenant {tenant} on {cloud}: {devices} device(s) asked, quota {quota.get(cloud, 0)}, "
                        f"{usage.tenant(tenant, cloud)} in use"
                    )
            db.executemany(
                "INSERT INTO reservations (tenant, run_id, cloud, accelerator, devices, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(tenant, run_id, c, a, n, now) for (c, a), n in asked.items()],
            )
            return self._active(db, tenant, run_id)

    @staticmethod
    def _active(db: sqlite3.Connection, tenant: str | None, run_id: str | None = None) -> list[Reservation]:
        query = "SELECT tenant, run_id, cloud, accelerator, devices, created_at FROM reservations WHERE released_at IS NULL"
        args: list[str] = []
        if tenant is not None:
            query, args = query + " AND tenant = ?", [*args, tenant]
        if run_id is not None:
            query, args = query + " AND run_id = ?", [*args, run_id]
        return [Reservation(*row) for row in db.execute(query + " ORDER BY id", args)]

    def active(self, tenant: str | None = None, run_id: str | None = None) -> list[Reservation]:
        """Reservations held now; a tenant sees only its own."""
        with self._connect() as db:
            return self._active(db, tenant, run_id)

    def release(self, tenant: str, run_id: str) -> int:
        """Give back a run's devices; returns how many were held (0 when already released)."""
        with self._write() as db:
            held = sum(r.devices for r in self._active(db, tenant, run_id))
            db.execute(
                "UPDATE reservations SET released_at = ? WHERE tenant = ? AND run_id = ? AND released_at IS NULL",
                (time.time(), tenant, run_id),
            )
            return held

    # -- pins: artifacts kept warm on a cloud until a time, whatever their demand --------
    def pin(self, tenant: str, artifact: str, cloud: str, expires_at: float) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO pins (tenant, artifact, cloud, expires_at) VALUES (?, ?, ?, ?) ON CONFLICT "
                "(tenant, artifact, cloud) DO UPDATE SET expires_at = excluded.expires_at",
                (tenant, artifact, cloud, expires_at),
            )

    def pins(self, tenant: str) -> list[tuple[str, str, float]]:
        """(artifact, cloud, expires_at) of a tenant's pins, expired ones included (the planner ignores them)."""
        with self._connect() as db:
            return db.execute("SELECT artifact, cloud, expires_at FROM pins WHERE tenant = ?", (tenant,)).fetchall()

    # -- cloud membership --------------------------------------------------------------
    def set_state(self, cloud: str, state: str) -> None:
        if state not in STATES:
            raise ValueError(f"cloud state {state!r} is unknown; choose one of {list(STATES)}")
        with self._write() as db:
            db.execute(
                "INSERT INTO clouds (cloud, state) VALUES (?, ?) ON CONFLICT (cloud) DO UPDATE SET state = excluded.state",
                (cloud, state),
            )

    def record_check(self, cloud: str, ok: bool, detail: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO clouds (cloud, check_ok, checked_at, detail) VALUES (?, ?, ?, ?) ON CONFLICT (cloud) DO UPDATE "
                "SET check_ok = excluded.check_ok, checked_at = excluded.checked_at, detail = excluded.detail",
                (cloud, int(ok), time.time(), detail),
            )

    def memberships(self) -> dict[str, Membership]:
        with self._connect() as db:
            rows = db.execute("SELECT cloud, state, check_ok, checked_at, detail FROM clouds").fetchall()
        return {c: Membership(s, None if ok is None else bool(ok), at, d) for c, s, ok, at, d in rows}
