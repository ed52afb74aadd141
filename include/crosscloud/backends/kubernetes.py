"""The kubernetes access method: a sub-task is an Indexed Job in the cloud's namespace.

The engine builds the manifests (Job, its headless Service for the torchrun
rendezvous, the federation ConfigMap, the image pre-pull DaemonSet) as plain
dicts and computes free capacity from API responses; it never imports Airflow.
The Job is created by the Airflow operator ``dispatch_kubernetes`` through the
cncf-kubernetes provider; watching, logs and stopping go through the official
``kubernetes`` client, whose ``ApiClient`` comes from ``set_client_factory``
(the plugin installs one built by ``KubernetesHook`` from the cloud's Connection).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

from crosscloud.backends.base import PAUSED, PROGRAM_FAILED, STOPPED, Backend, Handle, RemoteState, SubTaskError, SubTaskSpec
from crosscloud.core.federation import Cloud, KubernetesPool
from crosscloud.store.credentials import credential_env_names

# Device plugin resource names and taints of each accelerator family; a pool's ``kubernetes`` section overrides them.
_NVIDIA = ("nvidia.com/gpu", 8)
ACCELERATOR_DEFAULTS: dict[str, tuple[str | None, int]] = {
    "cpu": (None, 64),  # cpu "devices" are cores, asked for as cpu
    **{f"nvidia-{m}": _NVIDIA for m in ("k80", "p100", "v100", "a100", "h100", "h200")},
    "ascend-910b": ("huawei.com/Ascend910", 8),
    "hygon-k100": ("hygon.com/dcu", 8),
}
FEDERATION_MOUNT = "/etc/crosscloud"
RENDEZVOUS_PORT = 29500
LABEL = "crosscloud.io"
REMOTE_POLL_S = 2.0  # the API server is asked at most this often per Job for its state and for pod 0's log


@dataclass(frozen=True)
class PoolRequest:
    """What one pod of a pool asks the scheduler for, resolved from the federation and the defaults."""

    resource: str | None
    devices_per_pod: int
    node_selector: dict[str, str]
    tolerations: list[dict]
    cpu: str
    memory: str

    @classmethod
    def of(cls, cloud: Cloud, accelerator: str) -> PoolRequest:
        pool = next((p for p in cloud.pools if p.accelerator == accelerator), None)
        if pool is None:
            raise SubTaskError(f"clouds.{cloud.name}.pools: no {accelerator} pool; add one or plan another accelerator")
        k8s = pool.kubernetes or KubernetesPool()
        resource, per_pod = ACCELERATOR_DEFAULTS[accelerator]
        resource = k8s.resource or resource
        tolerations = k8s.tolerations or ([{"key": resource, "operator": "Exists", "effect": "NoSchedule"}] if resource else [])
        return cls(resource, k8s.devices_per_pod or per_pod, dict(k8s.node_selector), list(tolerations), k8s.cpu, k8s.memory)

    def pods(self, devices: int) -> tuple[int, int]:
        """(pods, devices per pod) for ``devices``: whole pods only, so every rank has the same devices."""
        if devices <= self.devices_per_pod:
            return 1, devices
        if devices % self.devices_per_pod:
            raise SubTaskError(f"{devices} devices do not fill whole pods of {self.devices_per_pod} "
                               "(pools[].kubernetes.devices_per_pod); plan a multiple of it")
        return devices // self.devices_per_pod, self.devices_per_pod

    def resources(self, devices: int) -> dict:
        if self.resource is None:
            return {"requests": {"cpu": str(devices), "memory": self.memory}, "limits": {"cpu": str(devices)}}
        return {"requests": {"cpu": self.cpu, "memory": self.memory, self.resource: str(devices)},
                "limits": {self.resource: str(devices)}}


def run_label(tenant: str, run_id: str) -> str:
    """A label value for a run (Airflow run ids hold ':' and '+', which labels forbid)."""
    return hashlib.sha256(f"{tenant}/{run_id}".encode()).hexdigest()[:16]


def job_name(spec: SubTaskSpec) -> str:
    """The Job's DNS name; it starts with the provider's ``job-`` prefix so that the name does not change."""
    return f"job-cc-{spec.cloud}-{run_label(spec.tenant, spec.run_id)[:10]}"[:63]


def namespace(cloud: Cloud) -> str:
    return cloud.access.namespace or "default"


def labels(spec: SubTaskSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "crosscloud-worker", "app.kubernetes.io/managed-by": "crosscloud",
            f"{LABEL}/tenant": spec.tenant, f"{LABEL}/cloud": spec.cloud, f"{LABEL}/run": run_label(spec.tenant, spec.run_id)}


def _command(spec: SubTaskSpec, name: str, pods: int, per_pod: int) -> list[str]:
    python = ["python", "-m"]
    if pods > 1:  # torchrun over the Job's pods: pod 0 is the rendezvous, found through the headless Service
        return [*python, "torch.distributed.run", f"--nnodes={pods}", f"--nproc-per-node={per_pod}",
                "--node-rank=$(NODE_RANK)", f"--master-addr={name}-0.{name}", f"--master-port={RENDEZVOUS_PORT}",
                "-m", spec.module]
    if per_pod > 1:
        return [*python, "torch.distributed.run", "--standalone", f"--nproc-per-node={per_pod}", "-m", spec.module]
    return [*python, spec.module]


def _env(spec: SubTaskSpec, cloud: Cloud) -> list[dict]:
    """Plain settings as values; store keys only as references to the tenant's Secret, never as values.

    The Secret holds the keys of the cloud's own store (``access_key_id``...) and,
    for each peer cloud whose deltas the sub-task reads, ``<peer>.access_key_id``...
    (optional: a peer store that needs no keys has none).
    """
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": "NODE_RANK", "valueFrom": {"fieldRef": {
               "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    env += [{"name": k, "value": v} for k, v in sorted(cloud.access.env.items())]
    secret = store_secret(cloud, spec.tenant)
    if secret:
        for var, arg in credential_env_names(spec.cloud, spec.tenant).items():
            ref = {"name": secret, "key": arg.removeprefix("aws_")}
            if arg == "aws_session_token":
                ref["optional"] = True
            env.append({"name": var, "valueFrom": {"secretKeyRef": ref}})
        for peer in spec.peers:
            for var, arg in credential_env_names(peer, spec.tenant).items():
                ref = {"name": secret, "key": f"{peer}.{arg.removeprefix('aws_')}", "optional": True}
                env.append({"name": var, "valueFrom": {"secretKeyRef": ref}})
    return env


def store_secret(cloud: Cloud, tenant: str) -> str | None:
    """The Secret holding ``tenant``'s store keys on ``cloud`` (keys access_key_id, secret_access_key, session_token)."""
    if cloud.access.store_secret:
        return cloud.access.store_secret.format(tenant=tenant)
    return f"crosscloud-store-{tenant}" if cloud.store.connection_id else None


