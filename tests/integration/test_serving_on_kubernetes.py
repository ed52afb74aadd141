"""The fleet serving from a Kubernetes cloud, up to the API boundary: its Deployment and Service applied, scaled and
removed through the fake API server (tests/k8sapiserver.py), and the router (a real HAProxy) reaching the Service.

No cluster runs here. The fake server stands in for the controllers (every wanted pod ready, a load balancer's
address), and a small HTTP server at that address answers as vLLM's pods would behind the Service.
"""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from k8sapiserver import fake_api_server
from servingload import Load, phase

from crosscloud.core.federation import DEFAULT_FEDERATION
from crosscloud.ledger import Ledger
from crosscloud.serving.fleet import Fleet
from crosscloud.serving.replica import VLLM_PORT, ServeSpec
from crosscloud.serving.server import CLOUD_HEADER

pytestmark = [pytest.mark.inference, pytest.mark.kubernetes]

NS, NAME = "crosscloud", "serve-gpt2-served"


class VllmLike(BaseHTTPRequestHandler):
    """What the Service reaches: /health answers 200 with no body (as vLLM's does), completions answer 4 tokens."""

    def do_GET(self):  # noqa: N802 - the http.server interface
        self._answer(200 if self.path == "/health" else 404, b"")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = {"object": "text_completion", "choices": [{"index": 0, "text": "abcd", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}}
        self._answer(200, json.dumps(body).encode(), {CLOUD_HEADER: "wuhan", "Content-Type": "application/json"})

    def _answer(self, code: int, data: bytes, headers: dict | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def pods():
    """vLLM's pods as the cloud's load balancer reaches them: on vLLM's port of a loopback address of their own."""
    address = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
    try:
        http = ThreadingHTTPServer((address, VLLM_PORT), VllmLike)
    except OSError as exc:
        pytest.skip(f"port {VLLM_PORT} of {address} is taken here ({exc})")
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield address
    http.shutdown()
    http.server_close()


@pytest.fixture()
def spec(tmp_path) -> ServeSpec:
    raw = yaml.safe_load(DEFAULT_FEDERATION.with_name("federation.remote.yaml").read_text())
    next(c for c in raw["clouds"] if c["name"] == "wuhan")["access"]["serve_service_type"] = "LoadBalancer"
    raw["images"].append({"accelerator": "nvidia-a100", "family": "hf-causal-lm",
                          "image": "registry.example.com/crosscloud-worker:cuda"})
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    return ServeSpec(tenant="team-a", name="gpt2-served", model="ab" * 32 + ":1000", program="prepare.py",
                     federation=str(path), family="hf-causal-lm", tokenizer="cd" * 32 + ":99")


def test_the_fleet_serves_through_a_kubernetes_clouds_service_scales_its_pods_and_removes_them(pods, spec, tmp_path):
    fleet = Fleet("team-a", spec.name, root=tmp_path / "serving", ledger=Ledger(tmp_path / "ledger.db"))
    with fake_api_server() as (api, _):
        api.pods_become_ready, api.load_balancer_ip = True, pods
        try:
            first = fleet.apply(spec, {"wuhan": 1.0}, {"wuhan": 2})
            deployment = api.objects[("deployments", NS, NAME)]
            with Load(first["router"]) as load:
                served = phase(load, 1.0)
                scaled = fleet.apply(spec, {"wuhan": 1.0}, {"wuhan": 3})
                after = phase(load, 0.5)
            assert load.failures() == [], load.failures()[:5]
            assert first["started"] == ["wuhan-0"] and scaled["started"] == [] and scaled["stopped"] == []
            assert deployment["spec"]["replicas"] == 2 and api.objects[("deployments", NS, NAME)]["spec"]["replicas"] == 3
            assert served.get("wuhan", 0) > 0 and after.get("wuhan", 0) > 0, (served, after)
            [replica] = fleet.replicas()
            assert (replica.cloud, replica.handle["url"], replica.handle["ready"]) == ("wuhan", f"http://{pods}:{VLLM_PORT}", 3)
            assert fleet.router().status()["wuhan-0"]["address"] == f"{pods}:{VLLM_PORT}"
            assert fleet.served()["wuhan"][0]["status"] == "ready"
        finally:
            stopped = fleet.stop()
        assert stopped == ["wuhan-0"] and api.objects == {}  # Deployment, Service and ConfigMap deleted
        assert not api.invalid, api.invalid
    deletes = [r.path for r in api.answered("DELETE")]
    assert f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}" in deletes and fleet.replicas() == []
