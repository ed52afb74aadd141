"""Which artifacts should be warm on which cloud: warm sets chosen under byte budgets.

A task migrates in seconds only if what it reads is already on the target
cloud, so models, datasets, images and checkpoints are placed *ahead* of jobs.
This module decides where, from metadata only (names, kinds, sizes, what each
cloud already holds, job history): no store access, no transfers, stdlib only,
so the same code runs in the DAG, in the benchmark and in tests.

- ``demand`` turns jobs (past runs, planned runs, migration candidates) into a
  probability-like score per (artifact, cloud) that a job there needs it.
- ``choose_warm_sets`` chooses, per cloud and under its byte budget, what to
  keep, fetch and evict: unexpired pins first, then the rest greedily by value
  density, where the value of having an artifact warm is the bytes a job would
  otherwise wait for (demand x missing bytes to fetch, demand x held bytes to
  keep). Held bytes count a little more (``stickiness``) so that the choice
  does not thrash when demand fluctuates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KINDS = ("model", "dataset", "image", "checkpoint")
DAY_S = 86400.0


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
    """Unexpired pins on a cloud need more bytes than its budget: no warm set can honour them."""

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
class CloudWarmSet:
    """One cloud's warm set: what to keep, fetch and evict. Evict first, then fetch: the budget then holds throughout.

    ``fetch``: (artifact, missing_bytes, score) in fetch order, pins first then
    by value density; score = demand x missing bytes (bytes a job would wait for).
    ``keep``: (artifact, bytes, score) fully present and chosen; score = demand x size.
    ``evict``: (artifact, bytes held) coldest first.
    ``used_bytes``: logical bytes of everything chosen, once the warm set is applied.
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
    def from_dict(cls, d: dict) -> CloudWarmSet:
        """The inverse of ``to_dict``: a stored warm set is carried out as it was shown."""
        return cls(
            cloud=d["cloud"], budget=d["budget"], used_bytes=d["used_bytes"], pinned=list(d["pinned"]),
            fetch=[(f["artifact"], f["missing_bytes"], f["score"]) for f in d["fetch"]],
            keep=[(k["artifact"], k["bytes"], k["score"]) for k in d["keep"]],
            evict=[(e["artifact"], e["bytes"]) for e in d["evict"]],
        )


@dataclass
class WarmSets:
    """Every cloud's warm set plus totals; ``fetch_bytes`` is what applying them moves over the network."""

    clouds: dict[str, CloudWarmSet]
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


