"""The stages of a training run after admission, as one set of tasks that every training DAG lays out the same way.

``cross_cloud_training`` and ``retraining`` both train through the queue: an
``AdmitOperator`` enters the run and waits deferred, then ``train_after``
lays out preheat, one mapped dispatch task per access method, the deferred
watch of the rounds, the DAG's own ``aggregate`` and the ``cleanup`` teardown
that gives the devices back whatever happened. One layout, so a fix to a stage
reaches both DAGs.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow.sdk import BaseOperator, task

from crosscloud_airflow.operators import (
    KubernetesSubTaskOperator,
    KubernetesSubTaskWaitOperator,
    LocalSubTaskOperator,
    SSHSubTaskOperator,
    SyncCheckpointsOperator,
    all_handles,
    run_ref,
)

DISPATCH = (("local", LocalSubTaskOperator), ("kubernetes", KubernetesSubTaskOperator), ("ssh", SSHSubTaskOperator))


@task
def preheat(run: dict) -> dict:
    from crosscloud.pipeline.stages import preheat_stage

    report = preheat_stage(run_ref(run))
    print(f"preheat: sent {report['total_sent_bytes']} bytes, skipped {report['total_skipped_bytes']} already present")
    return report


@task
def clouds_of(run: dict, method: str) -> list[str]:
    """The plan's clouds reached by ``method``: what that dispatch task maps over."""
    _, plan = run_ref(run).load()
    return [c.name for c in plan.clouds if c.method == method]


@task(trigger_rule="none_failed_min_one_success")
def gather_handles(per_method: list) -> list[dict]:
    """Every started sub-task's handle, whichever access method started it (skipped methods add none)."""
    return all_handles(per_method)


@task(trigger_rule="all_done")
def cleanup(run: dict) -> None:
    """Stop every sub-task of the run still alive and give its devices back, whatever the other tasks did."""
    from crosscloud.pipeline.stages import release_stage
    from crosscloud.pipeline.subtasks import run_handles, stop_run

    ref = run_ref(run)
    try:
        stop_run(ref, run_handles(ref))
    finally:
        print(f"released {release_stage(ref)} reserved device(s)")


def train_after(admit: BaseOperator, aggregate: Callable):
    """Lay out the stages after ``admit``; ``aggregate(run, handles)`` is the DAG's last stage. Returns its output."""
    run = admit.output
    preheated = preheat(run)
    # one mapped dispatch task per access method; a method no planned cloud uses expands to nothing and is skipped
    dispatch = {}
    for method, operator in DISPATCH:
        clouds = clouds_of.override(task_id="clouds_of" if method == "local" else f"clouds_of_{method}")(run, method)
        preheated >> clouds
        dispatch[method] = operator.partial(task_id=f"dispatch_{method}", run=run).expand(cloud=clouds)
    handles = gather_handles([d.output for d in dispatch.values()])
    synced = SyncCheckpointsOperator(task_id="sync_checkpoints", run=run, handles=handles)
    await_kubernetes = KubernetesSubTaskWaitOperator.partial(task_id="await_kubernetes").expand(
        handle=dispatch["kubernetes"].output)
    done = aggregate(run, handles)
    synced >> [done, await_kubernetes]
    # admit is the setup: a run that failed before any dispatch still gives its devices back
    [done, await_kubernetes] >> cleanup(run).as_teardown(setups=run)
    return done
