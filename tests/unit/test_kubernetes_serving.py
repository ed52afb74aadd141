"""A model served on a Kubernetes cloud through the API, without a cluster: the Deployment, Service and federation
ConfigMap applied, read back, scaled and removed against a fake API server on 127.0.0.1 that keeps them in memory,
answers as the API server does (201/200/404/409/422, the scale subresource), records every request and checks every
object sent or answered against the Kubernetes schemas (kubernetes-validate, strict). Up to the API boundary only.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
import pytest
import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, FederationError, load_federation, parse_federation
from crosscloud.serving import kubernetes as serving
from crosscloud.serving.kubernetes import KubernetesServeError
from crosscloud.serving.replica import VLLM_PORT, ReplicaError, ServeSpec

pytestmark = [pytest.mark.inference, pytest.mark.kubernetes]

K8S_VERSION = "1.37.0"
REMOTE = DEFAULT_FEDERATION.with_name("federation.remote.yaml")
SECRET = "planted-secret-never-in-a-request"
NS, NAME = "crosscloud", "serve-gpt2-small"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
KINDS = {"configmaps": ("v1", "ConfigMap"), "services": ("v1", "Service"), "deployments": ("apps/v1", "Deployment")}
ROUTE = re.compile(r"^/(api/v1|apis/apps/v1)/namespaces/([^/]+)/(configmaps|services|deployments|pods)"
                   r"(?:/([^/]+))?(?:/(scale|status|log))?$")


@dataclass
class Request:
    method: str
    path: str
    query: dict
    content_type: str
    body: object


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    """Deployments, Services and ConfigMaps in memory, answered as the API server answers; pods and their logs as the
    test sets them (the controllers that would make them are not here)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.requests: list[Request] = []
        self.invalid: list[str] = []
        self.pods: list[dict] = []
        self.logs: dict[tuple[str, str], str] = {}  # (pod, container) -> text
        self.statuses: list[dict] = []  # the Deployment's status at each read; the last one stays
        self.refuse: dict[tuple[str, str], int] = {}  # (method, resource) -> status code
        self.version = 0
        self.lock = threading.Lock()

    def check(self, obj: dict, what: str) -> str | None:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(f"{what}: {'.'.join(map(str, exc.path))}: {exc.message}")
            return exc.message
        return None

    def stamp(self, obj: dict, spec_changed: bool = True) -> None:
        self.version += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.version)
        if obj["kind"] == "Deployment" and spec_changed:
            meta["generation"] = meta.get("generation", 0) + 1

    def handle(self, method: str, path: str, query: dict, content_type: str, body) -> tuple[int, object]:
        with self.lock:
            self.requests.append(Request(method, path, query, content_type, body))
            match = ROUTE.match(path)
            if not match:
                return 404, status(404, "NotFound", "the server could not find the requested resource")
            group, ns, resource, name, sub = match.groups()
            if resource != "pods" and (group == "apis/apps/v1") != (resource == "deployments"):
                return 404, status(404, "NotFound", "the server could not find the requested resource")
            if (method, resource) in self.refuse:
                code = self.refuse[(method, resource)]
                return code, status(code, "Forbidden", f'{resource} is forbidden: User "x" cannot {method.lower()} '
                                                       f'resource "{resource}" in the namespace "{ns}"')
            if resource == "pods":
                return self.pod_answer(ns, name, sub, query)
            key = (resource, ns, name)
            if method == "POST" and name is None:
                return self.create(resource, ns, body)
            if key not in self.objects:
                return 404, status(404, "NotFound", f'{resource} "{name}" not found')
            if method == "GET":
                return 200, self.read(key)
            if method == "PUT":
                return self.replace(key, body)
            if method == "PATCH" and sub == "scale":
                return self.patch_scale(key, content_type, body)
            if method == "DELETE":
                obj = self.objects.pop(key)
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                             "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]}}
            return 405, status(405, "MethodNotAllowed", f"{method} {path} is not supported here")

    def create(self, resource: str, ns: str, body: dict) -> tuple[int, dict]:
        if error := self.check(body, f"POST {resource}"):
            return 422, status(422, "Invalid", error)
        name = body["metadata"]["name"]
        if (body["metadata"].get("namespace") or ns) != ns or (body["apiVersion"], body["kind"]) != KINDS[resource]:
            return 400, status(400, "BadRequest", "the namespace or kind of the object does not match the request")
        if (resource, ns, name) in self.objects:
            return 409, status(409, "AlreadyExists", f'{resource} "{name}" already exists')
        obj = json.loads(json.dumps(body))
        obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp="2026-12-03T08:00:00Z")
        if resource == "deployments":
            obj["status"] = {}
        if resource == "services":
            ip = f"10.96.0.{len(self.objects) + 10}"
            obj["spec"].update(clusterIP=ip, clusterIPs=[ip])
            if obj["spec"].get("type") == "LoadBalancer":
                for port in obj["spec"]["ports"]:
                    port["nodePort"] = 30000 + len(self.objects)
            obj["status"] = {"loadBalancer": {}}
        self.stamp(obj)
        self.objects[(resource, ns, name)] = obj
        return 201, obj

    def read(self, key: tuple[str, str, str]) -> dict:
        obj = self.objects[key]
        if key[0] == "deployments" and self.statuses:
            obj["status"] = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return obj

    def replace(self, key: tuple[str, str, str], body: dict) -> tuple[int, dict]:
        if error := self.check(body, f"PUT {key[0]}"):
            return 422, status(422, "Invalid", error)
        old = self.objects[key]
        version = body["metadata"].get("resourceVersion")
        if not version:
            return 422, status(422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
        if version != old["metadata"]["resourceVersion"]:
            return 409, status(409, "Conflict", f'Operation cannot be fulfilled on {key[0]} "{key[2]}": the object has '
                                                "been modified; please apply your changes to the latest version and try again")
        obj = json.loads(json.dumps(body))
        if key[0] == "services":
            if obj["spec"].setdefault("clusterIP", old["spec"]["clusterIP"]) != old["spec"]["clusterIP"]:
                return 422, status(422, "Invalid", "spec.clusterIPs[0]: Invalid value: may not change once set")
            obj["spec"].setdefault("clusterIPs", old["spec"]["clusterIPs"])
        obj["metadata"].update({k: old["metadata"][k] for k in ("uid", "creationTimestamp", "generation", "namespace")
                                if k in old["metadata"]})
        if "status" in old:
            obj["status"] = old["status"]  # a replace of the object leaves its status alone
        self.stamp(obj, obj.get("spec") != old.get("spec"))
        self.objects[key] = obj
        return 200, obj

    def patch_scale(self, key: tuple[str, str, str], content_type: str, body) -> tuple[int, dict]:
        if content_type.startswith("application/json-patch+json") and not isinstance(body, list):
            return 400, status(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        if not content_type.startswith(("application/merge-patch+json", "application/strategic-merge-patch+json")):
            return 415, status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")
        obj = self.objects[key]
        obj["spec"]["replicas"] = body["spec"]["replicas"]
        self.stamp(obj)
        selector = ",".join(f"{k}={v}" for k, v in obj["spec"]["selector"]["matchLabels"].items())
        return 200, {"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                                   "creationTimestamp")},
                     "spec": {"replicas": obj["spec"]["replicas"]},
                     "status": {"replicas": obj["status"].get("replicas", 0), "selector": selector}}

    def pod_answer(self, ns: str, name: str | None, sub: str | None, query: dict) -> tuple[int, object]:
        if name is None:
            wanted = dict(part.split("=", 1) for part in query.get("labelSelector", [""])[0].split(",") if part)
            items = [p for p in self.pods if p["metadata"]["namespace"] == ns
                     and all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)},
                         "items": items}
        container = query.get("container", [""])[0]
        if sub == "log" and (name, container) in self.logs:
            return 200, self.logs[(name, container)]
        return 400, status(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start')

    def answered(self, method: str, path: str | None = None) -> list[Request]:
        return [r for r in self.requests if r.method == method and (path is None or r.path == path)]


class Handler(BaseHTTPRequestHandler):
    def _any(self):
        url = urlparse(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw) if raw else None
        fake: FakeApiServer = self.server.fake
        code, answer = fake.handle(self.command, url.path, parse_qs(url.query), self.headers.get("Content-Type", ""), body)
        if isinstance(answer, dict) and answer.get("kind") not in (None, "Status") and fake.check(answer, "answer"):
            code, answer = 500, status(500, "InternalError", "the fake API server answered an invalid object")
        data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any  # noqa: N815 - the http.server interface

    def log_message(self, *args):
        pass


@pytest.fixture()
def api(monkeypatch):
    """The fake API server, installed as every cloud's ApiClient; (server, the access sections the factory got)."""
    from kubernetes.client import ApiClient, Configuration

    from crosscloud.backends.kubernetes import set_client_factory

    monkeypatch.setenv("CROSSCLOUD_WUHAN_TEAM_A_SECRET_ACCESS_KEY", SECRET)
    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http.fake = FakeApiServer()
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url, asked = f"http://127.0.0.1:{http.server_address[1]}", []
    set_client_factory(lambda access: (asked.append(access), ApiClient(Configuration(host=url)))[1])
    try:
        yield http.fake, asked
    finally:
        set_client_factory(None)
        http.shutdown()
        http.server_close()
    assert not http.fake.invalid, http.fake.invalid  # every object sent or answered was valid


def wuhan(**access):
    raw = yaml.safe_load(REMOTE.read_text())
    next(c for c in raw["clouds"] if c["name"] == "wuhan")["access"].update(access)
    return parse_federation(raw).cloud("wuhan")


SPEC = ServeSpec(tenant="team-a", name="gpt2-small", model="ab" * 32 + ":1000", program="train.py",
                 args={"seed": 0, "size": "small"}, federation=str(REMOTE))
IMAGE = "registry.example.com/crosscloud-worker:cuda"


def apply(cloud, replicas=2, spec=SPEC):
    serving.apply(spec, cloud, replicas, "nvidia-a100", IMAGE, devices=2)


def test_apply_creates_the_configmap_deployment_and_service_in_the_clouds_namespace(api):
    server, asked = api
    cloud = wuhan()
    apply(cloud)
    posts = server.answered("POST")
    assert [r.path for r in posts] == [f"/api/v1/namespaces/{NS}/configmaps", f"/apis/apps/v1/namespaces/{NS}/deployments",
                                       f"/api/v1/namespaces/{NS}/services"]
    assert SECRET not in json.dumps([r.body for r in server.requests])  # store keys only as Secret references
    configmap, deployment, service = (server.objects[(k, NS, NAME)] for k in ("configmaps", "deployments", "services"))
    assert configmap["data"] == {"federation.yaml": REMOTE.read_text()}
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["name"] == "warm-model" and "--export" in init["command"]
    assert init["command"][init["command"].index("--cloud") + 1] == "wuhan"  # the warm check reads wuhan's store
    assert init["command"][init["command"].index("--model") + 1] == SPEC.model
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert {"name": "federation", "configMap": {"name": NAME}} in pod["volumes"]
    labels = {"crosscloud.io/tenant": "team-a", "crosscloud.io/serve": "gpt2-small", "crosscloud.io/cloud": "wuhan"}
    assert deployment["spec"]["selector"]["matchLabels"] == deployment["spec"]["template"]["metadata"]["labels"] == labels
    # the Service sends requests to these pods, on vLLM's named port, and only to ready ones (no publishNotReadyAddresses)
    assert service["spec"]["selector"] == labels and service["spec"]["type"] == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert port["port"] == VLLM_PORT and port["targetPort"] == "http"
    assert {"containerPort": VLLM_PORT, "name": "http"} in pod["containers"][0]["ports"]
    assert "publishNotReadyAddresses" not in service["spec"]
    # every call went through the factory (in Airflow: the provider's KubernetesHook) for wuhan's Connection, once
    assert [a["connection_id"] for a in asked] == ["k8s_wuhan"]


def test_applying_again_replaces_each_object_and_duplicates_none(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud)
    cluster_ip = server.objects[("services", NS, NAME)]["spec"]["clusterIP"]
    versions = {k: o["metadata"]["resourceVersion"] for k, o in server.objects.items()}
    server.requests.clear()
    apply(cloud, replicas=3)
    assert len(server.objects) == 3
    assert [r.method for r in server.requests] == ["POST", "GET", "PUT"] * 3  # 409, read, replace at that version
    for put in server.answered("PUT"):
        kind = put.path.split("/")[-2]
        assert put.body["metadata"]["resourceVersion"] == versions[(kind, NS, NAME)]
    assert server.objects[("deployments", NS, NAME)]["spec"]["replicas"] == 3
    assert server.objects[("services", NS, NAME)]["spec"]["clusterIP"] == cluster_ip  # kept: it may not change


def test_an_object_of_the_same_name_that_is_not_this_models_is_not_replaced(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud, spec=ServeSpec(**{**SPEC.__dict__, "tenant": "team-b"}))  # another tenant's model of that name
    server.requests.clear()
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: ConfigMap crosscloud/serve-gpt2-small exists and is "
                                                   r"not tenant team-a's model gpt2-small: serve it under another name"):
        apply(cloud)
    assert not server.answered("PUT")
    assert server.objects[("deployments", NS, NAME)]["metadata"]["labels"]["crosscloud.io/tenant"] == "team-b"


