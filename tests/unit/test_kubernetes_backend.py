"""The kubernetes access method without a cluster: manifests against the Kubernetes OpenAPI schema,
the provider operator's request built from a federation file field by field, and free capacity
from recorded API responses. Everything up to the API boundary; nothing here talks to a cluster.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from crosscloud.backends import SubTaskError
from crosscloud.backends.base import SubTaskSpec
from crosscloud.backends.kubernetes import (
    ACCELERATOR_DEFAULTS,
    PoolRequest,
    companion_manifests,
    free_devices,
    job_manifest,
    job_name,
    job_state,
    prepull_done,
    prepull_manifest,
)
from crosscloud.core.federation import ACCELERATOR_TYPES, DEFAULT_FEDERATION, load_federation, parse_federation

pytestmark = pytest.mark.kubernetes

K8S_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships
REMOTE = DEFAULT_FEDERATION.with_name("federation.remote.yaml")
DATA = Path(__file__).resolve().parents[1] / "data"
SECRET = "planted-secret-never-in-a-manifest"
RUN_ID = "manual__2026-12-03T07:48:28.120840+00:00"


def validate(manifest: dict) -> None:
    """Strict schema validation (unknown fields refused), offline: the schemas ship in the package."""
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def spec_for(cloud, devices: int, accelerator: str | None = None) -> SubTaskSpec:
    accelerator = accelerator or cloud.pools[0].accelerator
    args = ["--tenant", "team-a", "--run-id", RUN_ID, "--cloud", cloud.name, "--federation", "/airflow/federation.yaml"]
    return SubTaskSpec(tenant="team-a", run_id=RUN_ID, cloud=cloud.name, image=f"registry.example.com/w:{accelerator}",
                       accelerator=accelerator, devices=devices, args=args, access=cloud.access.model_dump(),
                       peers=["beijing"])


def one_accelerator_cloud(accelerator: str, **access):
    raw = yaml.safe_load(REMOTE.read_text())
    kunshan = next(c for c in raw["clouds"] if c["name"] == "kunshan")
    kunshan["pools"] = [{"accelerator": accelerator, "count": 16, "power_w": 300, "price_per_device_hour": 1.0}]
    kunshan["access"].update(access)
    raw["images"].append({"accelerator": accelerator, "family": "byte-lm", "image": f"x/{accelerator}"})
    return parse_federation(raw).cloud("kunshan")


@pytest.mark.parametrize("accelerator", ACCELERATOR_TYPES)
@pytest.mark.parametrize("scheduler", ["default", "kueue", "volcano"])
def test_every_manifest_is_valid_for_every_accelerator(accelerator, scheduler):
    cloud = one_accelerator_cloud(accelerator, scheduler=scheduler, queue="team-a")
    for devices in (1, 8, 16):
        spec = spec_for(cloud, devices)
        manifests = [job_manifest(spec, cloud), *companion_manifests(spec, cloud, "name: x\n"),
                     *companion_manifests(spec, cloud, "name: x\n", job_uid="5a1f0e1e-1d2c-4c9e-9e55-5d4c0f1c1a01"),
                     prepull_manifest(cloud, accelerator, spec.image)]
        for manifest in manifests:
            validate(manifest)
    resource, _ = ACCELERATOR_DEFAULTS[accelerator]
    limits = job_manifest(spec_for(cloud, 8), cloud)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == ({"cpu": "8"} if resource is None else {resource: "8"})


def test_schema_check_is_real():
    """A Job the API server would refuse is refused here too (misspelt field, wrong type)."""
    job = job_manifest(spec_for(load_federation(REMOTE).cloud("wuhan"), 8), load_federation(REMOTE).cloud("wuhan"))
    job["spec"]["completion"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)
    job = job_manifest(spec_for(load_federation(REMOTE).cloud("wuhan"), 8), load_federation(REMOTE).cloud("wuhan"))
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": ["8"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)


def test_default_resource_names_per_accelerator():
    assert ACCELERATOR_DEFAULTS["nvidia-h100"][0] == "nvidia.com/gpu"
    assert ACCELERATOR_DEFAULTS["ascend-910b"][0] == "huawei.com/Ascend910"
    assert ACCELERATOR_DEFAULTS["hygon-k100"][0] == "hygon.com/dcu"
    assert set(ACCELERATOR_DEFAULTS) == set(ACCELERATOR_TYPES)


def test_job_of_a_kueue_gpu_cloud_field_by_field(monkeypatch):
    monkeypatch.setenv("CROSSCLOUD_WUHAN_TEAM_A_SECRET_ACCESS_KEY", SECRET)
    cloud = load_federation(REMOTE).cloud("wuhan")
    spec = spec_for(cloud, 16)
    job = job_manifest(spec, cloud)
    assert SECRET not in json.dumps(job)
    name = job_name(spec)
    assert job["metadata"]["name"] == name and len(name) <= 63 and name.startswith("job-")
    assert job["metadata"]["namespace"] == "crosscloud"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["metadata"]["annotations"]["crosscloud.io/run-id"] == RUN_ID
    js = job["spec"]
    assert (js["completions"], js["parallelism"], js["completionMode"], js["suspend"]) == (2, 2, "Indexed", True)
    pod = js["template"]["spec"]
    assert pod["subdomain"] == name and pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "schedulerName" not in pod
    c = pod["containers"][0]
    assert c["image"] == "registry.example.com/w:nvidia-a100"
    assert c["resources"] == {"requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"},
                              "limits": {"nvidia.com/gpu": "8"}}
    # torchrun over the two pods: rank from the completion index, rendezvous on pod 0 through the headless Service
    assert c["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc-per-node=8", "--node-rank=$(NODE_RANK)", f"--master-addr={name}-0.{name}"} <= set(c["command"])
    assert c["command"][-2:] == ["-m", "crosscloud.training.worker"]
    assert c["args"][c["args"].index("--federation") + 1] == "/etc/crosscloud/federation.yaml"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"].endswith("['batch.kubernetes.io/job-completion-index']")
    key = env["CROSSCLOUD_WUHAN_TEAM_A_SECRET_ACCESS_KEY"]
    assert key == {"name": "CROSSCLOUD_WUHAN_TEAM_A_SECRET_ACCESS_KEY",
                   "valueFrom": {"secretKeyRef": {"name": "crosscloud-store-team-a", "key": "secret_access_key"}}}
    assert env["CROSSCLOUD_WUHAN_TEAM_A_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["key"] == "access_key_id"
    assert env["CROSSCLOUD_WUHAN_TEAM_A_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert all("value" not in e for n, e in env.items() if n.startswith("CROSSCLOUD_WUHAN"))
    # the keys of a peer's store, whose deltas the sub-task reads, from the same Secret, where it has them
    peer = env["CROSSCLOUD_BEIJING_TEAM_A_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]
    assert peer == {"name": "crosscloud-store-team-a", "key": "beijing.access_key_id", "optional": True}
    configmap, service = companion_manifests(spec, cloud, "fed", job_uid="uid-1")
    assert configmap["data"] == {"federation.yaml": "fed"} and configmap["metadata"]["name"] == name
    assert service["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "uid-1"}]
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}


def test_volcano_ascend_and_single_pod_hygon():
    fed = load_federation(REMOTE)
    guiyang, kunshan = fed.cloud("guiyang"), fed.cloud("kunshan")
    job = job_manifest(spec_for(guiyang, 8), guiyang)
    pod = job["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "training"}
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"huawei.com/Ascend910": "8"}
    assert pod["spec"]["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert job["spec"]["completions"] == 1 and "subdomain" not in pod["spec"] and "suspend" not in job["spec"]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    job = job_manifest(spec_for(kunshan, 4), kunshan)
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"hygon.com/dcu": "4"}
    assert c["command"] == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "crosscloud.training.worker"]
    assert len(companion_manifests(spec_for(kunshan, 4), kunshan, "x")) == 1  # no Service for one pod


def test_bad_requests_name_the_field():
    fed = load_federation(REMOTE)
    with pytest.raises(SubTaskError, match="devices_per_pod"):
        job_manifest(spec_for(fed.cloud("kunshan"), 6), fed.cloud("kunshan"))
    with pytest.raises(SubTaskError, match="no nvidia-h100 pool"):
        PoolRequest.of(fed.cloud("wuhan"), "nvidia-h100")
    cloud = one_accelerator_cloud("nvidia-a100", scheduler="kueue", queue=None)
    with pytest.raises(SubTaskError, match="access.queue"):
        job_manifest(spec_for(cloud, 1), cloud)


def test_prepull_daemonset_targets_the_pool_and_asks_for_no_device():
    cloud = load_federation(REMOTE).cloud("guiyang")
    ds = prepull_manifest(cloud, "ascend-910b", "registry.example.com/crosscloud-worker:ascend-cann8")
    spec = ds["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["image"] == "registry.example.com/crosscloud-worker:ascend-cann8"
    assert spec["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert spec["tolerations"][0]["key"] == "huawei.com/Ascend910"
    assert "huawei.com/Ascend910" not in json.dumps(spec["initContainers"] + spec["containers"])
    assert not prepull_done({"desiredNumberScheduled": 3, "numberReady": 2})
    assert not prepull_done({"desiredNumberScheduled": 0, "numberReady": 0})
    assert prepull_done({"desiredNumberScheduled": 3, "numberReady": 3})


def test_free_capacity_from_recorded_api_responses():
    nodes = json.loads((DATA / "k8s_nodes.json").read_text())["items"]
    pods = json.loads((DATA / "k8s_pods.json").read_text())["items"]
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    # node 1: 8 - 4 running; node 2: 8 - 2 pending-bound (the finished pod holds nothing); node 3 cordoned
    assert free_devices(nodes, pods, "nvidia.com/gpu", a100) == 10
    assert free_devices(nodes, pods, "nvidia.com/gpu") == 10  # the H100 node is full
    assert free_devices(nodes, pods, "huawei.com/Ascend910") == 0
    # cpu: 127.5 x 2 allocatable - 16.1 on node 1 = 111.4 -> 111, + 127 on node 2, + 191 on h100, + 63.5 - 20.5 = 43
    assert free_devices(nodes, pods, "cpu") == 111 + 127 + 191 + 43


# -- the provider operator's request, built from the federation file ---------------------------------------

KUBECONFIG = {  # a cluster that is never contacted: building the request stops at the API boundary
    "apiVersion": "v1", "kind": "Config", "current-context": "test",
    "clusters": [{"name": "test", "cluster": {"server": "https://127.0.0.1:9"}}],
    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    "users": [{"name": "test", "user": {"token": "not-a-real-token"}}],
}


@pytest.fixture()
def planned_run(tmp_path, monkeypatch):
    """A plan of the remote federation (its local cloud's store moved to a folder) naming every kubernetes cloud."""
    from crosscloud.core.job import JobSpec
    from crosscloud.core.presets import preset
    from crosscloud.pipeline.stages import RunRef
    from crosscloud.run.plan import CloudAssignment, Plan
    from crosscloud.store.chunks import BlobRef
    from crosscloud.store.open_store import open_store

    raw = yaml.safe_load(REMOTE.read_text())
    raw["clouds"][0]["store"] = {"url": f"file://{tmp_path / 'beijing'}"}
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    fed = load_federation(path)
    blob = BlobRef(sha256="0" * 64, size=1)
    clouds = [CloudAssignment(name=c.name, role=c.role, method=c.access.method, accelerator=c.pools[0].accelerator,
                              devices=d, throughput=1.0, share=4, shards=[0], image=fed.image_for(c.pools[0].accelerator, "byte-lm"))
              for c, d in ((fed.cloud("wuhan"), 16), (fed.cloud("guiyang"), 8), (fed.cloud("kunshan"), 4))]
    spec = JobSpec()
    plan = Plan(tenant="team-a", run_id=RUN_ID, federation=fed.name, federation_path=str(path), job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud="beijing", clouds=clouds, candidates=[],
                dataset="python-stdlib", shards=[blob], held_out=blob, init=blob, created_at=time.time())
    plan.save(open_store(fed.local_cloud, "team-a"))
    for conn in ("K8S_WUHAN", "K8S_GUIYANG", "K8S_KUNSHAN"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn}", json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": KUBECONFIG}}))
    monkeypatch.setenv("CROSSCLOUD_WUHAN_TEAM_A_SECRET_ACCESS_KEY", SECRET)
    return RunRef(str(path), "team-a", RUN_ID), fed, plan


