"""
### Cross-cloud training

One training job split over several sovereign clouds that train together.

1. **partition** chooses the clouds (tenant quota, adapted images, free devices),
   gives each a share of the global batch proportional to its effective
   throughput and assigns data shards within their jurisdictions. The plan is
   written to the run's `plan.json` in the local cloud's store.
2. **preheat** copies the initial checkpoint and each cloud's shards into that
   cloud's store, content-addressed: bytes already there are never sent again.
3. **dispatch_local** (one mapped task per cloud) starts each sub-task and
   returns at once; sub-tasks train H inner steps per round and commit their
   pseudo-gradients to their own store.
4. **sync_checkpoints** combines each round's pseudo-gradients (DiLoCo outer
   Nesterov step), publishes the global checkpoint to every cloud and relays
   the sub-tasks' logs. A retried coordinator resumes after the last
   committed round.
5. **aggregate** writes and evaluates the final model, measures the
   iteration-time gap against the single-cluster baseline and closes the
   MLflow runs. **cleanup** (a teardown) stops any sub-task still running,
   whatever happened.

Trigger with `mode = single_cluster` to record a baseline on one cloud.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task
from crosscloud.job import MODES, JobSpec
from crosscloud.presets import PRESETS
from crosscloud_airflow.operators import LocalSubTaskOperator, SyncCheckpointsOperator, run_ref

DAG_ID = "cross_cloud_training"
JOB = JobSpec()  # the Params' defaults are the engine's, so the DAG runs what benchmarks measure


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    doc_md=__doc__,
    tags=["crosscloud", "training"],
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={
        "tenant": Param(JOB.tenant, type="string", description="Tenant the job runs for (quota, storage prefix)."),
        "clouds": Param(
            JOB.clouds, type="array", items={"type": "string"},
            description="Clouds to use; empty means every active cloud the tenant has quota on.",
        ),
        "rounds": Param(JOB.rounds, type="integer", minimum=1, maximum=1000, description="Outer rounds (global syncs)."),
        "inner_steps": Param(JOB.inner_steps, type="integer", minimum=1, maximum=10000, description="Inner steps per round (H)."),
        "model_size": Param(JOB.model_size, enum=sorted(PRESETS, key=lambda n: PRESETS[n].d_model), description="Model preset."),
        "global_batch": Param(JOB.global_batch, type="integer", minimum=1, description="Sequences per inner step over all clouds."),
        "devices_per_cloud": Param(JOB.devices_per_cloud, type="integer", minimum=1, description="Devices each cloud's sub-task uses."),
        "dataset": Param(JOB.dataset, type="string", description="Dataset of the federation to train on."),
        "seed": Param(JOB.seed, type="integer", minimum=0, description="Seed of data selection, init and sampling."),
        "mode": Param(
            JOB.mode, enum=list(MODES), description="single_cluster runs the same job on one cloud: the baseline.",
        ),
        "inner_lr": Param(JOB.inner_lr, type="number", exclusiveMinimum=0, description="AdamW learning rate."),
        "outer_lr": Param(JOB.outer_lr, type="number", exclusiveMinimum=0, description="Outer Nesterov SGD learning rate."),
        "outer_momentum": Param(JOB.outer_momentum, type="number", minimum=0, exclusiveMaximum=1, description="Outer momentum."),
        "round_timeout_s": Param(JOB.round_timeout_s, type="number", exclusiveMinimum=0, description="Longest wait for a round."),
        "overlap": Param(JOB.overlap, type="boolean", description="Exchange round r while round r + 1 computes."),
        "compression": Param(JOB.compression, enum=["int8", "none"], description="How pseudo-gradients travel."),
        "adapt_shares": Param(JOB.adapt_shares, type="boolean", description="Move batch shares towards faster clouds between rounds."),
    },
)
def cross_cloud_training():
    @task
    def partition() -> dict:
        from crosscloud.pipeline import partition_stage
        from crosscloud_airflow.connections import use_airflow_connections

        use_airflow_connections()
        ctx = get_current_context()
        spec = JobSpec.from_params(dict(ctx["params"]))
        ref = partition_stage(spec, ctx["run_id"], experiment=DAG_ID, tags={"airflow.dag_id": DAG_ID, "airflow.run_id": ctx["run_id"]})
        _, plan = ref.load()
        for c in plan.candidates:
            print(f"placement {c.cloud}: {'chosen' if c.chosen else 'rejected'} - {c.reason}")
        for c in plan.clouds:
            print(f"cloud {c.name}: share {c.share}/{spec.global_batch}, shards {c.shards}, {c.devices} x {c.accelerator}")
        return ref.to_dict()

    @task
    def preheat(run: dict) -> dict:
        from crosscloud.pipeline import preheat_stage

        report = preheat_stage(run_ref(run))
        print(f"preheat: sent {report['total_sent_bytes']} bytes, skipped {report['total_skipped_bytes']} already present")
        return report

    @task
    def clouds_of(run: dict, method: str) -> list[str]:
        """The plan's clouds reached by ``method``: what that dispatch task maps over."""
        _, plan = run_ref(run).load()
        return [c.name for c in plan.clouds if c.method == method]

    @task
    def aggregate(run: dict, handles: list[dict]) -> dict:
        from crosscloud.pipeline import aggregate_stage

        summary = aggregate_stage(run_ref(run), [handles[i] for i in range(len(handles))], experiment=DAG_ID)
        print(f"eval loss {summary['metrics']['eval_loss_start']:.4f} -> {summary['metrics']['final_eval_loss']:.4f}")
        return summary["metrics"]

    @task(trigger_rule="all_done")
    def cleanup(run: dict) -> None:
        """Stop every sub-task of the run still alive, whatever the other tasks did."""
        from crosscloud.pipeline import run_handles, stop_run

        ref = run_ref(run)
        stop_run(ref, run_handles(ref))

    run = partition()
    preheated = preheat(run)
    local_clouds = clouds_of(run, "local")
    preheated >> local_clouds
    dispatch_local = LocalSubTaskOperator.partial(task_id="dispatch_local", run=run).expand(cloud=local_clouds)
    synced = SyncCheckpointsOperator(task_id="sync_checkpoints", run=run, handles=dispatch_local.output)
    done = aggregate(run, dispatch_local.output)
    synced >> done
    done >> cleanup(run).as_teardown(setups=dispatch_local)


cross_cloud_training()
