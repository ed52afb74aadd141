"""Serving a model on a Kubernetes cloud: one vLLM Deployment, its Service and its federation ConfigMap, through the API.

A cloud's replicas are the pods of one Deployment (``replica.vllm_deployment``)
scaled to the cloud's replica count: Kubernetes keeps that many running and
replaces the ones that die, scaling is its scale subresource, and the router
reaches them all through the one Service, which sends requests only to ready
pods (kube-proxy spreads them within the cloud; the router's weights split
traffic between clouds). A pod is ready once its init container found the
model warm in the cloud's store and vLLM's /health answers, so a cold cloud
never gets a request, and ``wait_ready`` says so at once.

Every call goes through ``backends.kubernetes.api_client``: in Airflow the
``ApiClient`` of the cncf-kubernetes provider's ``KubernetesHook`` for the
cloud's Connection (the plugin installs it), elsewhere the kubeconfig. This
module never imports Airflow. It is verified up to the API boundary only
(tests/unit/test_kubernetes_serving.py: requests recorded by a fake API server
and checked against the Kubernetes schemas); no cluster runs here.
"""

from __future__ import annotations

import json
import time

from crosscloud.backends.kubernetes import api_client, namespace
from crosscloud.core.federation import Cloud, Federation, federation_path
from crosscloud.serving.offers import serving_pool
from crosscloud.serving.replica import (
    VLLM_PORT,
    ReplicaError,
    ServeSpec,
    deployment_name,
    federation_configmap,
    refusal,
    serve_labels,
    vllm_deployment,
)
from crosscloud.serving.router import Endpoint, Router

POLL_S = 2.0  # how often wait_ready asks the API server
REQUEST_TIMEOUT_S = 30  # one API call; a cluster that does not answer in this is reported, not waited on
INIT_CONTAINER = "warm-model"  # vllm_deployment's init container: the warm check and the export
NOT_WARM_EXIT = 3  # crosscloud.serving.server's exit code on a cloud where the model is not warm


class KubernetesServeError(ReplicaError):
    """A cloud's API server refused or did not answer, or the model's pods did not become ready; names the cloud."""


def _apis(cloud: Cloud):
    from kubernetes import client

    api = api_client(cloud.access.model_dump())
    return client.AppsV1Api(api), client.CoreV1Api(api)


def _as_dict(api, obj) -> dict:
    """An API answer as the API server's JSON (camelCase), whatever model class the client built."""
    return api.api_client.sanitize_for_serialization(obj) or {}


def _hint(cloud: Cloud, status: int | None) -> str:
    """What to do about a failed call, by its HTTP status."""
    conn, ns = cloud.access.connection_id or "(kubeconfig)", namespace(cloud)
    return {
        None: f"check that this host reaches the cluster of Connection {conn}",
        401: f"the cluster refused the credentials of Connection {conn}: renew them",
        403: f"grant the account of Connection {conn} this verb in namespace {ns} (RBAC: deployments, "
             "deployments/scale, services, configmaps, pods, pods/log)",
        404: f"create namespace {ns}, or set clouds.{cloud.name}.access.namespace",
        409: "another writer changed it meanwhile: apply again",
        422: "the API server refused the manifest: check the cloud's pool settings (pools[].kubernetes)",
    }.get(status, "retry, and if it persists check the cluster's API server")