@pytest.mark.parametrize("cloud_name", ["wuhan", "guiyang", "kunshan"])
def test_operator_request_matches_the_federation(planned_run, cloud_name):
    from kubernetes.client import ApiClient

    from crosscloud_airflow.operators import KubernetesSubTaskOperator

    ref, fed, plan = planned_run
    cloud = fed.cloud(cloud_name)
    op = KubernetesSubTaskOperator(task_id="dispatch_kubernetes", run=ref.to_dict(), cloud=cloud_name)
    _, _, spec, _, manifest, job_op = op.prepare()
    request = job_op.build_job_request_obj()  # what the provider's KubernetesJobOperator sends to the API server
    sent = ApiClient().sanitize_for_serialization(request)
    validate(sent)
    assert SECRET not in json.dumps(sent)
    pool = cloud.pools[0]
    assert job_op.kubernetes_conn_id == cloud.access.connection_id and not job_op.do_xcom_push  # no XCom sidecar
    assert request.metadata.name == manifest["metadata"]["name"] == job_name(spec)
    assert request.metadata.namespace == "crosscloud"
    assert request.metadata.labels["crosscloud.io/cloud"] == cloud_name
    js, want = request.spec, manifest["spec"]
    assert (js.completions, js.parallelism, js.completion_mode, js.backoff_limit) == (
        want["completions"], want["parallelism"], "Indexed", plan.spec.subtask_retries)
    # a failed program (exit 4), a stopped run (exit 3) or a paused one (exit 6) fails the Job at once instead of
    # using up its restarts
    (rule,) = sent["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [3, 4, 6]
    assert bool(js.suspend) == (cloud.access.scheduler == "kueue")
    pod = js.template.spec
    (container,) = pod.containers
    assert container.name == "worker"
    assert container.image == fed.image_for(pool.accelerator, "byte-lm")
    resource = (pool.kubernetes.resource if pool.kubernetes and pool.kubernetes.resource
                else ACCELERATOR_DEFAULTS[pool.accelerator][0])
    per_pod = want["template"]["spec"]["containers"][0]["resources"]["limits"][resource]
    assert container.resources.limits == {resource: per_pod}
    assert container.resources.requests[resource] == per_pod
    assert int(per_pod) * js.completions == plan.cloud(cloud_name).devices
    assert (pod.node_selector or {}) == pool.kubernetes.node_selector
    assert [t.to_dict() for t in pod.tolerations] == [
        {"key": resource, "operator": "Exists", "effect": "NoSchedule", "value": None, "toleration_seconds": None}]
    assert pod.scheduler_name == ("volcano" if cloud.access.scheduler == "volcano" else None)
    labels = request.metadata.labels
    assert ("kueue.x-k8s.io/queue-name" in labels) == (cloud.access.scheduler == "kueue")
    env = {e.name: e for e in container.env}
    secret_ref = env[f"CROSSCLOUD_{cloud_name.upper()}_TEAM_A_SECRET_ACCESS_KEY"].value_from.secret_key_ref
    assert (secret_ref.name, secret_ref.key) == ("crosscloud-store-team-a", "secret_access_key")
    assert all(e.value is None for n, e in env.items() if n.startswith(f"CROSSCLOUD_{cloud_name.upper()}"))
    assert [v.config_map.name for v in pod.volumes] == [request.metadata.name]


def test_federation_refuses_a_kubernetes_cloud_on_a_folder_store():
    from crosscloud.core.federation import FederationError

    raw = yaml.safe_load(REMOTE.read_text())
    raw["clouds"][1]["store"] = {"url": "file://clouds/wuhan"}
    with pytest.raises(FederationError, match=r"clouds.wuhan.store.url: a kubernetes cloud's pods cannot read file://"):
        parse_federation(raw)


def test_job_state_from_recorded_job_statuses():
    statuses = json.loads((DATA / "k8s_job_statuses.json").read_text())
    assert job_state(statuses["suspended_by_kueue"], 2) == "running"
    assert job_state(statuses["one_of_two_pods_done"], 2) == "running"
    assert job_state(statuses["complete"], 2) == "succeeded"
    assert job_state(statuses["pod_failed"], 2) == "failed"
    assert job_state(statuses["deadline_exceeded"], 1) == "failed"
    # written by hand: a pod failed and the Job, within its backoffLimit, starts another (no failure condition yet)
    assert job_state({"active": 1, "failed": 1, "ready": 0, "startTime": "2026-12-03T08:00:05Z"}, 1) == "running"


# -- the inventory asks the cluster's API for what it has free ----------------------------------------------


@pytest.fixture()
def recorded_api_server():
    """An HTTP server on 127.0.0.1 that answers the node and pod lists with the recorded responses."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    answers = {"/api/v1/nodes": DATA / "k8s_nodes.json", "/api/v1/pods": DATA / "k8s_pods.json"}
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server interface
            asked.append(self.path)
            path = answers.get(urlparse(self.path).path)
            body = path.read_bytes() if path else b'{"kind": "Status", "code": 404}'
            self.send_response(200 if path else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()


def test_inventory_shows_what_the_cluster_has_free(recorded_api_server, ledger):
    from kubernetes.client import ApiClient, Configuration

    from crosscloud.backends.kubernetes import set_client_factory
    from crosscloud.pool.inventory import collect

    url, asked = recorded_api_server
    raw = yaml.safe_load(REMOTE.read_text())
    wuhan = next(c for c in raw["clouds"] if c["name"] == "wuhan")
    wuhan["pools"].append({"accelerator": "nvidia-h100", "count": 8, "power_w": 700, "price_per_device_hour": 3.0,
                           "kubernetes": {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}})
    fed = parse_federation(raw)
    set_client_factory(lambda access: ApiClient(Configuration(host=url)))
    try:
        inv = collect(fed, ledger)
    finally:
        set_client_factory(None)
    a100 = next(p for p in inv.cloud("wuhan").pools if p.accelerator == "nvidia-a100")
    # the pool has more devices in the federation than the cluster has free (10 of the recorded A100 nodes):
    # crosscloud offers no more than the cluster has
    assert a100.cluster_free == 10 and a100.free == min(a100.total, 10)
    assert any("labelSelector=nvidia.com%2Fgpu.product%3DNVIDIA-A100-SXM4-80GB" in q for q in asked)
    h100 = next(p for p in inv.cloud("wuhan").pools if p.accelerator == "nvidia-h100")
    assert h100.cluster_free == 0 and h100.free == 0  # the recorded H100 node is full
    # one pod list per cloud, whatever its number of pools; one node list per pool (its selector)
    assert sum(q.startswith("/api/v1/pods") for q in asked) == 3
    assert sum(q.startswith("/api/v1/nodes") for q in asked) == 4
    assert "wuhan/nvidia-a100: the cluster has 10 free" in inv.format()
    assert inv.to_dict()["clouds"][[c.name for c in inv.clouds].index("wuhan")]["pools"][0]["cluster_free"] is not None
    # clouds of other access methods are not asked; admission never asks (no API call inside the ledger lock)
    assert all(p.cluster_free is None for c in inv.clouds if c.method != "kubernetes" for p in c.pools)
    assert all(p.cluster_free is None for c in collect(fed, ledger, clusters=False).clouds for p in c.pools)


def test_an_unreachable_cluster_is_shown_not_fatal(ledger):
    from kubernetes.client import ApiClient, Configuration

    from crosscloud.backends.kubernetes import set_client_factory
    from crosscloud.pool.inventory import collect

    set_client_factory(lambda access: ApiClient(Configuration(host="http://127.0.0.1:9")))  # nothing listens there
    try:
        inv = collect(load_federation(REMOTE), ledger)
    finally:
        set_client_factory(None)
    a100 = next(p for p in inv.cloud("wuhan").pools if p.accelerator == "nvidia-a100")
    assert a100.cluster_free is None and a100.free == a100.total and "cluster not asked" in a100.cluster_note
