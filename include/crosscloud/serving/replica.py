"""Serving replicas on a cloud: a process on a local or ssh cloud, a vLLM Deployment on a Kubernetes cloud.

A replica is ``python -m crosscloud.serving.server`` started through its
cloud's backend, as a training sub-task is: on a local cloud a process session
of this host, on an ssh cloud one on the cloud's host in its prepared
environment, listening at the host's address (``access.serve_host``, else the
address SSH reached) on a port free there. Its handle (a file in the state
folder, or on the host) lets any later task find, read and stop it. ``wait_ready`` returns once
``/health`` answers 200, or raises with the replica's own log when it exited:
a cloud where the model is not warm refuses at start, and says so there.

On Kubernetes a GPU language model is served by vLLM's OpenAI server. An init
container of the crosscloud image runs the same warm check against the cloud's
store and writes the model as a Hugging Face folder (``server --export``) into
a pod-local volume; a cold cloud fails that init container, so the pod never
becomes ready and the router never sends it a request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

import httpx

from crosscloud.backends import get_backend
from crosscloud.backends.base import Handle, SubTaskError, SubTaskSpec
from crosscloud.backends.kubernetes import FEDERATION_MOUNT, LABEL, PoolRequest, namespace, store_secret
from crosscloud.core.federation import Cloud, federation_path, load_federation
from crosscloud.serving.router import Endpoint, Router
from crosscloud.run.plan import Plan
from crosscloud.store.chunks import BlobRef
from crosscloud.store.credentials import credential_env_names, credentials_env

VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
VLLM_PORT = 8000
MODEL_MOUNT = "/models"
SERVED_BY_PROCESS = ("local", "ssh")  # access methods whose replicas crosscloud starts as processes itself
SERVED_BY_VLLM = ("hf-causal-lm",)  # model families a Kubernetes cloud serves (vLLM's Deployment)


class ReplicaError(RuntimeError):
    """A replica that exited or did not become ready; the message carries its log's end."""


@dataclass(frozen=True)
class ServeSpec:
    """What a replica serves: the model artifact, the program that builds it, the program's args."""

    tenant: str
    name: str  # the served model's name, and the replica's handle folder (subtasks/<tenant>/serve-<name>/<cloud>)
    model: str  # sha256[:size] of the weights artifact
    program: str
    args: dict = field(default_factory=dict)
    tokenizer: str | None = None
    federation: str | None = None
    program_code: str | None = None  # sha256:size of the program's code blob, as a run stored it
    family: str | None = None  # the program's model family: which clouds can serve it (``refusal``)

    @classmethod
    def from_plan(cls, plan: Plan, name: str, model: BlobRef, tokenizer: str | None = None) -> ServeSpec:
        """What a run trained, served: its program's stored code, its program args, its final weights (``model``)."""
        if plan.program is None:
            raise ReplicaError(f"run {plan.run_id} names no training program: nothing can build its model")
        code = plan.program.code
        return cls(tenant=plan.tenant, name=name, model=model.text, program=plan.program.file,
                   args=plan.spec.program_run_args(), tokenizer=tokenizer, federation=plan.federation_path,
                   program_code=code.text, family=plan.program.family)

    def server_args(self, cloud: str, port: int, host: str = "127.0.0.1") -> list[str]:
        """The server's command-line arguments on ``cloud``."""
        args = ["--cloud", cloud, "--tenant", self.tenant, "--model", self.model, "--program", self.program,
                "--args", json.dumps(self.args), "--name", self.name, "--host", host, "--port", str(port)]
        args += ["--tokenizer", self.tokenizer] if self.tokenizer else []
        args += ["--program-code", self.program_code] if self.program_code else []
        return args + (["--federation", self.federation] if self.federation else [])


def handle_id(spec: ServeSpec, index: int) -> str:
    """The run id a replica's handle lives under: ``subtasks/<tenant>/serve-<name>-r<index>/<cloud>/``."""
    return f"serve-{spec.name}-r{index}"


def refusal(cloud: Cloud, family: str | None = None) -> str:
    """Why ``cloud`` cannot serve a model of ``family``; empty when it can. Local and ssh clouds serve any family
    with crosscloud's own server; a Kubernetes cloud serves with vLLM, which loads Hugging Face causal LMs."""
    if cloud.access.method in SERVED_BY_PROCESS:
        return ""
    if cloud.access.method == "kubernetes" and family in SERVED_BY_VLLM:
        return ""
    return (f"a {cloud.access.method} cloud serves with vLLM, which loads {', '.join(SERVED_BY_VLLM)} models, not "
            f"{family or 'a model of unknown family'}: serve it on local or ssh clouds")