def ready_status(ready: int, wanted: int, **more) -> dict:
    return {"observedGeneration": 1, "replicas": wanted, "updatedReplicas": wanted, "readyReplicas": ready,
            "availableReplicas": ready, **more}


def pod(name: str, status: dict) -> dict:
    labels = {"crosscloud.io/tenant": "team-a", "crosscloud.io/serve": "gpt2-small", "crosscloud.io/cloud": "wuhan"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]}, "status": status}


def test_wait_ready_returns_once_the_deployment_status_shows_ready_pods(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud)
    server.statuses = [{}, ready_status(0, 2), ready_status(1, 2), ready_status(2, 2)]
    assert serving.wait_ready(SPEC, cloud, at_least=1, timeout_s=10, poll_s=0.01) == 1
    assert serving.readiness(SPEC, cloud) == (2, 2)
    server.statuses = [ready_status(1, 2), ready_status(2, 2)]
    assert serving.wait_ready(SPEC, cloud, timeout_s=10, poll_s=0.01) == 2  # default: every wanted pod
    assert len(server.answered("GET", DEPLOYMENT)) == 3 + 1 + 2  # it polled until the status said so


def test_wait_ready_times_out_naming_the_cloud_and_what_the_api_says(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud)
    condition = {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                 "message": "Deployment does not have minimum availability.", "lastUpdateTime": "2026-12-03T08:00:00Z",
                 "lastTransitionTime": "2026-12-03T08:00:00Z"}
    server.statuses = [ready_status(0, 2, conditions=[condition], unavailableReplicas=2)]
    server.pods = [pod("serve-gpt2-small-7d9f-abcde", status={"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]})]
    started = time.monotonic()
    with pytest.raises(KubernetesServeError) as caught:
        serving.wait_ready(SPEC, cloud, timeout_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - started < 5
    message = str(caught.value)
    assert message.startswith("cloud wuhan: 0 of 2 pods of Deployment crosscloud/serve-gpt2-small ready after 0 s")
    assert "Deployment does not have minimum availability." in message
    assert "0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in message
    assert "kubectl -n crosscloud describe deployment serve-gpt2-small" in message
    assert isinstance(caught.value, ReplicaError)  # what the fleet already catches for a replica that is not ready


def test_a_cold_cloud_is_refused_at_once_with_the_warm_checks_words(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud)
    server.statuses = [ready_status(0, 2)]
    refused = "crosscloud serve: refused to start: cloud wuhan: no artifact abababababab here (no manifest): preheat the model to wuhan"
    crashed = {"name": "warm-model", "ready": False, "restartCount": 2, "image": IMAGE, "imageID": "",
               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
               "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}}}
    server.pods = [pod("serve-gpt2-small-7d9f-abcde", {"phase": "Pending", "initContainerStatuses": [crashed]})]
    server.logs[("serve-gpt2-small-7d9f-abcde", "warm-model")] = f"{refused}\n"
    started = time.monotonic()
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: model gpt2-small is not warm there") as caught:
        serving.wait_ready(SPEC, cloud, timeout_s=60, poll_s=0.05)
    assert time.monotonic() - started < 5  # waiting cannot warm it: refused at the first look
    assert refused in str(caught.value) and "preheat the model to wuhan" in str(caught.value)
    (listed,) = [r for r in server.answered("GET") if r.path.endswith("/pods")]
    assert listed.query["labelSelector"] == ["crosscloud.io/tenant=team-a,crosscloud.io/serve=gpt2-small,crosscloud.io/cloud=wuhan"]
    # a new try running (the model preheated meanwhile?) is waited for
    crashed["state"] = {"running": {"startedAt": "2026-12-03T08:05:00Z"}}
    with pytest.raises(KubernetesServeError, match=r"ready after 0 s"):
        serving.wait_ready(SPEC, cloud, timeout_s=0.1, poll_s=0.05)
    # a warm check that failed otherwise (the store unreachable) may pass on a restart: reported on timeout instead
    crashed["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}
    crashed["lastState"]["terminated"]["exitCode"] = 1
    with pytest.raises(KubernetesServeError, match=r"warm check \(warm-model\) exited 1.*CrashLoopBackOff"):
        serving.wait_ready(SPEC, cloud, timeout_s=0.1, poll_s=0.05)


def test_scale_patches_the_scale_subresource_and_nothing_else(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud)
    template = json.dumps(server.objects[("deployments", NS, NAME)]["spec"]["template"])
    server.requests.clear()
    serving.scale(SPEC, cloud, 5)
    (patch,) = server.requests
    assert (patch.method, patch.path) == ("PATCH", f"{DEPLOYMENT}/scale")
    assert patch.content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json")
    assert patch.body == {"spec": {"replicas": 5}}
    assert serving.readiness(SPEC, cloud) == (0, 5)
    assert json.dumps(server.objects[("deployments", NS, NAME)]["spec"]["template"]) == template  # no pod restarts
    serving.scale(SPEC, cloud, 0)
    assert server.objects[("deployments", NS, NAME)]["spec"]["replicas"] == 0
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: no Deployment crosscloud/serve-other to scale; apply it first"):
        serving.scale(ServeSpec(**{**SPEC.__dict__, "name": "other"}), cloud, 1)


def test_endpoint_is_the_services_cluster_ip_or_its_load_balancers_address(api):
    server, _ = api
    apply(wuhan())
    cluster_ip = server.objects[("services", NS, NAME)]["spec"]["clusterIP"]
    assert serving.endpoint(SPEC, wuhan()) == (cluster_ip, VLLM_PORT)
    server.objects.clear()
    balanced = wuhan(serve_service_type="LoadBalancer")
    apply(balanced)
    service = server.objects[("services", NS, NAME)]
    assert service["spec"]["type"] == "LoadBalancer"
    assert serving.endpoint(SPEC, balanced) == (service["spec"]["clusterIP"], VLLM_PORT)  # no external address yet
    service["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}
    assert serving.endpoint(SPEC, balanced) == ("203.0.113.7", VLLM_PORT)
    service["status"] = {"loadBalancer": {"ingress": [{"hostname": "serve.wuhan.example.com"}]}}
    assert serving.endpoint(SPEC, balanced) == ("serve.wuhan.example.com", VLLM_PORT)
    server.requests.clear()
    apply(balanced)  # applied again: the assigned cluster IP and the load balancer's address stay
    assert serving.endpoint(SPEC, balanced) == ("serve.wuhan.example.com", VLLM_PORT)


def test_remove_deletes_all_three_and_what_is_gone_is_fine(api):
    server, _ = api
    cloud = wuhan()
    apply(cloud)
    server.requests.clear()
    serving.remove(SPEC, cloud)
    assert sorted(r.path for r in server.answered("DELETE")) == sorted(
        [f"/api/v1/namespaces/{NS}/configmaps/{NAME}", DEPLOYMENT, f"/api/v1/namespaces/{NS}/services/{NAME}"])
    assert not server.objects
    assert server.answered("DELETE", DEPLOYMENT)[0].body["propagationPolicy"] == "Background"  # its pods go too
    serving.remove(SPEC, cloud)  # 404s
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: no Deployment crosscloud/serve-gpt2-small for "
                                                   r"model gpt2-small; apply it first"):
        serving.readiness(SPEC, cloud)
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: no Service crosscloud/serve-gpt2-small"):
        serving.endpoint(SPEC, cloud)


def test_a_refusal_or_an_unreachable_cluster_names_the_cloud_and_what_to_do(api):
    from kubernetes.client import ApiClient, Configuration

    from crosscloud.backends.kubernetes import set_client_factory

    server, _ = api
    server.refuse[("POST", "deployments")] = 403
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: creating Deployment crosscloud/serve-gpt2-small: the "
                                                   r"API server answered 403 \(deployments is forbidden.*grant the account "
                                                   r"of Connection k8s_wuhan.*RBAC"):
        apply(wuhan())
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: -1 replicas asked for; ask for 0 or more"):
        serving.scale(SPEC, wuhan(), -1)
    set_client_factory(lambda access: ApiClient(Configuration(host="http://127.0.0.1:9")))  # nothing listens there
    with pytest.raises(KubernetesServeError, match=r"cloud wuhan: reading Deployment .*: no answer from the cluster's "
                                                   r"API server .*check that this host reaches the cluster of Connection k8s_wuhan"):
        serving.readiness(SPEC, wuhan())


def test_the_service_type_is_a_federation_setting():
    assert load_federation(REMOTE).cloud("wuhan").access.serve_service_type == "ClusterIP"
    assert serving.service_manifest(SPEC, wuhan(serve_service_type="LoadBalancer"))["spec"]["type"] == "LoadBalancer"
    kubernetes_validate.validate(serving.service_manifest(SPEC, wuhan()), K8S_VERSION, strict=True)
    with pytest.raises(FederationError, match="serve_service_type"):
        wuhan(serve_service_type="NodePort")
