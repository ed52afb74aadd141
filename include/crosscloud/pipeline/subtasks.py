"""A run's sub-tasks: what each runs, starting it once its cloud is warm, finding, stopping and watching them.

Light on purpose (no torch, no MLflow): Airflow's triggerer builds the watcher from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from crosscloud.backends import Handle, SubTaskError, SubTaskSpec, get_backend
from crosscloud.core.federation import Federation
from crosscloud.ledger import Ledger, lease_seconds
from crosscloud.run import heartbeat
from crosscloud.run.plan import Plan
from crosscloud.run.ref import RunRef
from crosscloud.scheduler.service import Queue
from crosscloud.store.chunks import ChunkIndex, warmth
from crosscloud.store.credentials import credentials_env
from crosscloud.store.network import nearest_first, network, store_seen_from
from crosscloud.store.open_store import open_store
from crosscloud.training.watcher import Watcher


def subtask_spec(plan: Plan, cloud: str, env: dict[str, str] | None = None, access: dict | None = None) -> SubTaskSpec:
    """What the sub-task of ``cloud`` runs, whatever backend starts it; ``env`` carries its credentials."""
    me = plan.cloud(cloud)
    args = ["--tenant", plan.tenant, "--run-id", plan.run_id, "--cloud", cloud, "--federation", plan.federation_path]
    return SubTaskSpec(
        tenant=plan.tenant, run_id=plan.run_id, cloud=cloud, image=me.image, accelerator=me.accelerator,
        devices=me.devices, args=args, env=env or {}, access=access or {}, retries=plan.spec.subtask_retries,
        peers=[c.name for c in plan.clouds if c.name != cloud],
    )


def check_warm(fed: Federation, plan: Plan, cloud: str) -> None:
    """Refuse to start a sub-task whose inputs are not all on its cloud, saying what is missing and for how long."""
    store = open_store(fed.cloud(cloud), plan.tenant)
    index = ChunkIndex(store, plan.tenant)
    missing = sum(warmth(store, plan.tenant, r, index=index).missing_bytes for r in plan.needs(cloud))
    if missing:
        src = nearest_first(fed, cloud, [fed.dataset(plan.dataset).home, fed.local_cloud.name])[0]
        eta = network(fed)(src, cloud, missing)
        raise SubTaskError(
            f"cloud {cloud} is not warm for run {plan.run_id}: {missing / 2**20:.1f} MiB of its shards and model are "
            f"missing, about {eta:.0f} s from {src}; run the preheat task again"
        )


def dispatch_stage(ref: RunRef, cloud: str) -> Handle:
    """Start one cloud's sub-task, once its inputs are there, and return at once with its handle."""
    fed, plan = ref.load()
    check_warm(fed, plan, cloud)
    access = fed.cloud(cloud).access
    # it reads its peers' deltas, and the round records in the home store
    env = {k: v for name in plan.store_clouds for k, v in credentials_env(fed.cloud(name), plan.tenant).items()}
    spec = subtask_spec(plan, cloud, env=env, access=access.model_dump())
    if Ledger().renew(plan.tenant, plan.run_id):  # the sub-task starts under a live lease, and knows when it ends
        heartbeat.write([open_store(fed.cloud(cloud), plan.tenant)], plan.keys, time.time() + lease_seconds())
    return get_backend(access.method).start(spec)


def run_handles(ref: RunRef) -> list[Handle]:
    """Handles of every sub-task the run started, found through each cloud's backend."""
    fed, plan = ref.load()
    found = (get_backend(c.method).find(plan.tenant, plan.run_id, c.name, fed.cloud(c.name).access.model_dump())
             for c in plan.clouds)
    return [h for h in found if h is not None]


def stop_run(ref: RunRef, handles: list[Handle]) -> None:
    """Tell every sub-task to stop (a STOP marker in each store) and stop the ones still running."""
    fed, plan = ref.load()
    for cloud in plan.clouds:
        open_store(fed.cloud(cloud.name), plan.tenant).put(plan.keys.stop, b"stopped by crosscloud\n")
    for handle in handles:
        get_backend(handle["backend"]).stop(handle)


def watcher(ref: RunRef, handles: list[Handle], log: Callable[[str], None] = print, since: float | None = None) -> Watcher:
    """The run's watcher, as the home cloud's host reaches the clouds' stores; a dead sub-task is dispatched again.

    ``since``: when the watch last saw progress, carried over from an earlier watcher of the same run.
    """
    fed, plan = ref.load()
    stores = {name: store_seen_from(fed, name, plan.coordinator_cloud, plan.tenant) for name in plan.store_clouds}
    ledger = Ledger()
    return Watcher(plan, stores, handles, log=log, restart=lambda cloud: dispatch_stage(ref, cloud), ledger=ledger,
                   since=since, queue=Queue(fed, ledger))
