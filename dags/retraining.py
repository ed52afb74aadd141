"""
### Retraining

Keeps the tenant's registered model current: every day at 03:00 UTC, and
whenever the training-data Asset `crosscloud_training_data` is updated (a data
pipeline's task with it as an outlet, or *Assets -> Create event* in the UI).

1. **retrain** continues the tenant's registered model
   (`crosscloud-<tenant>-<model size>` in the MLflow model registry: the
   version with the alias `champion`, else the newest; from the seed when none
   is registered yet) with a cross-cloud training run over the current data.
   The run is tracked in the MLflow experiment `retraining` and registers its
   final model as a new version, with lineage tags (plan, clouds, data digests,
   DAG run id, `crosscloud.parent_model`).
2. **decide** evaluates the current champion on that run's held-out set, the
   same bytes the new model was measured on, and moves the alias `champion` to
   the new version only if its eval loss is lower. The version is tagged
   `crosscloud.promoted` either way.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, get_current_context, task

DAG_ID = "retraining"
TRAINING_DATA = Asset(name="crosscloud_training_data", uri="crosscloud://datasets/python-stdlib")


@dag(
    dag_id=DAG_ID,
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 3 * * *", timezone="UTC"), assets=[TRAINING_DATA]),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["crosscloud", "training", "registry"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "tenant": Param("team-a", type="string", description="Tenant whose model is retrained."),
        "model_size": Param("small", enum=["tiny", "small", "base", "large"], description="Model preset (one registered model each)."),
        "rounds": Param(4, type="integer", minimum=1, description="Outer rounds of the retraining run."),
        "inner_steps": Param(25, type="integer", minimum=1, description="Inner steps per round (H)."),
        "global_batch": Param(24, type="integer", minimum=1, description="Sequences per inner step over all clouds."),
        "inner_lr": Param(3e-3, type="number", exclusiveMinimum=0, description="AdamW learning rate of the retraining."),
        "seed": Param(0, type="integer", minimum=0, description="Seed of data selection and held-out set."),
    },
)
def retraining():
    @task
    def retrain() -> dict:
        from crosscloud.core.job import JobSpec
        from crosscloud.pipeline.retraining import retrain as run_retrain
        from crosscloud_airflow.connections import use_airflow_connections

        use_airflow_connections()
        ctx = get_current_context()
        spec = JobSpec.from_params(dict(ctx["params"]))
        result = run_retrain(spec, ctx["run_id"], experiment=DAG_ID,
                             tags={"airflow.dag_id": DAG_ID, "airflow.run_id": ctx["run_id"]})
        print(f"registered {result['model']['name']} version {result['model']['version']}: eval loss {result['final_eval_loss']:.4f}")
        return result

    @task
    def decide(result: dict) -> dict:
        from crosscloud.pipeline.retraining import decide as decide_promotion

        verdict = decide_promotion(result)
        against = ("no champion yet" if verdict["champion_eval_loss"] is None else
                   f"champion version {verdict['champion_version']} at {verdict['champion_eval_loss']:.4f}")
        print(f"version {verdict['version']} at {verdict['eval_loss']:.4f} against {against}: "
              f"{'promoted to champion' if verdict['promoted'] else 'not promoted'}")
        return verdict

    decide(retrain())


retraining()
