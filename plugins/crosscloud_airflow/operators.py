"""Operators of the ``cross_cloud_training`` stages that need more than ``@task``.

One dispatch operator per access method starts a cloud's sub-task and returns
its handle at once: ``LocalSubTaskOperator`` (processes here),
``SSHSubTaskOperator`` (a bare-metal host) and ``KubernetesSubTaskOperator``
(an Indexed Job through the cncf-kubernetes provider, waited for by
``KubernetesSubTaskWaitOperator``); a further access method is a further
operator here. ``SyncCheckpointsOperator`` watches the run deferred (the
clouds reduce each round themselves) and records each round as it commits; it
never stops the sub-tasks, the DAG's ``cleanup`` teardown does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from airflow.sdk import BaseOperator


def all_handles(groups: Any) -> list[dict]:
    """Handles of mapped dispatch tasks as one list, ``groups`` holding one task's output per access method.

    Indexing, not iterating, so that no XCom is looked up past the end.
    """
    return [group[i] for group in groups for i in range(len(group))]


def run_ref(run: dict):
    """The engine's handle on a run, with store credentials taken from Airflow Connections."""
    from crosscloud.run.ref import RunRef
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    return RunRef(**run)


class AdmitOperator(BaseOperator):
    """The run enters the federation's queue and waits for its decision deferred; returns the run's reference.

    ``execute`` submits the run (``admit_stage``). While it waits, the task is
    deferred on ``QueueTrigger``: no worker slot, no poke loop; the task log
    says its position, its expected start and the reason, each time they
    change. When a pass starts it, ``resume`` takes its reservation, writes the
    plan and logs where it trains; a run no cloud can ever take fails, naming
    every cloud's reason. With ``continue_registered`` the run starts from the
    tenant's registered model (a retrain), chosen when the run starts.
    """

    ui_color = "#fff2cc"

    def __init__(self, *, experiment: str, poll_interval: float | None = None, continue_registered: bool = False,
                 **kwargs):
        import os

        super().__init__(**kwargs)
        self.experiment, self.continue_registered = experiment, continue_registered
        # how often the triggerer looks at the queue: $CROSSCLOUD_QUEUE_POLL_S, else 10 s
        self.poll_interval = poll_interval or float(os.environ.get("CROSSCLOUD_QUEUE_POLL_S") or 10.0)

    def execute(self, context) -> dict:
        return self._admit_or_fail(context)

    def resume(self, context, event: dict) -> dict:
        self.log.info("queue: %s (%s)", event.get("state"), event.get("reason"))
        if event.get("state") in ("cancelled", "refused"):
            raise RuntimeError(f"run {context['run_id']} left the queue {event['state']}: {event.get('reason')}")
        return self._admit_or_fail(context)

    def _admit_or_fail(self, context) -> dict:
        """A user's error (bad program, Param, federation, placement...) fails the task at once, not retried, with its
        message as the log's last line."""
        from airflow.sdk.exceptions import AirflowFailException

        from crosscloud.pipeline.user_errors import USER_ERRORS

        try:
            return self._admit(context)
        except USER_ERRORS as exc:
            self.log.error("run %s refused: %s", context["run_id"], exc)
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from None

    def _admit(self, context) -> dict:
        from crosscloud.core.federation import federation_path
        from crosscloud.core.job import JobSpec
        from crosscloud.pipeline.stages import admit_stage
        from crosscloud.scheduler.admission import NotAdmitted
        from crosscloud_airflow.connections import use_airflow_connections
        from crosscloud_airflow.triggers import QueueTrigger

        use_airflow_connections()
        spec, run_id, dag_id = JobSpec.from_params(dict(context["params"])), context["run_id"], context["dag"].dag_id
        init, lineage, program = None, {}, None
        if self.continue_registered:
            from crosscloud.pipeline.inputs import load_job_program
            from crosscloud.pipeline.retraining import starting_point

            program = load_job_program(spec)  # one child process describes it, for both steps
            init, lineage = starting_point(spec, self.log.info, program)
        try:
            ref = admit_stage(spec, run_id, experiment=self.experiment, init=init,
                              tags={"airflow.dag_id": dag_id, "airflow.run_id": run_id, **lineage}, program=program)
        except NotAdmitted as waiting:
            self.log.info("run %s waits in the queue, deferred: %s", run_id, waiting)
            self.defer(trigger=QueueTrigger(str(federation_path()), spec.tenant, run_id, self.poll_interval),
                       method_name="resume")
        _, plan = ref.load()
        for c in plan.candidates:
            self.log.info("placement %s/%s: %s - %s", c.cloud, c.accelerator, "chosen" if c.chosen else "not chosen", c.reason)
        for c in plan.clouds:
            self.log.info("cloud %s: share %s/%s, shards %s, %s x %s", c.name, c.share, spec.global_batch, c.shards,
                          c.devices, c.accelerator)
        return ref.to_dict()