def job_manifest(spec: SubTaskSpec, cloud: Cloud) -> dict:
    """The Job of one cloud's sub-task: Indexed pods, the pool's devices, selectors, tolerations, queue."""
    if not spec.image:
        raise SubTaskError(f"cloud {spec.cloud}: no adapted image for {spec.accelerator}; register one under images:")
    pool = PoolRequest.of(cloud, spec.accelerator)
    pods, per_pod = pool.pods(spec.devices)
    name, meta_labels = job_name(spec), labels(spec)
    annotations = {f"{LABEL}/run-id": spec.run_id}
    pod_annotations = {}
    access = cloud.access
    if access.scheduler == "kueue":
        if not access.queue:
            raise SubTaskError(f"clouds.{cloud.name}.access.queue: scheduler kueue needs the LocalQueue's name")
        meta_labels = {**meta_labels, "kueue.x-k8s.io/queue-name": access.queue}
    if access.scheduler == "volcano" and access.queue:
        pod_annotations["scheduling.volcano.sh/queue-name"] = access.queue
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [{
            "name": "worker",
            "image": spec.image,
            "command": _command(spec, name, pods, per_pod),
            "args": spec.args_with_federation(f"{FEDERATION_MOUNT}/federation.yaml"),
            "env": _env(spec, cloud),
            "resources": pool.resources(per_pod),
            "ports": [{"containerPort": RENDEZVOUS_PORT, "name": "rendezvous"}],
            "volumeMounts": [{"name": "federation", "mountPath": FEDERATION_MOUNT, "readOnly": True}],
        }],
        "volumes": [{"name": "federation", "configMap": {"name": name}}],
    }
    if pods > 1:
        pod_spec["subdomain"] = name
    if pool.node_selector:
        pod_spec["nodeSelector"] = pool.node_selector
    if pool.tolerations:
        pod_spec["tolerations"] = pool.tolerations
    if access.scheduler == "volcano":
        pod_spec["schedulerName"] = "volcano"
    job_spec = {
        "completions": pods,
        "parallelism": pods,
        "completionMode": "Indexed",
        # a pod that died is started again, and resumes from its cloud's state, this many times; a program
        # that failed (exit 4), a stopped run (exit 3) or a paused one (exit 6: resumed by a new Job) would only fail
        # again, so it fails the Job at once
        "backoffLimit": spec.retries,
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                                             "values": [STOPPED, PROGRAM_FAILED, PAUSED]}}]},
        "ttlSecondsAfterFinished": 86400,
        "template": {"metadata": {"labels": meta_labels, "annotations": pod_annotations}, "spec": pod_spec},
    }
    if access.scheduler == "kueue":
        job_spec["suspend"] = True  # Kueue admits (unsuspends) it when the queue has room
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace(cloud), "labels": meta_labels, "annotations": annotations},
            "spec": job_spec}


