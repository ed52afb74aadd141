"""The ``cross_cloud_training`` DAG, built once for every tenant or once per tenant (Airflow's multi-team mode).

One DAG shared by every tenant (the tenant a Param) suits a deployment whose
users may see each other's runs. In multi-team mode a DAG belongs to the team
owning its bundle, and Airflow's own views (grid, run conf, task logs, XCom)
show a run only to that team and admins, so each tenant gets its own
``cross_cloud_training__<tenant>`` in a bundle its team owns
(``crosscloud-airflow tenant-bundles``), its tenant fixed, and the shared one is
not defined: a DAG of no team is readable by every user.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task

from crosscloud.core.job import LR_SCALINGS, MODES, PLACEMENTS, JobSpec
from crosscloud.core.presets import PRESETS
from crosscloud_airflow.operators import AdmitOperator, run_ref
from crosscloud_airflow.training import train_after

DAG_ID = "cross_cloud_training"
JOB = JobSpec()  # the Params' defaults are the engine's, so the DAG runs what benchmarks measure
DOC = """
### Cross-cloud training

One training job split over several sovereign clouds that train together.

1. **admit** enters the run in the federation's one queue and waits for a
   scheduling pass's decision, deferred (no worker slot held; its log says
   its position, expected start and reason). Passes order the queue by
   `priority`, the tenant's fair share, then age; a run that cannot start
   reserves the devices it waits for, and later runs only backfill around
   it. Placement applies the hard constraints (tenant quota, adapted images,
   residency, draining or unjoined clouds), then with `placement = spread`
   takes every eligible cloud, with `placement = auto` the cloud or split
   that finishes soonest for its cost and the network's balance: a job is
   forwarded to another cloud with its data. Once started, it gives each cloud a share of the global
   batch proportional to its effective throughput and data shards within
   their jurisdictions, and writes the plan, with every cloud's verdict, to
   the run's `plan.json` and to MLflow.
2. **preheat** copies the initial checkpoint and each cloud's shards into that
   cloud's store, content-addressed: bytes already there are never sent again.
3. **dispatch_local**, **dispatch_kubernetes**, **dispatch_ssh** (one mapped
   task per cloud of that access method; skipped when no cloud uses it) start
   each sub-task and return at once; sub-tasks train H inner steps per round
   and commit their pseudo-gradients to their own store; then each cloud
   reduces the round itself (DiLoCo outer Nesterov step) from the deltas of
   the round's members and commits the same global. **await_kubernetes**
   waits, deferred, for each Kubernetes Job to end and puts its pods' logs in
   its task log.
4. **sync_checkpoints** watches, deferred: the triggerer waits on the rounds
   the clouds commit (no worker slot held, no tensor loaded); for each one a
   worker, for a moment, records it in the run's history and in MLflow,
   restarts a sub-task that died and relays the sub-tasks' logs. An MLflow or
   store outage is retried and never fatal; a failed, retried or restarted
   watch never stops training: it picks up after the last recorded round.
5. **aggregate** writes and evaluates the final model, measures the
   iteration-time gap against the single-cluster baseline and closes the
   MLflow runs. **cleanup** (a teardown) stops any sub-task still running and
   releases the run's reservation, whatever happened: stopping a failed or
   killed run is its alone.

Trigger with `mode = single_cluster` to record a baseline on one cloud.
"""


def multi_team() -> bool:
    """Whether Airflow runs in multi-team mode, where the shared DAG would show every tenant's runs to everyone."""
    from airflow.configuration import conf

    return conf.getboolean("core", "multi_team", fallback=False)


def tenant_dag_id(tenant: str) -> str:
    return f"{DAG_ID}__{tenant}"


