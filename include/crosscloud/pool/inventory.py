"""The global view of compute: every cloud's pools, who uses them, and whether a cloud takes work.

Built fresh from three sources each time it is asked for: the federation file
(what exists), the reservation ledger (what admitted runs hold, membership)
and the backends (what sub-tasks actually run). Placement reads its ``sites``,
the CLI prints it, DAGs and the UI call ``collect``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

from crosscloud.backends import SubTaskError, get_backend
from crosscloud.backends.kubernetes import KubernetesBackend
from crosscloud.core.federation import Cloud, Federation
from crosscloud.core.paths import data_dir
from crosscloud.energy.power import effective_price
from crosscloud.energy.prices import CsvFeed, ElectricityError, map_to_data_year
from crosscloud.ledger import Ledger, Membership, Usage
from crosscloud.pool.placement import Site

_FEEDS: dict[str, object] = {}


def electricity_now(cloud: Cloud, now: float | None = None) -> tuple[float | None, str, str]:
    """(USD/MWh, data hour, note) of ``cloud``'s grid region now.

    The public data is for one year (2023): "now" is mapped onto the data's year
    by day-of-year and hour (``energy.prices.map_to_data_year``). The price is
    None ("unknown") when the cloud has no ``grid:`` section, the feed cannot
    be read, or it has no price for that hour; the note says which.
    """
    if cloud.grid is None:
        return None, "", "no grid section"
    key = str(data_dir())
    feed = _FEEDS.setdefault(key, CsvFeed(key))
    when = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    hour = map_to_data_year(when, feed.year)
    label = f"{hour:%Y-%m-%d %H:00}"
    try:
        return feed.prices(cloud.grid.region).at(hour), label, ""
    except ElectricityError as e:
        return None, label, str(e)


@dataclass(frozen=True)
class PoolView:
    accelerator: str
    total: int
    reserved: int  # held by admitted runs (ledger)
    running: int  # held by sub-tasks the backends see running
    price_per_device_hour: float
    throughput: dict[str, float]
    families: tuple[str, ...]  # model families with an adapted image for this accelerator
    # electricity (crosscloud.energy.prices/power); None when the cloud has no grid or the feed has no price now
    electricity_usd_mwh: float | None = None
    electricity_hour: str = ""  # the data hour the price is for (now mapped onto the data's year)
    power_w: float = 0.0
    pue: float | None = None
    electricity_note: str = ""  # why the price is unknown
    memory_gb: float = 16.0  # memory of one device
    # kubernetes clouds: devices the cluster itself has free now (allocatable - requested, other workloads
    # included); None when not asked (admission) or not known, and cluster_note says why
    cluster_free: int | None = None
    cluster_note: str = ""

    @property
    def effective_price_per_device_hour(self) -> float | None:
        """Rental + energy at the electricity price now x PUE; None when the price is unknown."""
        if self.electricity_usd_mwh is None or self.pue is None:
            return None
        return effective_price(self.price_per_device_hour, self.power_w, self.electricity_usd_mwh, self.pue)

    @property
    def in_use(self) -> int:
        return max(self.reserved, self.running)

    @property
    def free(self) -> int:
        """Devices crosscloud may still use: its own count, and no more than the cluster has free."""
        own = max(self.total - self.in_use, 0)
        return own if self.cluster_free is None else min(own, self.cluster_free)


@dataclass(frozen=True)
class CloudView:
    name: str
    role: str
    jurisdiction: str
    region: str
    method: str
    state: str  # active, draining or joining
    health: str
    refuses: str  # why the cloud takes no new work; empty when it does
    pools: list[PoolView]


@dataclass(frozen=True)
class TenantView:
    name: str
    quota: dict[str, int]
    used: dict[str, int]
    runs: list[str]


@dataclass
class Inventory:
    federation: str
    generated_at: float
    clouds: list[CloudView]
    tenants: list[TenantView] = field(default_factory=list)

    def cloud(self, name: str) -> CloudView:
        return next(c for c in self.clouds if c.name == name)

    def to_dict(self) -> dict:
        out = asdict(self)
        for cloud, view in zip(out["clouds"], self.clouds):
            for pool, p in zip(cloud["pools"], view.pools):
                pool.update(in_use=p.in_use, free=p.free, effective_price_per_device_hour=p.effective_price_per_device_hour)
        return out

    def with_usage(self, usage: Usage) -> Inventory:
        """This inventory with the ledger's reservations as ``usage`` has them (read later, inside an admission)."""
        clouds = [replace(c, pools=[replace(p, reserved=usage.pool(c.name, p.accelerator)) for p in c.pools])
                  for c in self.clouds]
        tenants = [replace(t, used={cloud: usage.tenant(t.name, cloud) for cloud in t.quota}) for t in self.tenants]
        return replace(self, clouds=clouds, tenants=tenants)

    def sites(self, family: str) -> list[Site]:
        """Every pool as a placement site for a job of model ``family``."""
        return [
            Site(
                cloud=c.name,
                accelerator=p.accelerator,
                jurisdiction=c.jurisdiction,
                total=p.total,
                free=p.free,
                price_per_device_hour=p.price_per_device_hour,
                speed=p.throughput.get(family, p.throughput["default"]),
                families=frozenset(p.families),
                refuses=c.refuses,
                memory_gb=p.memory_gb,
            )
            for c in self.clouds
            for p in c.pools
        ]

    def format(self) -> str:
        lines = [f"federation {self.federation}: {len(self.clouds)} clouds"]
        lines.append(
            f"{'cloud':<12}{'jurisd.':<9}{'state':<10}{'health':<24}{'accelerator':<14}"
            f"{'total':>6}{'in use':>8}{'free':>6}{'price/h':>9}{'USD/MWh':>9}{'eff./h':>9}"
        )
        for c in self.clouds:
            for i, p in enumerate(c.pools):
                head = f"{c.name:<12}{c.jurisdiction:<9}{c.state:<10}{c.health[:23]:<24}" if i == 0 else " " * 55
                mwh = "unknown" if p.electricity_usd_mwh is None else f"{p.electricity_usd_mwh:.1f}"
                eff = p.effective_price_per_device_hour
                lines.append(f"{head}{p.accelerator:<14}{p.total:>6}{p.in_use:>8}{p.free:>6}{p.price_per_device_hour:>9.2f}"
                             f"{mwh:>9}{'unknown' if eff is None else f'{eff:.4f}':>9}")
        hours = sorted({p.electricity_hour for c in self.clouds for p in c.pools if p.electricity_hour})
        if hours:
            lines.append(f"  electricity: price of the grid region at {', '.join(hours)} UTC (now mapped onto the data's year); "
                         "eff./h = rental + power x price x PUE")
        for c in self.clouds:
            for p in c.pools:
                if p.cluster_free is not None:
                    lines.append(f"  {c.name}/{p.accelerator}: the cluster has {p.cluster_free} free (its other workloads included)")
                elif p.cluster_note:
                    lines.append(f"  {c.name}/{p.accelerator}: {p.cluster_note}")
        refusing = [c for c in self.clouds if c.refuses]
        for c in refusing:
            lines.append(f"  {c.name} takes no new work: {c.refuses}")
        for t in self.tenants:
            use = ", ".join(f"{cloud} {t.used.get(cloud, 0)}/{q}" for cloud, q in t.quota.items())
            lines.append(f"tenant {t.name}: devices used/quota {use}; runs holding devices: {', '.join(t.runs) or 'none'}")
        return "\n".join(lines)


