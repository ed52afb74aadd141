"""A model served on a Kubernetes cloud through the API, without a cluster: the Deployment, Service and federation
ConfigMap applied, read back, scaled and removed against a fake API server on 127.0.0.1 that keeps them in memory,
answers as the API server does (201/200/404/409/422, the scale subresource), records every request and checks every
object sent or answered against the Kubernetes schemas (kubernetes-validate, strict). Up to the API boundary only.
"""

from __future__ import annotations

import json
import time

import kubernetes_validate
import pytest
import yaml
from k8sapiserver import K8S_VERSION, fake_api_server, ready_status

from crosscloud.core.federation import DEFAULT_FEDERATION, FederationError, load_federation, parse_federation
from crosscloud.serving import kubernetes as serving
from crosscloud.serving.kubernetes import KubernetesServeError
from crosscloud.serving.replica import VLLM_PORT, ReplicaError, ServeSpec

pytestmark = [pytest.mark.inference, pytest.mark.kubernetes]

SECRET = "planted-secret-never-in-a-request"
NS, NAME = "crosscloud", "serve-gpt2-small"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
REMOTE = DEFAULT_FEDERATION.with_name("federation.remote.yaml")


@pytest.fixture()
def api(monkeypatch):
    """The fake API server, installed as every cloud's ApiClient; (server, the access sections the factory got)."""
    monkeypatch.setenv("CROSSCLOUD_WUHAN_TEAM_A_SECRET_ACCESS_KEY", SECRET)
    with fake_api_server() as (fake, asked):
        yield fake, asked
    assert not fake.invalid, fake.invalid  # every object sent or answered was valid


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
