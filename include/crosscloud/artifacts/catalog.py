"""A tenant's artifacts across the federation: what exists, where it is warm, who needs it.

It joins the stores (manifests and chunk indexes per cloud) with the runs'
plans (which cloud read which artifacts, when) and the ledger's pins, so
``distribution.choose_warm_sets`` can decide each cloud's warm set, and then
carries a cloud's warm set out: evictions first (manifests, then packs no
remaining artifact uses), then fetches through the preheat path.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from crosscloud.artifacts.distribution import Artifact, CloudWarmSet, Pin, Use, WarmSets, choose_warm_sets, demand
from crosscloud.artifacts.preheat import RateCap, TransferReport, fetch
from crosscloud.core.federation import Federation
from crosscloud.core.keys import manifest_key
from crosscloud.ledger import Ledger
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectNotFound, ObjectStore
from crosscloud.store.chunks import BlobRef, ChunkIndex, Manifest, Warmth, warmth
from crosscloud.store.network import nearest_first
from crosscloud.store.open_store import open_store


@dataclass
class Catalog:
    tenant: str
    stores: dict[str, ObjectStore]
    indexes: dict[str, ChunkIndex]
    manifests: dict[str, Manifest]  # by artifact sha256, from whichever cloud holds it
    present: dict[str, set[str]]  # cloud -> artifacts whose manifest it has

    def artifacts(self) -> dict[str, Artifact]:
        return {sha: Artifact(sha, m.kind, m.size) for sha, m in self.manifests.items()}

    def held(self) -> dict[str, dict[str, int]]:
        """Logical bytes of each artifact a cloud already holds (a chunk repeated inside it counts each time)."""
        out: dict[str, dict[str, int]] = {}
        for cloud, index in self.indexes.items():
            for sha, m in self.manifests.items():
                have = sum(c.size for c in m.chunks if c.sha256 in index)
                if have:
                    out.setdefault(cloud, {})[sha] = have
        return out

    def warmth(self, sha: str, cloud: str, verify: bool = False) -> Warmth:
        m = self.manifests[sha]
        return warmth(self.stores[cloud], self.tenant, BlobRef(sha256=sha, size=m.size), verify, self.indexes[cloud])


def load_catalog(fed: Federation, tenant: str, clouds: list[str] | None = None) -> Catalog:
    names = clouds or [c.name for c in fed.clouds]
    stores = {n: open_store(fed.cloud(n), tenant) for n in names}
    manifests, present, indexes = {}, {}, {}
    for name, store in stores.items():
        indexes[name] = ChunkIndex(store, tenant)
        present[name] = set()
        for key in store.list(f"{tenant}/artifacts"):
            if key.endswith(".json"):
                m = Manifest.from_json(store.get(key))
                manifests.setdefault(m.sha256, m)
                present[name].add(m.sha256)
    return Catalog(tenant, stores, indexes, manifests, present)


def uses_of(fed: Federation, run: Plan, at: float) -> list[Use]:
    """Where a run reads what: each cloud its shards and the initial model; the evaluation data and model
    at home; the whole dataset at its home, where every later preheat copies it from."""
    return [Use(c.name, tuple(r.sha256 for r in run.needs(c.name)), at) for c in run.clouds] + [
        Use(fed.local_cloud.name, (*(h.sha256 for h in run.held_out), *([run.init.sha256] if run.init else [])), at),
        Use(fed.dataset(run.dataset).home, tuple(s.sha256 for s in run.shards), at),
    ]


def uses_from_runs(fed: Federation, tenant: str) -> list[Use]:
    """The uses of every run whose plan the local cloud keeps, dated by its admission."""
    home = open_store(fed.local_cloud, tenant)
    uses = []
    for key in home.list(f"{tenant}/runs"):
        if key.endswith("/plan.json") and key.count("/") == 3:
            run = Plan.model_validate(json.loads(home.get(key)))
            uses += uses_of(fed, run, run.created_at)
    return uses


def pins_of(tenant: str, ledger: Ledger | None = None) -> list[Pin]:
    return [Pin(a, c, t) for a, c, t in (ledger or Ledger()).pins(tenant)]


def choose_tenant_warm_sets(fed: Federation, tenant: str, clouds: list[str], budget_bytes: int, half_life_s: float,
                            pin: list[str] = (), pin_s: float = 0.0,
                            ledger: Ledger | None = None) -> tuple[Catalog, WarmSets]:
    """Pin ``pin`` on ``clouds`` for ``pin_s``, then choose every cloud's warm set under ``budget_bytes`` from runs' demand."""
    ledger, now = ledger or Ledger(), time.time()
    cat = load_catalog(fed, tenant, clouds)
    unknown = [a for a in pin if a not in cat.manifests]
    if unknown:
        raise ValueError(f"artifacts {unknown} are not in tenant {tenant}'s catalog on {clouds}; pass sha256 digests")
    for sha in pin:
        for cloud in clouds:
            ledger.pin(tenant, sha, cloud, now + pin_s)
    wanted = demand(uses_from_runs(fed, tenant), now, half_life_s=half_life_s)
    budgets = {c: budget_bytes for c in clouds}
    pins = pins_of(tenant, ledger) + in_flight(fed, tenant, ledger, now)
    return cat, choose_warm_sets(cat.artifacts(), cat.held(), budgets, wanted, pins, now)


def in_flight(fed: Federation, tenant: str, ledger: Ledger, now: float) -> list[Pin]:
    """Pins for what runs holding devices now read, where they read it: never evicted under a running run."""
    home, pins = open_store(fed.local_cloud, tenant), []
    for run_id in sorted({r.run_id for r in ledger.active(tenant)}):
        try:
            run = Plan.load(home, tenant, run_id)
        except ObjectNotFound:  # admitted, plan not written yet: nothing of it is on any cloud
            continue
        pins += [Pin(a, use.cloud, now + 86400) for use in uses_of(fed, run, now) for a in use.artifacts]
    return pins


def collect_garbage(store: ObjectStore, tenant: str, index: ChunkIndex, keep: list[Manifest]) -> int:
    """Delete packs none of whose chunks a kept artifact uses; returns the bytes freed.

    A pack shared with a kept artifact stays whole (packs are never rewritten),
    so eviction frees whole packs only.
    """
    used = {d for m in keep for d in m.unique()}
    packs: dict[str, list[str]] = {}
    for digest, (pack, _, _) in index.where.items():
        packs.setdefault(pack, []).append(digest)
    freed = 0
    for pack, digests in packs.items():
        if not used.intersection(digests):
            store.delete(f"{pack}.idx")  # the index first: a chunk is never listed without its pack
            store.delete(pack)
            freed += sum(index.where.pop(d)[2] for d in digests)
    return freed


def protective_cap(fed: Federation, cloud: str, link_share: float, ledger: Ledger | None = None) -> RateCap | None:
    """A cap of ``link_share`` of the cloud's fastest declared link while runs hold devices there, else none.

    Preheating must not starve the pseudo-gradient and checkpoint exchange of
    a run training on that cloud; an idle cloud takes transfers at full speed.
    """
    busy = any(c == cloud for c, _ in (ledger or Ledger()).usage().pools)
    links = [link.bandwidth_mbps for link in fed.links if cloud in (link.a, link.b)]
    if not busy or not links or link_share >= 1:
        return None
    return RateCap(link_share * max(links) * 1e6 / 8)


def apply(fed: Federation, cat: Catalog, part: CloudWarmSet, rate: RateCap | None = None) -> dict:
    """Carry out one cloud's warm set: evict, free unused packs, fetch what is missing."""
    cloud, store = part.cloud, cat.stores[part.cloud]
    for sha, _ in part.evict:
        store.delete(manifest_key(cat.tenant, sha))
        cat.present[cloud].discard(sha)
    # the manifests listed again right before collecting: an artifact stored meanwhile keeps its chunks
    kept = [Manifest.from_json(store.get(k)) for k in store.list(f"{cat.tenant}/artifacts") if k.endswith(".json")]
    freed = collect_garbage(store, cat.tenant, cat.indexes[cloud], kept)
    report = TransferReport()
    sources = [cat.stores[n] for n in nearest_first(fed, cloud, [n for n in cat.stores if n != cloud])]
    started = time.monotonic()
    for sha, _, _ in part.fetch:
        fetch(store, sources, cat.tenant, BlobRef(sha256=sha, size=cat.manifests[sha].size), report, rate,
              index=cat.indexes[cloud])
        cat.present[cloud].add(sha)
    return {"cloud": cloud, "evicted": [sha for sha, _ in part.evict], "freed_bytes": freed,
            "fetched": [sha for sha, _, _ in part.fetch], "seconds": time.monotonic() - started, **report.to_dict()}
