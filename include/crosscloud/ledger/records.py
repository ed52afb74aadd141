"""What the ledger hands out: reservations, usage, cloud membership, events, and its refusal."""

from __future__ import annotations

from dataclasses import dataclass

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
    holder: str = ""  # who admitted it (host:pid unless the caller said)
    lease_expires_at: float | None = None  # when it lapses unless renewed; None: held until released


@dataclass(frozen=True)
class Usage:
    """Devices reserved now, per pool and per tenant and cloud."""

    pools: dict[tuple[str, str], int]
    tenants: dict[tuple[str, str], int]

    def pool(self, cloud: str, accelerator: str) -> int:
        return self.pools.get((cloud, accelerator), 0)

    def tenant(self, tenant: str, cloud: str) -> int:
        return self.tenants.get((tenant, cloud), 0)

    @classmethod
    def of(cls, rows) -> Usage:
        """The devices ``rows`` (reservations, or the ledger's rows of them) hold, per pool and per tenant and cloud."""
        pools: dict[tuple[str, str], int] = {}
        tenants: dict[tuple[str, str], int] = {}
        for r in rows:
            pools[(r.cloud, r.accelerator)] = pools.get((r.cloud, r.accelerator), 0) + r.devices
            tenants[(r.tenant, r.cloud)] = tenants.get((r.tenant, r.cloud), 0) + r.devices
        return cls(pools, tenants)

    def by_tenant(self) -> dict[str, int]:
        """Devices each tenant holds, over every cloud."""
        held: dict[str, int] = {}
        for (tenant, _), n in self.tenants.items():
            held[tenant] = held.get(tenant, 0) + n
        return held


@dataclass(frozen=True)
class Membership:
    """A cloud's runtime state: drained or not, and its last join check."""

    state: str | None  # overrides the federation file's state when set
    check_ok: bool | None  # None: never checked
    checked_at: float | None
    detail: str


@dataclass(frozen=True)
class Event:
    """Something that happened to a reservation: ``released`` (by its run or by hand) or ``lapsed`` (its lease)."""

    id: int
    at: float
    kind: str
    tenant: str
    run_id: str
    cloud: str
    devices: int
    detail: str


@dataclass(frozen=True)
class QueueRow:
    """One run in the queue as the ledger stores it; ``request`` and ``decision`` are the scheduler's JSON."""

    id: int
    tenant: str
    run_id: str
    state: str
    priority: int
    submitted_at: float
    deadline: float | None
    deferrable: bool
    objective: str
    request: str
    runtime_s: float
    holder: str
    seen_at: float
    decision: str | None
    decided_at: float | None
    started_at: float | None
    ended_at: float | None
    end_reason: str | None