def _running(fed: Federation) -> dict[str, dict[str, int]]:
    used: dict[str, dict[str, int]] = {}
    for method in {c.access.method for c in fed.clouds}:
        try:
            used.update(get_backend(method).used_devices())
        except SubTaskError:  # a method without an engine backend reports through its operator
            continue
    return used


def membership_state(cloud: Cloud, member: Membership | None) -> tuple[str, str, str]:
    """A cloud's (state, health, reason it refuses new work)."""
    state = (member.state if member and member.state else None) or cloud.state
    if member is None or member.check_ok is None:
        health = "unchecked"
    elif member.check_ok:
        health = f"ok ({time.strftime('%m-%d %H:%M', time.localtime(member.checked_at))})"
    else:
        health = f"failed: {member.detail}"
    if state == "draining":
        refuses = "draining: takes no new sub-tasks"
    elif member is not None and member.check_ok is False:
        refuses = f"last join check failed ({member.detail}); run `crosscloud cloud join {cloud.name}` again"
    elif state == "joining" and not (member and member.check_ok):
        refuses = f"joining: has not passed its join check yet (`crosscloud cloud join {cloud.name}`)"
    else:
        refuses = ""
    if state == "joining" and member and member.check_ok:
        state = "active"
    return state, health, refuses


def clusters_free(cloud: Cloud) -> tuple[dict[str, int], str]:
    """({accelerator: free devices}, note) of a kubernetes cloud's pools, asked of its cluster's API now."""
    try:
        return KubernetesBackend().free(cloud), ""
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster is shown, not fatal to the view
        return {}, f"cluster not asked: {type(exc).__name__}: {str(exc)[:200]}"