def companion_manifests(spec: SubTaskSpec, cloud: Cloud, federation_text: str, job_uid: str | None = None) -> list[dict]:
    """What the Job needs beside it: the federation file as a ConfigMap and, for several pods, the rendezvous Service.

    With the created Job's ``job_uid`` they are owned by it, so they go when the Job goes (its TTL, or a stop).
    """
    name, meta = job_name(spec), {"namespace": namespace(cloud), "labels": labels(spec)}
    if job_uid:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid}]
    found = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta},
              "data": {"federation.yaml": federation_text}}]
    if PoolRequest.of(cloud, spec.accelerator).pods(spec.devices)[0] > 1:
        found.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **meta},
                      "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                               "selector": {"batch.kubernetes.io/job-name": name},
                               "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}})
    return found


def prepull_manifest(cloud: Cloud, accelerator: str, image: str) -> dict:
    """A DaemonSet on the pool's nodes whose init container pulls ``image`` and exits: ready = pulled everywhere."""
    pool = PoolRequest.of(cloud, accelerator)
    digest = hashlib.sha256(image.encode()).hexdigest()[:10]
    name = f"cc-prepull-{accelerator}-{digest}"[:63]
    selector = {f"{LABEL}/prepull": name}
    pod_spec = {
        "initContainers": [{"name": "pull", "image": image, "command": ["sh", "-c", "true"],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        "containers": [{"name": "hold", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if pool.node_selector:
        pod_spec["nodeSelector"] = pool.node_selector
    if pool.tolerations:
        pod_spec["tolerations"] = pool.tolerations
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace(cloud),
                         "labels": {"app.kubernetes.io/managed-by": "crosscloud", **selector}},
            "spec": {"selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": selector}, "spec": pod_spec}}}


def prepull_done(daemonset_status: dict) -> bool:
    """Whether every node the DaemonSet targets has pulled the image (its pod is ready)."""
    desired = daemonset_status.get("desiredNumberScheduled") or 0
    return desired > 0 and (daemonset_status.get("numberReady") or 0) >= desired


def job_state(status: dict, pods: int) -> str:
    """A Job's state from its API ``status``: every pod done is success; the Job's failure condition is failure."""
    if (status.get("succeeded") or 0) >= pods:
        return "succeeded"
    conditions = status.get("conditions") or []
    # a failed pod alone is a pod the Job starts again (backoffLimit); the Job has failed once the
    # controller says so (FailureTarget while its pods terminate, then Failed)
    if any(c.get("type") in ("Failed", "FailureTarget") and c.get("status") == "True" for c in conditions):
        return "failed"
    return "running"


def _quantity(value: str | int) -> float:
    """A Kubernetes quantity of devices or cores ('8', '500m') as a number."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def free_devices(nodes: list[dict], pods: list[dict], resource: str, node_selector: dict[str, str] | None = None) -> int:
    """Allocatable minus requested ``resource`` over the schedulable nodes matching ``node_selector``.

    ``nodes`` and ``pods`` are the ``items`` of the API's node and pod lists (as
    dicts); pods that finished hold nothing.
    """
    selector = node_selector or {}
    free: dict[str, float] = {}
    for node in nodes:
        meta, spec = node.get("metadata", {}), node.get("spec", {})
        if spec.get("unschedulable") or any(meta.get("labels", {}).get(k) != v for k, v in selector.items()):
            continue
        free[meta["name"]] = _quantity(node.get("status", {}).get("allocatable", {}).get(resource, 0))
    for pod in pods:
        node_name = pod.get("spec", {}).get("nodeName")
        if node_name not in free or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in pod["spec"].get("containers", []):
            free[node_name] -= _quantity((container.get("resources") or {}).get("requests", {}).get(resource, 0))
    return int(sum(max(0.0, math.floor(v)) for v in free.values()))


ClientFactory = Callable[[dict], object]  # access section -> kubernetes.client.ApiClient
_client_factory: ClientFactory | None = None
_clients: dict[str, object] = {}  # one ApiClient per Connection and process


def set_client_factory(factory: ClientFactory | None) -> None:
    """Install (or with None remove) what turns a cloud's access section into an ``ApiClient``."""
    global _client_factory
    if factory is not _client_factory:
        _client_factory = factory
        _clients.clear()


