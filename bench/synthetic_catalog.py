"""A large, deterministic catalog (metadata only) to time ``choose_warm_sets`` at scale.

Timing the warm-set choice needs a catalog of the size it must handle (the
benchmark's default: 50,000 artifacts over 16 clouds), so one is generated
from a seed: skewed sizes and popularity, job history, partial holdings and
pins. Only the benchmark (``bench/preheat.py``) and the tests use it.
"""

from __future__ import annotations

import math
import random

from crosscloud.artifacts.distribution import DAY_S, KINDS, Artifact, Pin, Use, demand

SYNTHETIC_NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed so synthetic catalogs are reproducible


def synthetic_catalog(
    n_artifacts: int,
    n_clouds: int,
    total_bytes: int,
    seed: int,
    now: float = SYNTHETIC_NOW,
) -> tuple[dict[str, Artifact], dict[str, dict[str, int]], dict[str, int], dict[tuple[str, str], float], list[Pin]]:
    """A catalog to time ``choose_warm_sets``: same seed, same catalog.

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
    to ``choose_warm_sets``.
    """
    rng = random.Random(seed)
    names, artifacts = _artifacts(rng, n_artifacts, total_bytes)
    cum = _zipf_cum_weights(n_artifacts)
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
        jobs = _jobs(rng, cloud, (global_order, local_order), cum, jobs_per_cloud, now)
        uses += jobs
        held[cloud] = _held_as_lru(rng, jobs, artifacts, (global_order, local_order), cum, budgets[cloud], now)
        pins += _pins(rng, cloud, names, artifacts, budgets[cloud], now)
    return artifacts, held, budgets, demand(uses, now), pins


def _artifacts(rng: random.Random, n_artifacts: int, total_bytes: int) -> tuple[list[str], dict[str, Artifact]]:
    """Names (``<kind>-<index>``) and artifacts with log-normal sizes scaled to sum to ``total_bytes``."""
    lo, hi = 10e6, 100e9
    raw = [min(hi, max(lo, rng.lognormvariate(math.log(60e6), 1.6))) for _ in range(n_artifacts)]
    scale = total_bytes / sum(raw) if raw else 1.0
    names = [f"{kind}-{i:06d}" for i, kind in
             enumerate(rng.choices(KINDS, weights=(0.4, 0.3, 0.1, 0.2), k=n_artifacts))]
    return names, {n: Artifact(n, n.split("-")[0], max(1, int(s * scale))) for n, s in zip(names, raw)}


def _zipf_cum_weights(n: int) -> list[float]:
    """Cumulative Zipf-like weights (s = 0.9) over ranks 1..n, for ``random.choices(cum_weights=...)``."""
    cum, acc = [], 0.0
    for rank in range(1, n + 1):
        acc += rank ** -0.9
        cum.append(acc)
    return cum


def _jobs(rng: random.Random, cloud: str, orders: tuple[list[str], list[str]], cum: list[float],
          jobs_per_cloud: int, now: float) -> list[Use]:
    """One cloud's jobs, alternately by global and local popularity: 90 % past, 5 % planned, 5 % migration candidates."""
    global_order, local_order = orders
    n_artifacts = len(global_order)
    g = rng.choices(range(n_artifacts), cum_weights=cum, k=jobs_per_cloud * 3)
    lo_ = rng.choices(range(n_artifacts), cum_weights=cum, k=jobs_per_cloud * 3)
    uses: list[Use] = []
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
    return uses


def _held_as_lru(rng: random.Random, jobs: list[Use], artifacts: dict[str, Artifact],
                 orders: tuple[list[str], list[str]], cum: list[float], budget: int, now: float) -> dict[str, int]:
    """What an LRU cache would hold: the most recent past jobs' artifacts, one in four a stale pick instead.

    Filled to ~90 % of ``budget``; one in ten held artifacts is only partly there.
    """
    global_order, local_order = orders
    recent = sorted((u for u in jobs if u.at <= now), key=lambda u: -u.at)
    stale = rng.choices(range(len(global_order)), cum_weights=cum, k=len(jobs))
    has: dict[str, int] = {}
    room = int(budget * 0.9)
    for i, name in enumerate(n for u in recent for n in u.artifacts):
        if rng.random() < 0.25:
            name = (local_order if i % 2 else global_order)[stale[i % len(stale)]]
        size = artifacts[name].size
        if name in has or size > room:
            continue
        part = size if rng.random() > 0.1 else int(size * rng.uniform(0.05, 0.95))
        has[name] = part
        room -= part
    return has


def _pins(rng: random.Random, cloud: str, names: list[str], artifacts: dict[str, Artifact], budget: int,
          now: float) -> list[Pin]:
    """Up to eight pins on ``cloud`` within 10 % of its budget; one in three already expired."""
    pins: list[Pin] = []
    pin_room = budget // 10
    for _ in range(8):
        name = names[rng.randrange(len(names))]
        if artifacts[name].size > pin_room:
            continue
        pin_room -= artifacts[name].size
        expiry = now + rng.uniform(1, 14) * DAY_S if rng.random() > 1 / 3 else now - rng.uniform(1, 7) * DAY_S
        pins.append(Pin(name, cloud, expiry))
    return pins
