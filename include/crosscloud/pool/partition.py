"""Split an admitted job over its clouds: how much of the global batch, which shards.

Each chosen cloud gets a share of the global batch proportional to its
effective throughput (devices x relative speed for the model family), so that
all clouds finish an inner step - and so a round - at the same time. Data
shards follow the shares but never leave a jurisdiction their dataset is
resident in.
"""

from __future__ import annotations

from crosscloud.core.federation import Federation
from crosscloud.core.job import JobSpec
from crosscloud.pool.placement import Part, PlacementError
from crosscloud.run.plan import CloudAssignment


def apportion(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights``, each at least 1 (largest remainder)."""
    if total < len(weights):
        raise PlacementError(f"global_batch {total} is smaller than the {len(weights)} clouds chosen; raise global_batch")
    spare = total - len(weights)
    exact = [spare * w / sum(weights) for w in weights]
    parts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: exact[i] - parts[i], reverse=True)
    for i in by_remainder[: spare - sum(parts)]:
        parts[i] += 1
    return [p + 1 for p in parts]


def assign_shards(fed: Federation, dataset: str, n_shards: int, clouds: list[CloudAssignment]) -> dict[str, list[int]]:
    """Give every cloud shards in proportion to its share, within the dataset's residency."""
    ds = fed.dataset(dataset)
    eligible = [c for c in clouds if ds.residency is None or fed.cloud(c.name).jurisdiction == ds.residency]
    blocked = [c.name for c in clouds if c not in eligible]
    if blocked:
        raise PlacementError(
            f"dataset {ds.name} is resident in {ds.residency} and may not be sent to {blocked}; "
            f"choose clouds in {ds.residency} (job parameter clouds)"
        )
    if n_shards < len(eligible):
        raise PlacementError(f"dataset {ds.name} has {n_shards} shards for {len(eligible)} clouds; raise its shards")
    assigned: dict[str, list[int]] = {c.name: [] for c in eligible}
    share = {c.name: c.share for c in eligible}
    for shard in range(n_shards):
        # the cloud furthest below its fair part of the data takes the next shard
        name = min(assigned, key=lambda n: (len(assigned[n]) / share[n], n))
        assigned[name].append(shard)
    return assigned


def partition(fed: Federation, spec: JobSpec, family: str, parts: list[Part], n_shards: int) -> list[CloudAssignment]:
    """Turn admitted parts into sub-tasks: shares of the global batch by throughput, and data shards."""
    clouds = []
    for part in parts:
        cloud = fed.cloud(part.cloud)
        pool = next(p for p in cloud.pools if p.accelerator == part.accelerator)
        clouds.append(
            CloudAssignment(
                name=cloud.name, role=cloud.role, method=cloud.access.method, accelerator=pool.accelerator,
                devices=part.devices, throughput=part.devices * pool.throughput_for(family), share=0, shards=[],
                image=fed.image_for(pool.accelerator, family) or "",
            )
        )
    shares = apportion(spec.global_batch, [c.throughput for c in clouds])
    clouds = [c.model_copy(update={"share": s}) for c, s in zip(clouds, shares)]
    shards = assign_shards(fed, spec.dataset_name, n_shards, clouds)
    return [c.model_copy(update={"shards": shards[c.name]}) for c in clouds]


def rebalance_shares(shares: dict[str, int], step_s: dict[str, float], global_batch: int, tolerance: float = 0.05) -> dict[str, int]:
    """Shares for the next round from measured seconds per step, so that no cloud waits for another.

    A cloud's measured speed is the samples it trained per second; the new shares
    are proportional to it. Shares change only when that shortens the predicted
    round by more than ``tolerance``, so timing noise does not move data around.
    """
    names = sorted(shares)
    speed = [shares[n] / step_s[n] for n in names]
    proposed = dict(zip(names, apportion(global_batch, speed)))

    def round_time(s: dict[str, int]) -> float:
        return max(s[n] / v for n, v in zip(names, speed))

    return proposed if round_time(proposed) < (1 - tolerance) * round_time(shares) else dict(shares)
