"""Which artifacts should be warm on which cloud: a distribution plan under byte budgets.

A task migrates in seconds only if what it reads is already on the target
cloud, so models, datasets, images and checkpoints are placed *ahead* of jobs.
This module decides where, from metadata only (names, kinds, sizes, what each
cloud already holds, job history): no store access, no transfers, stdlib only,
so the same code runs in the DAG, in the benchmark and in tests.

- ``demand`` turns jobs (past runs, planned runs, migration candidates) into a
  probability-like score per (artifact, cloud) that a job there needs it.
- ``plan`` chooses, per cloud and under its byte budget, what to keep, fetch
  and evict: unexpired pins first, then the rest greedily by value density,
  where the value of having an artifact warm is the bytes a job would otherwise
  wait for (demand x missing bytes to fetch, demand x held bytes to keep).
  Held bytes count a little more (``stickiness``) so that plans do not thrash
  when demand fluctuates.
- ``synthetic_catalog`` builds a large, deterministic, realistically skewed
  catalog to time ``plan`` at the issue's scale (50,000 artifacts, 16 clouds).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KINDS = ("model", "dataset", "image", "checkpoint")
DAY_S = 86400.0
SYNTHETIC_NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed so synthetic catalogs are reproducible


@dataclass(frozen=True)
class Artifact:
    """One catalog entry; ``size`` is its logical bytes (what a job reads)."""

    name: str
    kind: str  # "model" | "dataset" | "image" | "checkpoint"
    size: int


@dataclass(frozen=True)
class Pin:
    """Keep ``artifact`` warm on ``cloud`` until ``expires_at`` (epoch s), whatever its demand.

    An operator's answer to "how long is preheated data kept": exactly until
    the pin expires, then like any other artifact by its demand.
    """

    artifact: str
    cloud: str
    expires_at: float


@dataclass(frozen=True)
class Use:
    """One job on ``cloud`` reading ``artifacts``, at ``at`` (epoch s; future for planned runs).

    ``weight`` is how sure we are the job happens there: 1 for past and planned
    runs, < 1 for a migration candidate (a running job's artifacts on a cloud
    it could move to for demand response).
    """

    cloud: str
    artifacts: tuple[str, ...]
    at: float
    weight: float = 1.0


class PinsOverBudget(ValueError):
    """Unexpired pins on a cloud need more bytes than its budget: no plan can honour them."""

    def __init__(self, cloud: str, pins: list[str], pinned_bytes: int, budget: int):
        self.cloud, self.pins, self.pinned_bytes, self.budget = cloud, pins, pinned_bytes, budget
        shown = ", ".join(pins[:10]) + (f", ... ({len(pins)} pins)" if len(pins) > 10 else "")
        super().__init__(
            f"cloud {cloud!r}: unexpired pins need {pinned_bytes} bytes ({human_bytes(pinned_bytes)}) "
            f"but its budget is {budget} bytes ({human_bytes(budget)}); pins: {shown}"
        )


def demand(uses: Iterable[Use], now: float, half_life_s: float = 7 * DAY_S) -> dict[tuple[str, str], float]:
    """Score in [0, 1] per (artifact, cloud): how likely a job on that cloud needs the artifact.

    Each use is an independent piece of evidence with probability
    ``p = weight * 0.5 ** (age / half_life_s)`` (age clamped at 0, so planned
    future runs count fully); the score is ``1 - prod(1 - p)`` over the uses
    that read the artifact on the cloud. So it grows with every use, decays
    with age (an unused artifact cools down and eventually gets evicted), and
    one certain use (p = 1) makes it 1. Only pairs with a use appear (sparse).
    """
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
    miss: dict[tuple[str, str], float] = {}  # product of (1 - p): probability no use needs it
    for use in uses:
        age = max(0.0, now - use.at)
        p = min(1.0, max(0.0, use.weight)) * 0.5 ** (age / half_life_s)
        if p <= 0.0:
            continue
        for name in dict.fromkeys(use.artifacts):  # an artifact read twice by one job is one use
            key = (name, use.cloud)
            miss[key] = miss.get(key, 1.0) * (1.0 - p)
    return {key: 1.0 - m for key, m in miss.items()}


@dataclass
class CloudPlan:
    """One cloud's part of a plan. Evict first, then fetch: the budget then holds throughout.

    ``fetch``: (artifact, missing_bytes, score) in fetch order, pins first then
    by value density; score = demand x missing bytes (bytes a job would wait for).
    ``keep``: (artifact, bytes, score) fully present and chosen; score = demand x size.
    ``evict``: (artifact, bytes held) coldest first.
    ``used_bytes``: logical bytes of everything chosen, once the plan is applied.
    """

    cloud: str
    budget: int
    used_bytes: int = 0
    pinned: list[str] = field(default_factory=list)
    fetch: list[tuple[str, int, float]] = field(default_factory=list)
    keep: list[tuple[str, int, float]] = field(default_factory=list)
    evict: list[tuple[str, int]] = field(default_factory=list)

    @property
    def fetch_bytes(self) -> int:
        return sum(b for _, b, _ in self.fetch)

    @property
    def keep_bytes(self) -> int:
        return sum(b for _, b, _ in self.keep)

    @property
    def evict_bytes(self) -> int:
        return sum(b for _, b in self.evict)

    def to_dict(self) -> dict:
        return {
            "cloud": self.cloud,
            "budget": self.budget,
            "used_bytes": self.used_bytes,
            "pinned": list(self.pinned),
            "fetch": [{"artifact": a, "missing_bytes": b, "score": s} for a, b, s in self.fetch],
            "keep": [{"artifact": a, "bytes": b, "score": s} for a, b, s in self.keep],
            "evict": [{"artifact": a, "bytes": b} for a, b in self.evict],
            "fetch_bytes": self.fetch_bytes,
            "keep_bytes": self.keep_bytes,
            "evict_bytes": self.evict_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict) -> CloudPlan:
        """The inverse of ``to_dict``: a stored plan is carried out as it was shown."""
        return cls(
            cloud=d["cloud"], budget=d["budget"], used_bytes=d["used_bytes"], pinned=list(d["pinned"]),
            fetch=[(f["artifact"], f["missing_bytes"], f["score"]) for f in d["fetch"]],
            keep=[(k["artifact"], k["bytes"], k["score"]) for k in d["keep"]],
            evict=[(e["artifact"], e["bytes"]) for e in d["evict"]],
        )


@dataclass
class DistributionPlan:
    """Per-cloud plans plus totals; ``fetch_bytes`` is what the plan will move over the network."""

    clouds: dict[str, CloudPlan]
    now: float

    @property
    def fetch_bytes(self) -> int:
        return sum(c.fetch_bytes for c in self.clouds.values())

    @property
    def evict_bytes(self) -> int:
        return sum(c.evict_bytes for c in self.clouds.values())

    @property
    def used_bytes(self) -> int:
        return sum(c.used_bytes for c in self.clouds.values())

    def to_dict(self) -> dict:
        return {
            "now": self.now,
            "clouds": {name: c.to_dict() for name, c in self.clouds.items()},
            "totals": {
                "fetch_bytes": self.fetch_bytes,
                "evict_bytes": self.evict_bytes,
                "used_bytes": self.used_bytes,
                "budget": sum(c.budget for c in self.clouds.values()),
            },
        }

    def format(self) -> str:
        """A readable table: one row per cloud, then the totals."""
        head = ("cloud", "budget", "used", "pinned", "keep", "fetch", "evict")
        rows = [head]
        for c in self.clouds.values():
            rows.append((
                c.cloud,
                human_bytes(c.budget),
                f"{human_bytes(c.used_bytes)} ({100 * c.used_bytes / c.budget:.0f}%)" if c.budget else human_bytes(0),
                str(len(c.pinned)),
                f"{len(c.keep)} / {human_bytes(c.keep_bytes)}",
                f"{len(c.fetch)} / {human_bytes(c.fetch_bytes)}",
                f"{len(c.evict)} / {human_bytes(c.evict_bytes)}",
            ))
        budget = sum(c.budget for c in self.clouds.values())
        rows.append((
            "total",
            human_bytes(budget),
            human_bytes(self.used_bytes),
            str(sum(len(c.pinned) for c in self.clouds.values())),
            f"{sum(len(c.keep) for c in self.clouds.values())} / "
            f"{human_bytes(sum(c.keep_bytes for c in self.clouds.values()))}",
            f"{sum(len(c.fetch) for c in self.clouds.values())} / {human_bytes(self.fetch_bytes)}",
            f"{sum(len(c.evict) for c in self.clouds.values())} / {human_bytes(self.evict_bytes)}",
        ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def plan(
    artifacts: Mapping[str, Artifact],
    held: Mapping[str, Mapping[str, int]],
    budgets: Mapping[str, int],
    demand: Mapping[tuple[str, str], float],
    pins: Iterable[Pin],
    now: float,
    stickiness: float = 0.1,
) -> DistributionPlan:
    """Choose per cloud what to keep, fetch and evict so that likely-needed bytes are already there.

    Clouds planned are the keys of ``budgets`` (``held`` and pins of other
    clouds are ignored, so a run may plan a subset). ``held[cloud][artifact]``
    is the bytes of it already present (partial holdings count; chunks shared
    with other artifacts are the transfer layer's business, not the budget's).
    Per cloud:

    1. Unexpired pins (``expires_at > now``) are chosen first, whatever their
       demand; if they alone exceed the budget, ``PinsOverBudget`` names the
       cloud, the pins and the bytes. Expired pins are ignored.
    2. Every other artifact with demand > 0 there is a candidate costing its
       full ``size`` of budget, worth ``d * (missing + (1 + stickiness) * held)``:
       the bytes a job would wait for if it were not warm, held bytes weighted up
       a little so a missing artifact must be clearly hotter to displace a held
       one (no thrashing; at equal demand the held one always wins). Candidates
       are taken greedily by value per budget byte, skipping any that no longer fit.
    3. Everything held but not chosen (cold, unknown to the catalog, or
       displaced) is evicted, coldest first.
    """
    if stickiness < 0:
        raise ValueError(f"stickiness must be >= 0, got {stickiness}")
    by_cloud: dict[str, list[tuple[str, float]]] = {c: [] for c in budgets}
    for (name, cloud), d in demand.items():
        if d > 0.0 and cloud in by_cloud and name in artifacts:
            by_cloud[cloud].append((name, d))
    active: dict[str, dict[str, float]] = {c: {} for c in budgets}  # cloud -> pinned artifact -> latest expiry
    for pin in pins:
        if pin.cloud not in active or pin.expires_at <= now:
            continue
        if pin.artifact not in artifacts:
            raise ValueError(f"pin on cloud {pin.cloud!r} names {pin.artifact!r}, which is not in the catalog")
        prev = active[pin.cloud].get(pin.artifact)
        active[pin.cloud][pin.artifact] = pin.expires_at if prev is None else max(prev, pin.expires_at)

    sizes = {name: a.size for name, a in artifacts.items()}
    out: dict[str, CloudPlan] = {}
    for cloud, budget in budgets.items():
        if budget < 0:
            raise ValueError(f"cloud {cloud!r}: budget must be >= 0, got {budget}")
        has = held.get(cloud, {})
        scores = dict(by_cloud[cloud])
        cp = CloudPlan(cloud=cloud, budget=int(budget))
        chosen: set[str] = set()

        def take(name: str) -> None:
            size = artifacts[name].size
            present = min(size, max(0, has.get(name, 0)))
            d = scores.get(name, 0.0)
            if present < size:
                cp.fetch.append((name, size - present, d * (size - present)))
            else:
                cp.keep.append((name, size, d * size))
            cp.used_bytes += size
            chosen.add(name)

        pinned = sorted(active[cloud])
        pinned_bytes = sum(artifacts[n].size for n in pinned)
        if pinned_bytes > budget:
            raise PinsOverBudget(cloud, pinned, pinned_bytes, int(budget))
        for name in pinned:
            take(name)
        cp.pinned = pinned

        # value / size = d * (missing + (1 + stickiness) * present) / size = d * (1 + stickiness * present / size)
        ranked = []
        for name, d in by_cloud[cloud]:
            if name in chosen:
                continue
            size = sizes[name]
            present = has.get(name, 0)
            if present > 0 and size > 0:
                present = min(size, present)
                ranked.append((-d * (1.0 + stickiness * present / size), -present, name))
            else:
                ranked.append((-d if size > 0 else -math.inf, 0, name))
        ranked.sort()  # densest first; ties: more already here first, then by name
        free = budget - cp.used_bytes
        for _, _, name in ranked:
            if sizes[name] <= free:
                take(name)
                free -= sizes[name]

        gone = [(scores.get(n, 0.0), -b, n) for n, b in has.items() if b > 0 and n not in chosen]
        gone.sort()
        cp.evict = [(n, -nb) for _, nb, n in gone]
        out[cloud] = cp
    return DistributionPlan(clouds=out, now=now)


def synthetic_catalog(
    n_artifacts: int,
    n_clouds: int,
    total_bytes: int,
    seed: int,
    now: float = SYNTHETIC_NOW,
) -> tuple[dict[str, Artifact], dict[str, dict[str, int]], dict[str, int], dict[tuple[str, str], float], list[Pin]]:
    """A large, deterministic catalog (metadata only) to time ``plan``: same seed, same catalog.

    Sizes are log-normal (median ~60 MB), clipped to 10 MB..100 GB, then
    scaled so they sum to ``total_bytes``. Popularity is Zipf-like (s = 0.9)
    with half of each cloud's jobs drawn from a global ranking and half from
    its own, so clouds share hits but differ. Demand comes from ``demand()``
    over ~30 days of synthetic jobs (n_artifacts / 4 per cloud) plus a few
    planned runs and migration candidates (sparse: only artifacts some job
    read on that cloud). Budgets are 4-12 % of the catalog per cloud; each
    cloud already holds ~90 % of its budget as an LRU cache would (recent
    jobs' artifacts, a quarter stale picks), one in ten held artifacts only
    partly; a few pins per cloud, some already expired. Pass the same ``now``
    to ``plan``.
    """
    rng = random.Random(seed)
    lo, hi = 10e6, 100e9
    raw = [min(hi, max(lo, rng.lognormvariate(math.log(60e6), 1.6))) for _ in range(n_artifacts)]
    scale = total_bytes / sum(raw) if raw else 1.0
    names = [f"{kind}-{i:06d}" for i, kind in
             enumerate(rng.choices(KINDS, weights=(0.4, 0.3, 0.1, 0.2), k=n_artifacts))]
    artifacts = {n: Artifact(n, n.split("-")[0], max(1, int(s * scale))) for n, s in zip(names, raw)}

    cum, acc = [], 0.0
    for rank in range(1, n_artifacts + 1):
        acc += rank ** -0.9
        cum.append(acc)
    global_order = names[:]
    rng.shuffle(global_order)
    clouds = [f"cloud-{c:02d}" for c in range(n_clouds)]
    budgets = {c: int(total_bytes * rng.uniform(0.04, 0.12)) for c in clouds}

    uses: list[Use] = []
    held: dict[str, dict[str, int]] = {}
    pins: list[Pin] = []
    jobs_per_cloud = max(1000, n_artifacts // 4)
    for cloud in clouds:
        local_order = names[:]
        rng.shuffle(local_order)
        g = rng.choices(range(n_artifacts), cum_weights=cum, k=jobs_per_cloud * 3)
        lo_ = rng.choices(range(n_artifacts), cum_weights=cum, k=jobs_per_cloud * 3)
        for j in range(jobs_per_cloud):
            order = global_order if j % 2 == 0 else local_order
            picks = g if j % 2 == 0 else lo_
            k = rng.randint(1, 3)
            arts = tuple(order[picks[3 * j + i]] for i in range(k))
            if j < jobs_per_cloud * 0.9:
                uses.append(Use(cloud, arts, now - rng.uniform(0, 30 * DAY_S)))
            elif j < jobs_per_cloud * 0.95:
                uses.append(Use(cloud, arts, now + rng.uniform(0, 3 * DAY_S)))  # planned runs
            else:
                uses.append(Use(cloud, arts, now, weight=rng.uniform(0.1, 0.5)))  # migration candidates
        # What is already there: what an LRU cache would hold (the most recent past jobs'
        # artifacts), one in four picks a stale one instead, until ~90 % of the budget.
        recent = sorted((u for u in uses[-jobs_per_cloud:] if u.at <= now), key=lambda u: -u.at)
        stale = rng.choices(range(n_artifacts), cum_weights=cum, k=jobs_per_cloud)
        has: dict[str, int] = {}
        room = int(budgets[cloud] * 0.9)
        for i, name in enumerate(n for u in recent for n in u.artifacts):
            if rng.random() < 0.25:
                name = (local_order if i % 2 else global_order)[stale[i % len(stale)]]
            size = artifacts[name].size
            if name in has or size > room:
                continue
            part = size if rng.random() > 0.1 else int(size * rng.uniform(0.05, 0.95))
            has[name] = part
            room -= part
        held[cloud] = has
        # Pins: a few artifacts, within 10 % of the budget; one in three already expired.
        pin_room = budgets[cloud] // 10
        for _ in range(8):
            name = names[rng.randrange(n_artifacts)]
            if artifacts[name].size > pin_room:
                continue
            pin_room -= artifacts[name].size
            expiry = now + rng.uniform(1, 14) * DAY_S if rng.random() > 1 / 3 else now - rng.uniform(1, 7) * DAY_S
            pins.append(Pin(name, cloud, expiry))
    return artifacts, held, budgets, demand(uses, now), pins


def human_bytes(n: float) -> str:
    """Decimal units, as storage budgets are usually quoted."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"