class LocalSubTaskOperator(BaseOperator):
    """Start the sub-task of ``cloud`` as processes on this machine; returns its handle."""

    template_fields: Sequence[str] = ("run", "cloud")
    ui_color = "#d9ead3"

    def __init__(self, *, run: Any, cloud: str, **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.cloud = cloud

    def execute(self, context) -> dict:
        from crosscloud.pipeline.subtasks import dispatch_stage

        handle = dispatch_stage(run_ref(self.run), self.cloud)
        self.log.info("cloud %s: sub-task started, pid %s, log %s", self.cloud, handle["pid"],
                      handle.get("log") or handle.get("folder"))
        return handle


class SSHSubTaskOperator(LocalSubTaskOperator):
    """Start the sub-task of an ssh cloud on its bare-metal host (the cloud's SSH Connection); returns its handle."""

    ui_color = "#fff2cc"


class KubernetesSubTaskOperator(BaseOperator):
    """Create the sub-task of a kubernetes cloud as an Indexed Job through the provider; returns its handle at once.

    The request is the engine's Job manifest (``crosscloud.backends.kubernetes``),
    created by the provider's ``KubernetesJobOperator`` with the cloud's
    Connection. Before it, the adapted image is pulled on the pool's nodes (a
    DaemonSet, removed once every node is ready); after it, the federation
    ConfigMap (and for several pods the rendezvous Service) is applied, owned
    by the Job. Waiting for the pods is ``KubernetesSubTaskWaitOperator``'s, so
    that the coordinator runs while they train. The provider (and the kubernetes
    clients, 80 MB) is imported only here, when a kubernetes cloud is
    dispatched, not by every task process that parses the DAG.
    """

    template_fields: Sequence[str] = ("run", "cloud")
    ui_color = "#d0e0e3"

    def __init__(self, *, run: Any, cloud: str, prepull_timeout_s: float = 1800, **kwargs):
        super().__init__(**kwargs)
        self.run, self.cloud, self.prepull_timeout_s = run, cloud, prepull_timeout_s
        self._job = None

    def prepare(self):
        """The sub-task's spec, cloud, Job manifest, and the provider's operator that creates the Job from it."""
        from airflow.providers.cncf.kubernetes.operators.job import JOB_NAME_PREFIX, KubernetesJobOperator
        from kubernetes.client import ApiClient

        from crosscloud.backends.kubernetes import job_manifest
        from crosscloud.pipeline.subtasks import subtask_spec

        fed, plan = run_ref(self.run).load()
        cloud = fed.cloud(self.cloud)
        spec = subtask_spec(plan, self.cloud, access=cloud.access.model_dump())  # keys come from the Secret, not env
        job = job_manifest(spec, cloud)
        meta, job_spec = job["metadata"], job["spec"]
        # no XCom sidecar in the pods (do_xcom_push): the handle is this task's own result
        op = KubernetesJobOperator(task_id=self.task_id, wait_until_job_complete=False, random_name_suffix=False,
                                   base_container_name="worker", get_logs=False, do_xcom_push=False)
        op.kubernetes_conn_id = cloud.access.connection_id
        op.namespace, op.labels, op.annotations = meta["namespace"], meta["labels"], meta["annotations"]
        op.name = meta["name"].removeprefix(JOB_NAME_PREFIX)  # the provider puts the prefix back
        op.completions, op.parallelism = job_spec["completions"], job_spec["parallelism"]
        op.completion_mode, op.backoff_limit = job_spec["completionMode"], job_spec["backoffLimit"]
        op.suspend, op.ttl_seconds_after_finished = job_spec.get("suspend", False), job_spec["ttlSecondsAfterFinished"]
        op.full_job_spec = ApiClient()._ApiClient__deserialize(job, "V1Job")
        self._job = op
        return fed, plan, spec, cloud, job, op

    def on_kill(self) -> None:
        if self._job is not None:
            self._job.on_kill()

    def _prepull(self, api, cloud, accelerator: str, image: str) -> None:
        import time

        from kubernetes import client, utils

        from crosscloud.backends.kubernetes import prepull_done, prepull_manifest

        ds = prepull_manifest(cloud, accelerator, image)
        name, ns = ds["metadata"]["name"], ds["metadata"]["namespace"]
        utils.create_from_dict(api, ds, namespace=ns, apply=True)
        apps, deadline = client.AppsV1Api(api), time.monotonic() + self.prepull_timeout_s
        try:
            while not prepull_done(api.sanitize_for_serialization(apps.read_namespaced_daemon_set_status(name, ns).status)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cloud {cloud.name}: {image} not pulled on every {accelerator} node within "
                                       f"{self.prepull_timeout_s:.0f} s (DaemonSet {ns}/{name})")
                time.sleep(5)
            self.log.info("cloud %s: %s is on every %s node", cloud.name, image, accelerator)
        finally:
            apps.delete_namespaced_daemon_set(name, ns)

    def execute(self, context) -> dict:
        from pathlib import Path

        from kubernetes import utils

        from crosscloud.backends.kubernetes import KubernetesBackend, companion_manifests
        from crosscloud.pipeline.subtasks import check_warm

        fed, plan, spec, cloud, job, op = self.prepare()
        check_warm(fed, plan, self.cloud)
        backend = KubernetesBackend()
        found = backend.find(spec.tenant, spec.run_id, spec.cloud, spec.access)
        if found is not None and backend.state(found) == "running":
            return found  # a retried dispatch must not start a second Job
        api = op.hook.get_conn()
        self._prepull(api, cloud, spec.accelerator, spec.image)
        op.execute(context)
        # the pods wait for their ConfigMap (and rendezvous Service), which the Job owns: they go with it
        uid = op.hook.get_job(job["metadata"]["name"], op.namespace).metadata.uid
        for manifest in companion_manifests(spec, cloud, Path(plan.federation_path).read_text(), job_uid=uid):
            utils.create_from_dict(api, manifest, namespace=manifest["metadata"]["namespace"], apply=True)
        self.log.info("cloud %s: Job %s/%s created (%d pod(s))", self.cloud, op.namespace, job["metadata"]["name"],
                      op.completions)
        return KubernetesBackend.handle(spec, cloud, job)


class KubernetesSubTaskWaitOperator(BaseOperator):
    """Wait, deferred (no worker slot held), until a cloud's Job has ended; then its pods' logs into this task's log."""

    template_fields: Sequence[str] = ("handle",)
    ui_color = "#d0e0e3"

    def __init__(self, *, handle: Any, poll_interval: float = 10.0, **kwargs):
        super().__init__(**kwargs)
        self.handle, self.poll_interval = handle, poll_interval

    def execute(self, context) -> None:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

        h = self.handle
        conn_id = h["access"].get("connection_id")
        pods = KubernetesHook(conn_id=conn_id).core_v1_client.list_namespaced_pod(
            h["namespace"], label_selector=f"batch.kubernetes.io/job-name={h['job']}").items
        self.defer(
            trigger=KubernetesJobTrigger(
                job_name=h["job"], job_namespace=h["namespace"], pod_names=[p.metadata.name for p in pods],
                pod_namespace=h["namespace"], base_container_name="worker", kubernetes_conn_id=conn_id,
                poll_interval=self.poll_interval, get_logs=False, do_xcom_push=False,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context, event: dict) -> None:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager

        hook = KubernetesHook(conn_id=self.handle["access"].get("connection_id"))
        manager = PodManager(kube_client=hook.core_v1_client)
        for name in event.get("pod_names") or []:
            manager.fetch_requested_container_logs(hook.get_pod(name, self.handle["namespace"]), containers=["worker"])
        if event["status"] == "error":
            raise RuntimeError(f"cloud {self.handle['cloud']}: {event['message']}")


class SyncCheckpointsOperator(BaseOperator):
    """The run's watch, deferred: the clouds reduce each round themselves, this task records the rounds they commit.

    ``execute`` defers at once to ``RoundTrigger``: the triggerer waits on the
    round records, no worker slot held, no tensor loaded. ``resume`` runs on a
    worker for a moment whenever the trigger fires: the engine watcher's ``act``
    restarts dead sub-tasks, notes draining clouds, relays the sub-tasks' logs
    and records each decided round in history.json and MLflow (an MLflow
    outage is retried, then only logged); then it defers again, or returns the
    history after the last round. A store outage is logged and waited out. The
    watcher's state is in the run's home store, so a retried or restarted task
    picks up where the last left off, and neither this task's failure, retry
    nor kill stops training: the ``cleanup`` teardown stops a failed or killed
    run. When the queue pauses the run, the watch asks the clouds to stop after
    their next committed round, gives the devices back once they have, and
    waits deferred on ``QueueTrigger`` until a pass starts the run again; then
    it starts every sub-task again (each resumes from its saved state) and
    watches on. A program that failed, every cloud lost or no round decided within
    ``round_timeout_s`` fails this task (``ProgramError``, ``SubTaskLost``).
    """

    template_fields: Sequence[str] = ("run", "handles")
    ui_color = "#cfe2f3"
    # a visit that recorded nothing (a round decided whose global is still being reduced, a sub-task this worker
    # sees running) waits longer before the next: up to this many seconds
    max_delay_s = 30.0

    def __init__(self, *, run: Any, handles: Any, poll_interval: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.handles = handles
        self.poll_interval = poll_interval

    def _defer(self, since: float | None, delay: float = 0.0) -> NoReturn:
        from crosscloud_airflow.triggers import RoundTrigger

        self.defer(trigger=RoundTrigger(run=dict(self.run), handles=all_handles([self.handles]),
                                        poll_interval=self.poll_interval, since=since, delay=delay),
                   method_name="resume")

    def execute(self, context) -> None:
        import time

        self.log.info("watching run %s deferred: the clouds reduce each round themselves", self.run["run_id"])
        self._defer(since=time.time())

    def resume(self, context, event: dict) -> list[dict]:
        """What the trigger found: act on it; the run's history once every round is recorded, else defer again."""
        import time

        from crosscloud.pipeline.stages import run_tracker, track_round
        from crosscloud.pipeline.subtasks import watcher
        from crosscloud.store.base import StoreError

        ref, since, w = run_ref(self.run), event.get("since"), None
        self.log.info("watch woke: %s", event.get("reason"))
        try:
            w = watcher(ref, all_handles([self.handles]), log=self.log.info, since=since)
            records = w.act(track_round(w.plan, run_tracker(w.plan), self.log.info))
        except StoreError as exc:  # an outage is waited out, for as long as a round may take
            timeout = self._round_timeout_s(ref, w)
            if since is not None and timeout is not None and time.time() - since > timeout:
                raise
            self.log.warning("the run's stores cannot be read now (%s); watching on", exc)
            self._defer(since=since, delay=self._next_delay(event, records=False))
        if w.done:
            w.relay_logs()
            return [{k: v for k, v in r.items() if k not in ("clouds", "shares", "next_shares")} for r in w.history]
        if w.paused:
            self._wait_paused(ref)
        self._defer(since=w.since, delay=self._next_delay(event, records=bool(records)))

    def _wait_paused(self, ref) -> NoReturn:
        from crosscloud.core.federation import federation_path
        from crosscloud_airflow.triggers import QueueTrigger

        self.log.info("run %s paused: it waits in the queue, deferred, and resumes from its clouds' saved states",
                      ref.run_id)
        self.defer(trigger=QueueTrigger(str(federation_path(ref.federation_path)), ref.tenant, ref.run_id,
                                        self.poll_interval * 5), method_name="resume_paused")

    def resume_paused(self, context, event: dict) -> list[dict]:
        """The queue started the paused run again (or it left the queue): its sub-tasks start again, the watch goes on."""
        import time

        from crosscloud.pipeline.subtasks import watcher

        if event.get("state") != "running":
            raise RuntimeError(f"run {self.run['run_id']} left the queue while paused: {event.get('state')} "
                               f"({event.get('reason')})")
        ref = run_ref(self.run)
        watcher(ref, all_handles([self.handles]), log=self.log.info).resume()
        self._defer(since=time.time())

    def _next_delay(self, event: dict, records: bool) -> float:
        """No pause after a visit that recorded a round; after one that did not, twice the last (to max_delay_s)."""
        if records:
            return 0.0
        return min(self.max_delay_s, max(2 * float(event.get("delay") or 0.0), self.poll_interval))

    @staticmethod
    def _round_timeout_s(ref, w) -> float | None:
        from crosscloud.store.base import StoreError

        if w is not None:
            return w.plan.spec.round_timeout_s
        try:
            return ref.load()[1].spec.round_timeout_s
        except StoreError:
            return None  # the plan is out of reach as well: wait on

    def on_kill(self) -> None:
        # the sub-tasks train on: a killed watch is picked up by its retry, and the cleanup teardown stops a
        # failed or killed run
        self.log.info("watch stopped; the run's sub-tasks go on training (the cleanup task stops a failed run)")
