"""A fake Kubernetes API server on 127.0.0.1 for the tests that stop at the API boundary: Deployments, Services
and ConfigMaps kept in memory and answered as the API server answers them, every request recorded, every object
sent or answered checked against the Kubernetes schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

K8S_VERSION = "1.37.0"
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
        # standing in for the controllers: every wanted pod ready at the next read (the Deployment controller and
        # the kubelet), and a LoadBalancer Service's external address (the cloud's load balancer)
        self.pods_become_ready = False
        self.load_balancer_ip: str | None = None
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
            ingress = [{"ip": self.load_balancer_ip}] if self.load_balancer_ip and obj["spec"].get("type") == "LoadBalancer" else []
            obj["status"] = {"loadBalancer": {"ingress": ingress} if ingress else {}}
        self.stamp(obj)
        self.objects[(resource, ns, name)] = obj
        return 201, obj

    def read(self, key: tuple[str, str, str]) -> dict:
        obj = self.objects[key]
        if key[0] == "deployments" and self.statuses:
            obj["status"] = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        elif key[0] == "deployments" and self.pods_become_ready:
            obj["status"] = ready_status(obj["spec"]["replicas"], obj["spec"]["replicas"])
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




def ready_status(ready: int, wanted: int, **more) -> dict:
    return {"observedGeneration": 1, "replicas": wanted, "updatedReplicas": wanted, "readyReplicas": ready,
            "availableReplicas": ready, **more}


@contextmanager
def fake_api_server() -> Iterator[tuple[FakeApiServer, list[dict]]]:
    """The fake API server, installed as every cloud's ApiClient; (server, the access sections the factory got)."""
    from kubernetes.client import ApiClient, Configuration

    from crosscloud.backends.kubernetes import set_client_factory

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