def choose_warm_sets(
    artifacts: Mapping[str, Artifact],
    held: Mapping[str, Mapping[str, int]],
    budgets: Mapping[str, int],
    demand: Mapping[tuple[str, str], float],
    pins: Iterable[Pin],
    now: float,
    stickiness: float = 0.1,
) -> WarmSets:
    """Choose per cloud what to keep, fetch and evict so that likely-needed bytes are already there.

    Clouds decided are the keys of ``budgets`` (``held`` and pins of other
    clouds are ignored, so a run may decide a subset). ``held[cloud][artifact]``
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
    candidates = _candidates_by_cloud(artifacts, budgets, demand)
    pinned = _unexpired_pins(artifacts, budgets, pins, now)
    sizes = {name: a.size for name, a in artifacts.items()}
    clouds = {
        cloud: _choose_for_cloud(cloud, budget, sizes, held.get(cloud, {}), candidates[cloud], pinned[cloud], stickiness)
        for cloud, budget in budgets.items()
    }
    return WarmSets(clouds=clouds, now=now)


def _candidates_by_cloud(
    artifacts: Mapping[str, Artifact], budgets: Mapping[str, int], demand: Mapping[tuple[str, str], float],
) -> dict[str, list[tuple[str, float]]]:
    """(artifact, demand) per decided cloud, for catalog artifacts with demand > 0 there."""
    by_cloud: dict[str, list[tuple[str, float]]] = {c: [] for c in budgets}
    for (name, cloud), d in demand.items():
        if d > 0.0 and cloud in by_cloud and name in artifacts:
            by_cloud[cloud].append((name, d))
    return by_cloud


def _unexpired_pins(
    artifacts: Mapping[str, Artifact], budgets: Mapping[str, int], pins: Iterable[Pin], now: float,
) -> dict[str, set[str]]:
    """Artifacts pinned on each decided cloud past ``now``; a live pin on an artifact not in the catalog is an error."""
    active: dict[str, set[str]] = {c: set() for c in budgets}
    for pin in pins:
        if pin.cloud not in active or pin.expires_at <= now:
            continue
        if pin.artifact not in artifacts:
            raise ValueError(f"pin on cloud {pin.cloud!r} names {pin.artifact!r}, which is not in the catalog")
        active[pin.cloud].add(pin.artifact)
    return active


def _choose_for_cloud(
    cloud: str,
    budget: int,
    sizes: Mapping[str, int],
    has: Mapping[str, int],
    candidates: list[tuple[str, float]],
    pinned: set[str],
    stickiness: float,
) -> CloudWarmSet:
    """One cloud's warm set: its pins, then candidates densest first while they fit, then evictions."""
    if budget < 0:
        raise ValueError(f"cloud {cloud!r}: budget must be >= 0, got {budget}")
    scores = dict(candidates)
    ws = CloudWarmSet(cloud=cloud, budget=int(budget))
    chosen: set[str] = set()
    ws.pinned = sorted(pinned)
    pinned_bytes = sum(sizes[n] for n in ws.pinned)
    if pinned_bytes > budget:
        raise PinsOverBudget(cloud, ws.pinned, pinned_bytes, int(budget))
    for name in ws.pinned:
        _take(ws, chosen, name, sizes[name], has.get(name, 0), scores.get(name, 0.0))
    free = budget - ws.used_bytes
    for name in _by_density(candidates, chosen, sizes, has, stickiness):
        size = sizes[name]
        if size <= free:
            _take(ws, chosen, name, size, has.get(name, 0), scores[name])
            free -= size
    ws.evict = _evictions(has, chosen, scores)
    return ws


def _take(ws: CloudWarmSet, chosen: set[str], name: str, size: int, present: int, d: float) -> None:
    """Add ``name`` to ``ws``: kept if its ``size`` bytes are all present, else fetched for the missing ones."""
    present = min(size, max(0, present))
    if present < size:
        ws.fetch.append((name, size - present, d * (size - present)))
    else:
        ws.keep.append((name, size, d * size))
    ws.used_bytes += size
    chosen.add(name)


def _by_density(
    candidates: list[tuple[str, float]],
    chosen: set[str],
    sizes: Mapping[str, int],
    has: Mapping[str, int],
    stickiness: float,
) -> list[str]:
    """Candidates not yet chosen, densest value per budget byte first; ties: more already here, then by name.

    value / size = d * (missing + (1 + stickiness) * present) / size = d * (1 + stickiness * present / size).
    """
    ranked = []
    for name, d in candidates:
        if name in chosen:
            continue
        size = sizes[name]
        present = has.get(name, 0)
        if present > 0 and size > 0:
            present = min(size, present)
            ranked.append((-d * (1.0 + stickiness * present / size), -present, name))
        else:
            ranked.append((-d if size > 0 else -math.inf, 0, name))
    ranked.sort()
    return [name for _, _, name in ranked]


def _evictions(has: Mapping[str, int], chosen: set[str], scores: Mapping[str, float]) -> list[tuple[str, int]]:
    """(artifact, bytes held) of everything held but not chosen, coldest first, then largest, then by name."""
    gone = [(scores.get(n, 0.0), -b, n) for n, b in has.items() if b > 0 and n not in chosen]
    gone.sort()
    return [(n, -nb) for _, nb, n in gone]


def human_bytes(n: float) -> str:
    """Decimal units, as storage budgets are usually quoted."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"
