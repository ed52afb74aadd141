"""
### Model distribution

Keeps the artifacts jobs are likely to need (models, checkpoints, dataset
shards) warm on the clouds where they will run, within each cloud's byte
budget, so a task that lands or migrates there starts at once.

1. **plan_distribution** reads the tenant's catalog (every artifact's manifest
   and every cloud's chunk index), the demand (each run's clouds and the
   artifacts they read, halving every `half_life_days`) and the pins, and
   chooses per cloud what to keep, fetch and evict: pins first, then by
   demand x the bytes a job would otherwise wait for. The artifacts given in
   the `artifacts` Param are pinned on the clouds for `pin_hours`. The plan is
   written to `<tenant>/distribution/<run>.json` in the local store and shown
   in the log.
2. **apply_distribution** (one mapped task per cloud) carries that plan out:
   evictions first (manifests, then packs no kept artifact uses), then
   fetches through the preheat path: only missing chunks, from the nearest
   cloud holding them, verified, capped at `link_share` of the cloud's link
   while runs train there.
3. **check_warm** reads every chunk of what each cloud holds and fails if
   anything is missing or corrupted.

Runs every six hours and on demand (Params: tenant, artifacts, clouds,
budget). One run at a time, so an eviction never races another.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task


@dag(
    dag_id="model_distribution",
    schedule=timedelta(hours=6),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["crosscloud", "preheat"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    params={
        "tenant": Param("team-a", type="string", description="Tenant whose artifacts are placed."),
        "artifacts": Param([], type="array", items={"type": "string"},
                           description="sha256 of artifacts to pin warm on the clouds (empty: none)."),
        "clouds": Param([], type="array", items={"type": "string"}, description="Clouds to plan (empty: all)."),
        "budget_gb": Param(50.0, type="number", exclusiveMinimum=0, description="Bytes each cloud may hold, in GB."),
        "pin_hours": Param(24.0, type="number", minimum=0, description="How long the given artifacts stay pinned."),
        "link_share": Param(0.5, type="number", exclusiveMinimum=0, maximum=1,
                            description="Share of a cloud's link preheating may use while runs train there."),
        "half_life_days": Param(7.0, type="number", exclusiveMinimum=0, description="Age at which a run's demand halves."),
    },
)
def model_distribution():
    @task
    def plan_distribution() -> list[dict]:
        import json

        from crosscloud.artifacts.catalog import choose_tenant_warm_sets
        from crosscloud.core.federation import load_federation
        from crosscloud.store.open_store import open_store
        from crosscloud_airflow.connections import use_airflow_connections

        use_airflow_connections()
        ctx = get_current_context()
        p, fed = ctx["params"], load_federation()
        clouds = p["clouds"] or [c.name for c in fed.clouds]
        _, result = choose_tenant_warm_sets(fed, p["tenant"], clouds, int(p["budget_gb"] * 1e9),
                                            p["half_life_days"] * 86400, p["artifacts"], p["pin_hours"] * 3600)
        print(result.format())
        key = f"{p['tenant']}/distribution/{ctx['run_id'].replace(':', '-').replace('+', '-')}.json"
        open_store(fed.local_cloud, p["tenant"]).put(key, json.dumps(result.to_dict(), indent=2).encode())
        return [{"cloud": c, "plan_key": key} for c in clouds]

    @task(max_active_tis_per_dagrun=2)
    def apply_distribution(cloud: str, plan_key: str) -> dict:
        import json

        from crosscloud.artifacts.catalog import apply, load_catalog, protective_cap
        from crosscloud.artifacts.distribution import CloudWarmSet
        from crosscloud.core.federation import load_federation
        from crosscloud.store.open_store import open_store
        from crosscloud_airflow.connections import use_airflow_connections

        use_airflow_connections()
        p, fed = get_current_context()["params"], load_federation()
        stored = json.loads(open_store(fed.local_cloud, p["tenant"]).get(plan_key))
        cat = load_catalog(fed, p["tenant"], list(stored["clouds"]))
        rate = protective_cap(fed, cloud, p["link_share"])
        # idempotent: a retry sends only what is still missing
        done = apply(fed, cat, CloudWarmSet.from_dict(stored["clouds"][cloud]), rate)
        print(f"{cloud}: evicted {len(done['evicted'])} ({done['freed_bytes']} bytes freed), fetched "
              f"{len(done['fetched'])} ({done['total_sent_bytes']} bytes sent, read from {done['read_from']})")
        return done

    @task
    def check_warm(applied: list[dict]) -> dict:
        from crosscloud.artifacts.catalog import load_catalog
        from crosscloud.core.federation import load_federation

        p, fed = get_current_context()["params"], load_federation()
        cat = load_catalog(fed, p["tenant"], [applied[i]["cloud"] for i in range(len(applied))])
        cold = {f"{cloud}/{sha[:12]}": f"{w.missing_bytes} bytes missing, {w.corrupt_chunks} corrupt chunk(s)"
                for cloud, shas in cat.present.items() for sha in shas
                if not (w := cat.warmth(sha, cloud, verify=True)).warm}
        if cold:
            raise RuntimeError(f"not warm after distribution: {cold}")
        return {cloud: len(shas) for cloud, shas in cat.present.items()}

    check_warm(apply_distribution.expand_kwargs(plan_distribution()))


model_distribution()