def _call(cloud: Cloud, what: str, fn, *args, allow: tuple[int, ...] = (), **kwargs):
    """One API call; an error names the cloud and says what to do. A status in ``allow`` answers None."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
    except ApiException as exc:
        if exc.status in allow:
            return None
        try:
            detail = json.loads(exc.body or "{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            detail = exc.reason
        raise KubernetesServeError(f"cloud {cloud.name}: {what}: the API server answered {exc.status} ({detail}); "
                                   f"{_hint(cloud, exc.status)}") from None
    except (HTTPError, OSError) as exc:
        raise KubernetesServeError(f"cloud {cloud.name}: {what}: no answer from the cluster's API server ({exc}); "
                                   f"{_hint(cloud, None)}") from None


def service_manifest(spec: ServeSpec, cloud: Cloud) -> dict:
    """The Service the router reaches the model's ready pods on ``cloud`` through (``access.serve_service_type``)."""
    labels = serve_labels(spec, cloud)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": deployment_name(spec), "namespace": namespace(cloud), "labels": labels},
            "spec": {"type": cloud.access.serve_service_type, "selector": labels,
                     "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}]}}


def _ours(spec: ServeSpec, current: dict) -> bool:
    """Whether an existing object of the model's name is this tenant's copy of this model (not someone else's)."""
    labels = (current.get("metadata") or {}).get("labels") or {}
    return labels.get("crosscloud.io/tenant") == spec.tenant and labels.get("crosscloud.io/serve") == spec.name


def _create_or_replace(spec: ServeSpec, cloud: Cloud, manifest: dict, api, verb: str) -> None:
    """Create the object; where it exists (409), replace it at the version read, keeping what the cluster assigned.

    Only an object labelled as this tenant's copy of this model is replaced: another one of the same name stays.
    """
    kind, ns, name = manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    where = f"{kind} {ns}/{name}"
    if _call(cloud, f"creating {where}", getattr(api, f"create_namespaced_{verb}"), ns, manifest,
             allow=(409,)) is not None:
        return
    current = _as_dict(api, _call(cloud, f"reading {where}", getattr(api, f"read_namespaced_{verb}"), name, ns))
    if not _ours(spec, current):
        raise KubernetesServeError(f"cloud {cloud.name}: {where} exists and is not tenant {spec.tenant}'s model "
                                   f"{spec.name}: serve it under another name, or remove that {kind}")
    body = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    if kind == "Service":  # immutable once assigned
        kept = {k: v for k, v in current.get("spec", {}).items() if k in ("clusterIP", "clusterIPs")}
        body["spec"] = {**manifest["spec"], **kept}
    _call(cloud, f"replacing {where}", getattr(api, f"replace_namespaced_{verb}"), name, ns, body)


def apply(spec: ServeSpec, cloud: Cloud, replicas: int, accelerator: str, crosscloud_image: str, devices: int = 1,
          federation_text: str | None = None) -> None:
    """Create, or replace where they exist, the model's federation ConfigMap, Deployment (``replicas`` pods of
    ``devices`` ``accelerator`` devices) and Service on ``cloud``: applying the same again changes nothing.

    ``federation_text`` is the federation file the init container reads the cloud's store from (default: the
    file of ``spec.federation``, else the one in use).
    """
    if replicas < 0:
        raise KubernetesServeError(f"cloud {cloud.name}: {replicas} replicas asked for; ask for 0 or more")
    if federation_text is None:
        path = federation_path(spec.federation)
        try:
            federation_text = path.read_text()
        except OSError as exc:
            raise KubernetesServeError(f"cloud {cloud.name}: cannot read the federation file {path} for the pods "
                                       f"({exc}); pass federation_text or set CROSSCLOUD_FEDERATION") from None
    apps, core = _apis(cloud)
    _create_or_replace(spec, cloud, federation_configmap(spec, cloud, federation_text), core, "config_map")
    deployment = vllm_deployment(spec, cloud, accelerator, crosscloud_image, devices=devices, replicas=replicas)
    _create_or_replace(spec, cloud, deployment, apps, "deployment")
    _create_or_replace(spec, cloud, service_manifest(spec, cloud), core, "service")


def scale(spec: ServeSpec, cloud: Cloud, replicas: int) -> None:
    """Set the number of the model's pods on ``cloud`` through the Deployment's scale subresource (nothing else
    of the Deployment changes, so no pod restarts)."""
    if replicas < 0:
        raise KubernetesServeError(f"cloud {cloud.name}: {replicas} replicas asked for; ask for 0 or more")
    apps, _ = _apis(cloud)
    name, ns = deployment_name(spec), namespace(cloud)
    # a merge patch of the one field, said explicitly (a JSON patch would need a list of operations)
    found = _call(cloud, f"scaling Deployment {ns}/{name} to {replicas}", apps.patch_namespaced_deployment_scale,
                  name, ns, {"spec": {"replicas": replicas}}, allow=(404,), _content_type="application/merge-patch+json")
    if found is None:
        raise KubernetesServeError(f"cloud {cloud.name}: no Deployment {ns}/{name} to scale; apply it first "
                                   "(serving.kubernetes.apply)")


def _existing(spec: ServeSpec, cloud: Cloud, api, kind: str, verb: str) -> dict:
    """The model's ``kind`` object on ``cloud`` as the API server has it; an error that says to apply it first."""
    name, ns = deployment_name(spec), namespace(cloud)
    found = _call(cloud, f"reading {kind} {ns}/{name}", getattr(api, f"read_namespaced_{verb}"), name, ns, allow=(404,))
    if found is None:
        raise KubernetesServeError(f"cloud {cloud.name}: no {kind} {ns}/{name} for model {spec.name}; apply it "
                                   "first (serving.kubernetes.apply)")
    return _as_dict(api, found)


def _deployment(spec: ServeSpec, cloud: Cloud) -> dict:
    return _existing(spec, cloud, _apis(cloud)[0], "Deployment", "deployment")


def _counts(deployment: dict) -> tuple[int, int]:
    return (deployment.get("status") or {}).get("readyReplicas") or 0, (deployment.get("spec") or {}).get("replicas") or 0


def readiness(spec: ServeSpec, cloud: Cloud) -> tuple[int, int]:
    """(pods ready, pods wanted) of the model's Deployment on ``cloud``: ready pods are the ones the Service sends
    requests to."""
    return _counts(_deployment(spec, cloud))


def _pods(spec: ServeSpec, cloud: Cloud) -> list[dict]:
    _, core = _apis(cloud)
    selector = ",".join(f"{k}={v}" for k, v in serve_labels(spec, cloud).items())
    pods = _call(cloud, f"listing the pods of model {spec.name}", core.list_namespaced_pod, namespace(cloud),
                 label_selector=selector)
    return _as_dict(core, pods).get("items") or []


def _init_exit(pod: dict) -> int | None:
    """The exit code of the pod's last finished warm check (waiting to restart: the previous one); None while one
    runs or none ran yet."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") == INIT_CONTAINER:
            state = status.get("state") or {}
            if "running" in state:  # a new try, whose answer is not known yet
                return None
            finished = state.get("terminated") or (status.get("lastState") or {}).get("terminated") or {}
            return finished.get("exitCode")
    return None


def _warm_check_log(cloud: Cloud, pod: dict) -> str:
    """The last lines the warm check wrote in ``pod``: what is not warm and what to preheat; empty if unreadable."""
    from kubernetes.client.exceptions import ApiException

    _, core = _apis(cloud)
    name, ns = pod["metadata"]["name"], namespace(cloud)
    try:
        text = core.read_namespaced_pod_log(name, ns, container=INIT_CONTAINER, tail_lines=5,
                                            _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException:
        try:  # restarted since: the failed run is the previous one
            text = core.read_namespaced_pod_log(name, ns, container=INIT_CONTAINER, tail_lines=5, previous=True,
                                                _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException:
            return ""
    return " ".join(str(text).split())


def _not_warm(spec: ServeSpec, cloud: Cloud, pods: list[dict]) -> str:
    """Why the model cannot be served on ``cloud`` however long one waits: its warm check refused; else empty."""
    pod = next((p for p in pods if _init_exit(p) == NOT_WARM_EXIT), None)
    if pod is None:
        return ""
    log = _warm_check_log(cloud, pod)
    return (f"cloud {cloud.name}: model {spec.name} is not warm there: the warm check ({INIT_CONTAINER}) of pod "
            f"{pod['metadata']['name']} exited {NOT_WARM_EXIT}{f' ({log})' if log else ''}; preheat the model to "
            f"{cloud.name}, then its pods start on their next restart")


def _why(deployment: dict, pods: list[dict]) -> list[str]:
    """What the API server says keeps the pods from being ready: failing conditions, unscheduled or waiting pods."""
    failing = {"Available": "False", "Progressing": "False", "ReplicaFailure": "True"}
    found = [f"Deployment {c['type']}: {c.get('message') or c.get('reason')}"
             for c in (deployment.get("status") or {}).get("conditions") or []
             if c.get("type") in failing and c.get("status") == failing[c["type"]]]
    for pod in pods:
        status, name = pod.get("status") or {}, pod["metadata"]["name"]
        found += [f"pod {name} not scheduled: {c.get('message') or c.get('reason')}"
                  for c in status.get("conditions") or [] if c.get("type") == "PodScheduled" and c.get("status") == "False"]
        if (code := _init_exit(pod)) not in (None, 0):
            found.append(f"pod {name}: the warm check ({INIT_CONTAINER}) exited {code}")
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
                found.append(f"pod {name} container {container.get('name')}: {waiting['reason']}"
                             f"{': ' + waiting['message'] if waiting.get('message') else ''}")
    return list(dict.fromkeys(found))


def wait_ready(spec: ServeSpec, cloud: Cloud, at_least: int | None = None, timeout_s: float = 900.0,
               poll_s: float = POLL_S) -> int:
    """Block until at least ``at_least`` (default: all wanted) of the model's pods on ``cloud`` are ready; how many are.

    A cold cloud is refused as soon as a warm check says so (waiting cannot warm it); on timeout the error
    carries what the API server says about the Deployment and its pods (loading a model takes minutes).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        deployment = _deployment(spec, cloud)
        ready, wanted = _counts(deployment)
        need = wanted if at_least is None else at_least
        if ready >= need:
            return ready
        pods = _pods(spec, cloud)
        if cold := _not_warm(spec, cloud, pods):
            raise KubernetesServeError(cold)
        if time.monotonic() >= deadline:
            name, ns = deployment_name(spec), namespace(cloud)
            why = "; ".join(_why(deployment, pods)) or f"{len(pods)} pods, none failing yet"
            raise KubernetesServeError(
                f"cloud {cloud.name}: {ready} of {need} pods of Deployment {ns}/{name} ready after {timeout_s:.0f} s "
                f"({why}); see kubectl -n {ns} describe deployment {name}, or wait longer")
        time.sleep(poll_s)


def endpoint(spec: ServeSpec, cloud: Cloud) -> tuple[str, int]:
    """(host, port) where the router reaches the model's Service on ``cloud``: the load balancer's address once it
    has one, else the cluster IP (reachable from inside the cluster's network)."""
    service = _existing(spec, cloud, _apis(cloud)[1], "Service", "service")
    port = next((p["port"] for p in service["spec"].get("ports") or [] if p.get("name") == "http"), VLLM_PORT)
    for ingress in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
        if ingress.get("ip") or ingress.get("hostname"):
            return ingress.get("ip") or ingress["hostname"], port
    address = service["spec"].get("clusterIP")
    if not address or address == "None":
        raise KubernetesServeError(f"cloud {cloud.name}: Service {namespace(cloud)}/{deployment_name(spec)} has no address yet; apply it again "
                                   "(serving.kubernetes.apply) so that it gets a cluster IP")
    return address, port


def remove(spec: ServeSpec, cloud: Cloud) -> None:
    """Delete the model's Deployment (its pods stop; vLLM finishes in-flight requests), Service and ConfigMap on
    ``cloud``; what is already gone is fine. Take the cloud out of the router first."""
    from kubernetes import client

    apps, core = _apis(cloud)
    name, ns = deployment_name(spec), namespace(cloud)
    background = client.V1DeleteOptions(propagation_policy="Background")
    _call(cloud, f"deleting Deployment {ns}/{name}", apps.delete_namespaced_deployment, name, ns, body=background,
          allow=(404,))
    _call(cloud, f"deleting Service {ns}/{name}", core.delete_namespaced_service, name, ns, allow=(404,))
    _call(cloud, f"deleting ConfigMap {ns}/{name}", core.delete_namespaced_config_map, name, ns, allow=(404,))


# -- the fleet's view: a cloud's Deployment as one replica behind the router (its Service) -------------------------

def replica_handle(spec: ServeSpec, cloud: Cloud) -> dict | None:
    """The model's pods on ``cloud`` as the fleet counts them: one replica at the Service's address, with the pods
    ready now; None when no Deployment serves it there or none of its pods is ready."""
    try:
        ready, wanted = readiness(spec, cloud)
        host, port = endpoint(spec, cloud) if ready else ("", 0)
    except KubernetesServeError:
        return None
    if not ready:
        return None
    return {"backend": "kubernetes", "cloud": cloud.name, "url": f"http://{host}:{port}", "pods": wanted,
            "ready": ready, "args": ["--model", spec.model, "--host", host, "--port", str(port)]}


def bring_up(router: Router, fed: Federation, spec: ServeSpec, cloud: Cloud, replicas: int,
             timeout_s: float = 900.0) -> dict:
    """Serve ``spec`` on ``cloud`` with ``replicas`` pods: applied (a new version rolls out pod by pod, the Service
    sending requests only to ready ones), every pod ready, and the Service behind the router at weight 0 until
    HAProxy's own check passed. The pods use the cloud's serving pool, one device each."""
    if why := refusal(cloud, spec.family):
        raise KubernetesServeError(f"cloud {cloud.name}: {why}")
    pool = serving_pool(cloud)
    image = fed.image_for(pool.accelerator, spec.family or "") if pool else None
    if image is None:
        raise KubernetesServeError(f"cloud {cloud.name}: no image adapted to {spec.family} on "
                                   f"{pool.accelerator if pool else 'a pool with datasheet figures'} for the warm check: "
                                   "register one in the federation's images[]")
    router.admits(Endpoint(cloud.name, 0, "", 0, cloud.jurisdiction))  # before anything is applied for nothing
    apply(spec, cloud, replicas, pool.accelerator, image)
    wait_ready(spec, cloud, replicas, timeout_s)
    host, port = endpoint(spec, cloud)
    service = Endpoint(cloud.name, 0, host, port, cloud.jurisdiction)
    if service.server not in router.endpoints:
        router.add(service)
        router.wait_healthy(service.server, min(timeout_s, 120.0))
    return replica_handle(spec, cloud)


def take_down(router: Router | None, spec: ServeSpec, cloud: Cloud) -> None:
    """Stop serving on ``cloud``: out of the router (if it runs) once its in-flight requests finished, then removed."""
    server = Endpoint(cloud.name, 0, "", 0).server
    if router is not None and server in router.endpoints:
        router.remove(server)
    remove(spec, cloud)