def start(spec: ServeSpec, cloud: Cloud, index: int = 0, port: int | None = None) -> Handle:
    """Start replica ``index`` on ``cloud`` through its access method (a running one under the same handle is kept,
    not doubled): a process of this host on a local cloud, a process session on the host on an ssh cloud, which
    reads the model from its cloud's store with the tenant's keys and listens where the router reaches it.

    It is a cpu "device" of the cloud while it runs, as the backends count them.
    """
    if cloud.access.method not in SERVED_BY_PROCESS:
        raise ReplicaError(f"cloud {cloud.name}: its replicas are a Deployment (serving.kubernetes), not processes")
    backend, access = get_backend(cloud.access.method), cloud.access.model_dump()
    host = cloud.access.serve_host or backend.address(cloud.name, access)
    remote = cloud.access.method != "local"
    if remote and spec.federation is None:  # the host gets a copy of the federation file in use, named here
        spec = replace(spec, federation=str(federation_path()))
    sub = SubTaskSpec(tenant=spec.tenant, run_id=handle_id(spec, index), cloud=cloud.name, image="", accelerator="cpu",
                      devices=1, module="crosscloud.serving.server", access=access,
                      args=spec.server_args(cloud.name, port or backend.free_port(cloud.name, access), host),
                      env=credentials_env(cloud, spec.tenant) if remote else {})
    try:
        return _with_url(backend.start(sub))
    except SubTaskError as exc:
        raise ReplicaError(str(exc)) from exc


def find(spec: ServeSpec, cloud: Cloud, index: int = 0) -> Handle | None:
    """The handle of replica ``index`` on ``cloud``, running or not, or None if none was started."""
    if cloud.access.method not in SERVED_BY_PROCESS:
        return None
    handle = get_backend(cloud.access.method).find(spec.tenant, handle_id(spec, index), cloud.name,
                                                   cloud.access.model_dump())
    return _with_url(handle) if handle else None


def replica_arg(handle: Handle, flag: str) -> str:
    """One of the replica's own command-line arguments (``--port``, ``--model``...), as its handle recorded them."""
    args = handle.get("args") or handle["command"]
    return args[args.index(flag) + 1]


def _with_url(handle: Handle) -> Handle:
    """The handle with the replica's URL, from its own arguments (a kept replica keeps its address and port)."""
    return {**handle, "url": f"http://{replica_arg(handle, '--host')}:{replica_arg(handle, '--port')}"}


def endpoint_of(handle: Handle, index: int, jurisdiction: str) -> Endpoint:
    """Replica ``index`` as the router reaches it: at the address and port it was started with."""
    return Endpoint(handle["cloud"], index, replica_arg(handle, "--host"), int(replica_arg(handle, "--port")),
                    jurisdiction)


def running(handle: Handle) -> bool:
    return get_backend(handle["backend"]).state(handle) == "running"


def wait_ready(handle: Handle, timeout_s: float = 60.0) -> dict:
    """Block until the replica's /health says ready; its health body. Raises with its log if it exited."""
    backend, deadline = get_backend(handle["backend"]), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if backend.state(handle) != "running":
            log = backend.logs(handle)[0]
            raise ReplicaError(f"replica on {handle['cloud']} exited ({backend.state(handle)}, rc "
                               f"{backend.exit_code(handle)}):\n{log[-1500:]}")
        try:
            answer = httpx.get(f"{handle['url']}/health", timeout=2)
            if answer.status_code == 200:
                return answer.json()
            if answer.json().get("status") == "failed":  # the model did not load: waiting longer will not help
                raise ReplicaError(f"replica on {handle['cloud']} could not load its model: {answer.json()['error']}")
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise ReplicaError(f"replica on {handle['cloud']} not ready within {timeout_s:.0f} s: {backend.logs(handle)[0][-1500:]}")


def stop(handle: Handle, grace_s: float = 10.0) -> None:
    """SIGTERM (uvicorn finishes in-flight requests), then SIGKILL after ``grace_s``."""
    get_backend(handle["backend"]).stop(handle, grace_s=grace_s)


def bring_up(router: Router, spec: ServeSpec, cloud: str, index: int = 0, timeout_s: float = 90.0,
             port: int | None = None) -> Handle:
    """Start a replica on ``cloud``, wait until it answers, and put it behind the router at weight 0 until
    HAProxy's own check passed: from then on ``router.set_weights`` may give its cloud a share."""
    where = load_federation(spec.federation).cloud(cloud)
    if why := refusal(where, spec.family):
        raise ReplicaError(f"cloud {cloud}: {why}")
    router.admits(Endpoint(cloud, index, "", 0, where.jurisdiction))  # before a process starts for nothing
    handle = start(spec, where, index, port)
    wait_ready(handle, timeout_s)
    endpoint = endpoint_of(handle, index, where.jurisdiction)
    router.add(endpoint)
    router.wait_healthy(endpoint.server, timeout_s)
    return handle