def api_client(access: dict):
    """The ``ApiClient`` of a cloud's Connection (its ``access`` section): one per Connection and process, from the
    installed factory (in Airflow the provider's ``KubernetesHook``), else from the kubeconfig or in-cluster."""
    key = access.get("connection_id") or ""
    if key not in _clients:
        _clients[key] = (_client_factory or _kubeconfig_client)(access)
    return _clients[key]


def _kubeconfig_client(access: dict):
    """Outside Airflow: the kubeconfig context named like the Connection, else the current one, else in-cluster."""
    from kubernetes import client, config

    try:
        return config.new_client_from_config(context=access.get("connection_id"))
    except config.ConfigException:
        config.load_incluster_config()
        return client.ApiClient()


class KubernetesBackend(Backend):
    name = "kubernetes"
    restarts_itself = True  # the Job's backoffLimit

    def __init__(self) -> None:
        self._remote = RemoteState(REMOTE_POLL_S)

    @staticmethod
    def _apis(access: dict):
        from kubernetes import client

        api = api_client(access)
        return client.BatchV1Api(api), client.CoreV1Api(api)

    def start(self, spec: SubTaskSpec) -> Handle:
        raise SubTaskError(f"cloud {spec.cloud}: kubernetes sub-tasks are created by the Airflow task dispatch_kubernetes "
                           "(the cncf-kubernetes provider's KubernetesJobOperator); run the DAG cross_cloud_training")

    @staticmethod
    def handle(spec: SubTaskSpec, cloud: Cloud, job: dict) -> Handle:
        """The handle of a created Job: names only, never a credential."""
        pods = job["spec"]["completions"]
        return {"backend": "kubernetes", "cloud": spec.cloud, "tenant": spec.tenant, "run_id": spec.run_id,
                "namespace": job["metadata"]["namespace"], "job": job["metadata"]["name"], "pods": pods,
                "accelerator": spec.accelerator, "devices": spec.devices, "access": cloud.access.model_dump()}

    def state(self, handle: Handle) -> str:
        return self._remote.state(handle["job"], lambda: self._ask_state(handle))

    def _ask_state(self, handle: Handle) -> str:
        from kubernetes.client.exceptions import ApiException

        batch, _ = self._apis(handle["access"])
        try:
            job = batch.read_namespaced_job_status(handle["job"], handle["namespace"])
        except ApiException as exc:
            if exc.status == 404:
                return "lost"
            raise
        return job_state(batch.api_client.sanitize_for_serialization(job).get("status", {}), handle["pods"])

    def logs(self, handle: Handle, offset: int = 0) -> tuple[str, int]:
        """Output of pod 0 (rank 0 reports for the cloud) since ``offset``, in whole lines."""
        return self._remote.logs(handle["job"], offset, lambda: self._read_log(handle, offset))

    def _read_log(self, handle: Handle, offset: int) -> tuple[str, int]:
        from kubernetes.client.exceptions import ApiException

        _, core = self._apis(handle["access"])
        pods = core.list_namespaced_pod(handle["namespace"], label_selector=f"batch.kubernetes.io/job-name={handle['job']},"
                                        "batch.kubernetes.io/job-completion-index=0").items
        if not pods:
            return "", offset
        try:
            text = core.read_namespaced_pod_log(pods[0].metadata.name, handle["namespace"], container="worker")
        except ApiException:  # not started yet
            return "", offset
        data = text.encode()[offset:]
        cut = data.rfind(b"\n") + 1
        return data[:cut].decode(errors="replace"), offset + cut

    def stop(self, handle: Handle) -> None:
        """Delete a running Job with its pods and the objects it owns; a finished one stays for its TTL (and its logs)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        self._remote.forget(handle["job"])
        if self.state(handle) != "running":
            return
        batch, _ = self._apis(handle["access"])
        try:
            batch.delete_namespaced_job(handle["job"], handle["namespace"],
                                        body=client.V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._remote.forget(handle["job"])

    def find(self, tenant: str, run_id: str, cloud: str, access: dict | None = None) -> Handle | None:
        if not access:
            raise SubTaskError(f"cloud {cloud}: finding a kubernetes sub-task needs the cloud's access section")
        batch, _ = self._apis(access)
        ns = access.get("namespace") or "default"
        jobs = batch.list_namespaced_job(ns, label_selector=f"{LABEL}/run={run_label(tenant, run_id)},{LABEL}/cloud={cloud}").items
        if not jobs:
            return None
        job = jobs[0]
        return {"backend": "kubernetes", "cloud": cloud, "tenant": tenant, "run_id": run_id, "namespace": ns,
                "job": job.metadata.name, "pods": job.spec.completions, "access": access}

    def used_devices(self) -> dict[str, dict[str, int]]:
        raise SubTaskError("kubernetes clouds report capacity per cloud (free_devices over their nodes and pods)")

    def free(self, cloud: Cloud) -> dict[str, int]:
        """Free devices of each of ``cloud``'s pools now: allocatable minus requested, from the cluster's API.

        The cluster's unfinished pods are listed once for all pools; nodes per pool, by its selector.
        """
        _, core = self._apis(cloud.access.model_dump())
        api = core.api_client
        pods = api.sanitize_for_serialization(core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed"))
        free = {}
        for p in cloud.pools:
            pool = PoolRequest.of(cloud, p.accelerator)
            nodes = api.sanitize_for_serialization(core.list_node(label_selector=",".join(f"{k}={v}" for k, v in pool.node_selector.items()) or None))
            free[p.accelerator] = free_devices(nodes["items"], pods["items"], pool.resource or "cpu", pool.node_selector)
        return free