def clouds_now(fed: Federation, ledger: Ledger, usage: Usage, electricity: bool = True,
               clusters: bool = True) -> list[CloudView]:
    """Every cloud's view: membership (ledger), pools with ``usage``'s reservations and the backends' running sub-tasks."""
    members, running = ledger.memberships(), _running(fed)
    clouds = []
    for c in fed.clouds:
        state, health, refuses = membership_state(c, members.get(c.name))
        mwh, hour, note = electricity_now(c) if electricity else (None, "", "not read")
        free_now, why = clusters_free(c) if clusters and c.access.method == "kubernetes" else ({}, "")
        pools = []
        for p in c.pools:
            pools.append(PoolView(
                p.accelerator, p.count, usage.pool(c.name, p.accelerator), running.get(c.name, {}).get(p.accelerator, 0),
                p.price_per_device_hour, dict(p.throughput),
                tuple(sorted({i.family for i in fed.images if i.accelerator == p.accelerator})),
                mwh, hour, p.power_w, c.grid.pue if c.grid else None, note, memory_gb=p.memory_gb,
                cluster_free=free_now.get(p.accelerator), cluster_note=why,
            ))
        clouds.append(CloudView(c.name, c.role, c.jurisdiction, c.region, c.access.method, state, health, refuses, pools))
    return clouds


def before_admission(fed: Federation, ledger: Ledger) -> Inventory:
    """What admission reads before its ledger transaction: memberships and the backends' running sub-tasks.

    Reservations come inside the transaction (``Inventory.with_usage``), so
    nothing slow holds the ledger's write lock, which every other admission
    waits for. Neither the price nor the clusters are read: placement uses neither.
    """
    return Inventory(fed.name, time.time(), clouds_now(fed, ledger, Usage({}, {}), electricity=False, clusters=False))


def collect(fed: Federation, ledger: Ledger | None = None, tenant: str | None = None, electricity: bool = True,
            clusters: bool = True) -> Inventory:
    """The inventory now; with ``tenant``, the tenant section shows only that tenant."""
    ledger = ledger or Ledger()
    usage = ledger.usage()
    clouds = clouds_now(fed, ledger, usage, electricity, clusters)
    reservations = ledger.active(tenant)
    tenants = [
        TenantView(
            t.name,
            dict(t.quotas),
            {cloud: usage.tenant(t.name, cloud) for cloud in t.quotas},
            sorted({r.run_id for r in reservations if r.tenant == t.name}),
        )
        for t in fed.tenants
        if tenant is None or t.name == tenant
    ]
    return Inventory(fed.name, time.time(), clouds, tenants)