def take_down(router: Router, handle: Handle, index: int = 0) -> None:
    """Scale a cloud down by one replica: out of the router once its in-flight requests finished, then stopped."""
    router.remove(Endpoint(handle["cloud"], index, "", 0).server)
    stop(handle)


def deployment_name(spec: ServeSpec) -> str:
    return f"serve-{spec.name}"[:63].rstrip("-")


def serve_labels(spec: ServeSpec, cloud: Cloud) -> dict[str, str]:
    """The labels of the model's pods on ``cloud``: the Deployment selects them, and so does its Service."""
    return {f"{LABEL}/tenant": spec.tenant, f"{LABEL}/serve": spec.name, f"{LABEL}/cloud": cloud.name}


def _store_env(cloud: Cloud, tenant: str) -> list[dict]:
    """The init container's settings: the cloud's plain ones, and its store keys as references to the tenant's Secret."""
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}] + [{"name": k, "value": v} for k, v in sorted(cloud.access.env.items())]
    secret = store_secret(cloud, tenant)
    for var, arg in (credential_env_names(cloud.name, tenant) if secret else {}).items():
        ref = {"name": secret, "key": arg.removeprefix("aws_"), **({"optional": True} if arg == "aws_session_token" else {})}
        env.append({"name": var, "valueFrom": {"secretKeyRef": ref}})
    return env


def federation_configmap(spec: ServeSpec, cloud: Cloud, federation_text: str) -> dict:
    """The federation file the init container reads the cloud's store from, beside the Deployment."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": deployment_name(spec), "namespace": namespace(cloud),
                         "labels": {f"{LABEL}/tenant": spec.tenant, f"{LABEL}/serve": spec.name}},
            "data": {"federation.yaml": federation_text}}


def vllm_deployment(spec: ServeSpec, cloud: Cloud, accelerator: str, crosscloud_image: str,
                    devices: int = 1, replicas: int = 1, vllm_image: str = VLLM_IMAGE) -> dict:
    """A Deployment serving the model with vLLM on ``devices`` of the cloud's ``accelerator`` pool.

    The init container (the crosscloud image) checks the model is warm in the
    cloud's store and exports it as a Hugging Face folder; vLLM then serves that
    folder, OpenAI-compatible, ready when its /health answers.
    """
    pool = PoolRequest.of(cloud, accelerator)
    name = deployment_name(spec)
    labels = serve_labels(spec, cloud)
    folder = f"{MODEL_MOUNT}/{spec.name}"
    in_pod = ServeSpec(**{**spec.__dict__, "federation": f"{FEDERATION_MOUNT}/federation.yaml"})
    export = ["python", "-m", "crosscloud.serving.server", *in_pod.server_args(cloud.name, VLLM_PORT, "0.0.0.0"),
              "--export", folder]
    serve = ["--model", folder, "--served-model-name", spec.name, "--host", "0.0.0.0", "--port", str(VLLM_PORT),
             "--tensor-parallel-size", str(devices)]
    probe = {"httpGet": {"path": "/health", "port": VLLM_PORT}, "periodSeconds": 5, "failureThreshold": 3}
    pod = {
        "initContainers": [{"name": "warm-model", "image": crosscloud_image, "command": export,
                            "env": _store_env(cloud, spec.tenant),
                            "volumeMounts": [{"name": "models", "mountPath": MODEL_MOUNT},
                                             {"name": "federation", "mountPath": FEDERATION_MOUNT, "readOnly": True}]}],
        "containers": [{
            "name": "vllm", "image": vllm_image, "args": serve,
            "ports": [{"containerPort": VLLM_PORT, "name": "http"}],
            "resources": pool.resources(devices),
            "readinessProbe": probe,
            "startupProbe": {**probe, "failureThreshold": 120},  # loading onto the devices takes minutes
            "volumeMounts": [{"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True},
                             {"name": "shm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [{"name": "models", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}},
                    {"name": "federation", "configMap": {"name": name}}],
    }
    if pool.node_selector:
        pod["nodeSelector"] = pool.node_selector
    if pool.tolerations:
        pod["tolerations"] = pool.tolerations
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace(cloud), "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}
