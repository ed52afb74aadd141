"""
### Retraining

Keeps the tenant's registered model current: every day at 03:00 UTC, and
whenever the training-data Asset `crosscloud_training_data` is updated (a data
pipeline's task with it as an outlet, or *Assets -> Create event* in the UI).

1. **admit** enters the retrain in the federation's queue like any training
   run and waits for its start deferred, holding no worker slot (at 03:00 on a
   busy cloud it waits its turn; with `deferrable` and a `deadline` it waits
   for cheaper hours). When it starts, it continues the tenant's registered
   model: its program's own (`crosscloud-<tenant>-<model name>` in the MLflow
   model registry, docs/programs.md#names-and-versions), the version with the
   alias `champion`, else the newest; from the seed when none is registered
   yet. A program whose model is another architecture than that version's is
   refused before anything trains.
2. **preheat**, **dispatch_***, **sync_checkpoints**, **cleanup**: the
   stages of `cross_cloud_training`; the rounds are watched deferred.
3. **aggregate** evaluates the final model and registers it as a new version
   with lineage tags (plan, clouds, data digests, DAG run id,
   `crosscloud.parent_model`), tracked in the MLflow experiment `retraining`.
4. **decide** compares the new model with the champion on that run's
   held-out set: the run continued the champion, so the home cloud's sub-task
   measured the champion as the run's global 0, on the same bytes and device
   as the new model (no model is loaded in this task). It moves the alias
   `champion` to the new version only if its eval loss is lower. The version
   is tagged `crosscloud.promoted` either way, and `crosscloud.not_compared`
   with why when the champion moved while the retrain ran.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task

from crosscloud.core.job import JobSpec
from crosscloud_airflow.operators import AdmitOperator, run_ref
from crosscloud_airflow.training import train_after

DAG_ID = "retraining"
TRAINING_DATA = Asset(name="crosscloud_training_data", uri="crosscloud://datasets/python-stdlib")
JOB = JobSpec()


@dag(
    dag_id=DAG_ID,
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 3 * * *", timezone="UTC"), assets=[TRAINING_DATA]),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["crosscloud", "training", "registry"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={
        "tenant": Param("team-a", type="string", description="Tenant whose model is retrained."),
        "program": Param(JOB.program, type="string", minLength=1,
                         description="The training program whose registered model is retrained (docs/programs.md)."),
        "program_args": Param(JOB.program_args, type="object",
                              description="A JSON object the program reads as run.args (over seed, lr and model_size)."),
        "dataset": Param(JOB.dataset, type="string",
                         description="The federation dataset to retrain on; empty: the program's own (its DATASET)."),
        "model_size": Param("small", enum=["tiny", "small", "base", "large"],
                            description="The byte-LM program's preset (one registered model each)."),
        "rounds": Param(4, type="integer", minimum=1, description="Outer rounds of the retraining run."),
        "inner_steps": Param(25, type="integer", minimum=1, description="Inner steps per round (H)."),
        "global_batch": Param(24, type="integer", minimum=1, description="Sequences per inner step over all clouds."),
        "inner_lr": Param(3e-3, type="number", exclusiveMinimum=0, description="AdamW learning rate of the retraining."),
        "seed": Param(0, type="integer", minimum=0, description="Seed of data selection and held-out set."),
        "priority": Param(JOB.priority, type="integer", description="Queue priority: higher goes first (then fair share, then age)."),
        "deadline": Param(JOB.deadline, type="string",
                          description="When the retrain must have finished: hours after submission (e.g. 12) or a time; empty: none."),
        "deferrable": Param(JOB.deferrable, type="boolean", description="May wait for cheaper or cleaner hours before its deadline."),
        "objective": Param(JOB.objective, type="string",
                           description="What deferrable work saves: cost, carbon, or a carbon weight between 0 and 1."),
    },
)
def retraining():
    @task
    def aggregate(run: dict, handles: list[dict]) -> dict:
        from crosscloud.pipeline.retraining import retrained
        from crosscloud.pipeline.stages import aggregate_stage

        result = retrained(run, aggregate_stage(run_ref(run), handles, experiment=DAG_ID, compare_baseline=False))
        print(f"registered {result['model']['name']} version {result['model']['version']}: eval loss {result['final_eval_loss']:.4f}")
        return result

    @task
    def decide(result: dict) -> dict:
        from crosscloud.pipeline.retraining import decide as decide_promotion

        verdict = decide_promotion(result)
        against = (verdict["not_compared"] or "no champion yet" if verdict["champion_eval_loss"] is None else
                   f"champion version {verdict['champion_version']} at {verdict['champion_eval_loss']:.4f}")
        print(f"version {verdict['version']} at {verdict['eval_loss']:.4f} against {against}: "
              f"{'promoted to champion' if verdict['promoted'] else 'not promoted'}")
        return verdict

    decide(train_after(AdmitOperator(task_id="admit", experiment=DAG_ID, continue_registered=True), aggregate))


retraining()