def _params(tenant: str | None) -> dict:
    """Every job parameter; a tenant's own DAG accepts only its tenant."""
    tenant_param = (Param(JOB.tenant, type="string", description="Tenant the job runs for (quota, storage prefix).")
                    if tenant is None else
                    Param(tenant, type="string", enum=[tenant], description="This DAG's tenant (its team's bundle)."))
    return {
            "tenant": tenant_param,
            "clouds": Param(
                JOB.clouds, type="array", items={"type": "string"},
                description="Clouds to use; empty means every active cloud the tenant has quota on.",
            ),
            "rounds": Param(JOB.rounds, type="integer", minimum=1, maximum=1000, description="Outer rounds (global syncs)."),
            "inner_steps": Param(JOB.inner_steps, type="integer", minimum=1, maximum=10000, description="Inner steps per round (H)."),
            "model_size": Param(JOB.model_size, enum=sorted(PRESETS, key=lambda n: PRESETS[n].d_model), description="Model preset."),
            "global_batch": Param(JOB.global_batch, type="integer", minimum=1, description="Sequences per inner step over all clouds."),
            "devices_per_cloud": Param(JOB.devices_per_cloud, type="integer", minimum=1, description="Devices each cloud's sub-task uses (placement spread, single_cluster)."),
            "placement": Param(
                JOB.placement, enum=list(PLACEMENTS),
                description="spread: every eligible cloud trains; auto: crosscloud chooses one cloud or a split for `devices`.",
            ),
            "devices": Param(JOB.devices, type="integer", minimum=1, description="Devices in all (placement auto)."),
            "dataset": Param(JOB.dataset, type="string", description="Dataset of the federation to train on."),
            "seed": Param(JOB.seed, type="integer", minimum=0, description="Seed of data selection, init and sampling."),
            "mode": Param(
                JOB.mode, enum=list(MODES), description="single_cluster runs the same job on one cloud: the baseline.",
            ),
            "inner_lr": Param(JOB.inner_lr, type="number", exclusiveMinimum=0, description="AdamW learning rate for the global batch."),
            "local_lr_scaling": Param(
                JOB.local_lr_scaling, enum=list(LR_SCALINGS),
                description="A cloud's AdamW lr is inner_lr x (global_batch / its share) ** (0, 1/2 or 1).",
            ),
            "outer_lr": Param(JOB.outer_lr, type="number", exclusiveMinimum=0,
                              description="Outer Nesterov SGD learning rate (the last round adopts the clouds' average)."),
            "outer_momentum": Param(JOB.outer_momentum, type="number", minimum=0, exclusiveMaximum=1, description="Outer momentum."),
            "round_timeout_s": Param(JOB.round_timeout_s, type="number", exclusiveMinimum=0, description="Longest wait for a round."),
            "overlap": Param(JOB.overlap, type="boolean", description="Exchange round r while round r + 1 computes."),
            "eval_every_steps": Param(JOB.eval_every_steps, type="integer", minimum=1,
                                      description="Evaluate the global on held-out bytes every this many steps, and after the last round."),
            "eval_timeout_s": Param(JOB.eval_timeout_s, type="number", exclusiveMinimum=0,
                                    description="An evaluation past this many seconds is recorded as failed; training goes on."),
            "probe_steps": Param(JOB.probe_steps, type="integer", minimum=0, maximum=1000,
                                 description="Before the first placement on an accelerator type no run has measured this program on, "
                                             "measure it there with a probe run of this many first steps (0: none, size by estimate)."),
            "fold_mix": Param(JOB.fold_mix, type="number", minimum=0, exclusiveMaximum=1,
                              description="Overlap: the share of its own drift a cloud keeps when the late global is folded in."),
            "compression": Param(JOB.compression, enum=["int8", "none"], description="How pseudo-gradients travel."),
            "adapt_shares": Param(JOB.adapt_shares, type="boolean", description="Move batch shares towards faster clouds between rounds."),
            "program": Param(JOB.program, type="string", minLength=1,
                             description="The training program: a file relative to the project folder, or package.module "
                                         "(docs/programs.md). Every cloud runs it on crosscloud.sdk."),
            "program_args": Param(JOB.program_args, type="object",
                                  description="A JSON object the program reads as run.args (over seed, lr and model_size)."),
            "subtask_retries": Param(JOB.subtask_retries, type="integer", minimum=0, maximum=10,
                                     description="Times a sub-task that died is started again (it resumes) before its cloud is lost."),
            "keep_rounds": Param(JOB.keep_rounds, type="integer", minimum=2,
                                 description="Rounds of deltas and globals each cloud keeps in its store (the final model stays)."),
            "priority": Param(JOB.priority, type="integer", description="Queue priority: higher goes first (then fair share, then age)."),
            "deadline": Param(JOB.deadline, type="string",
                              description="When the run must have finished: hours after submission (e.g. 12) or a time (2026-12-07T06:00Z); empty: none."),
            "deferrable": Param(JOB.deferrable, type="boolean", description="May wait for cheaper or cleaner hours before its deadline."),
            "objective": Param(JOB.objective, type="string",
                               description="What deferrable work saves: cost, carbon, or a carbon weight between 0 and 1."),
            "follow_prices": Param(JOB.follow_prices, type="boolean", description="Move a dear cloud's batch share to cheaper clouds between rounds (DAG follow_prices)."),
    }


def training_dag(tenant: str | None = None):
    """The DAG for every tenant (``tenant`` None) or for one; call it at the top level of a DAG file."""
    dag_id = DAG_ID if tenant is None else tenant_dag_id(tenant)

    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2025, 1, 1),
        catchup=False,
        doc_md=DOC,
        tags=["crosscloud", "training"] + ([tenant] if tenant else []),
        max_active_runs=4,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
        params=_params(tenant),
    )
    def cross_cloud_training():
        @task
        def aggregate(run: dict, handles: list[dict]) -> dict:
            from crosscloud.pipeline.stages import aggregate_stage

            summary = aggregate_stage(run_ref(run), handles, experiment=DAG_ID)
            print(f"eval loss {summary['metrics']['eval_loss_start']:.4f} -> {summary['metrics']['final_eval_loss']:.4f}")
            return summary["metrics"]

        train_after(AdmitOperator(task_id="admit", experiment=DAG_ID), aggregate)

    return cross_cloud_training()
