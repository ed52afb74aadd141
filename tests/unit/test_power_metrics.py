"""Measured power from a Prometheus HTTP API, and a demand-response cut that holds only when the meter shows it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from crosscloud.core.federation import Federation, PowerMetrics, load_federation
from crosscloud.energy.metered import MetricsError, measured_power_w
from crosscloud.energy.power import fit_power_curve
from crosscloud.grid import demand_response
from crosscloud.grid.demand_response import RunOnCloud, plan_shed, verify


class _Prometheus:
    """An HTTP server answering ``/api/v1/query`` like Prometheus, with the samples a test sets."""

    def __init__(self):
        self.body = {"status": "success", "data": {"resultType": "vector", "result": []}}
        self.queries: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urlparse(self.path)
                if url.path != "/api/v1/query":
                    self.send_error(404)
                    return
                outer.queries.append(parse_qs(url.query)["query"][0])
                data = json.dumps(outer.body).encode()
                self.send_response(200 if outer.body.get("status") == "success" else 400)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def gpus(self, *watts):
        self.body = {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"gpu": str(i)}, "value": [1700000000.0, str(w)]} for i, w in enumerate(watts)]}}


@pytest.fixture
def prometheus():
    server = _Prometheus()
    yield server
    server.server.shutdown()


def test_the_cloud_draw_is_the_sum_of_the_query_samples(prometheus):
    prometheus.gpus(250.0, 240.5, 10)
    spec = PowerMetrics(prometheus_url=prometheus.url, query='DCGM_FI_DEV_POWER_USAGE{cloud="beijing"}')
    assert measured_power_w(spec) == pytest.approx(500.5)
    assert prometheus.queries == ['DCGM_FI_DEV_POWER_USAGE{cloud="beijing"}']


def test_errors_name_the_source_and_why(prometheus):
    spec = PowerMetrics(prometheus_url=prometheus.url)
    with pytest.raises(MetricsError, match="no samples"):
        measured_power_w(spec)
    prometheus.body = {"status": "error", "errorType": "bad_data", "error": "parse error at char 4"}
    with pytest.raises(MetricsError, match="parse error"):
        measured_power_w(spec)
    prometheus.server.shutdown()
    prometheus.server.server_close()
    with pytest.raises(MetricsError, match=r"127\.0\.0\.1.*cannot read the power"):
        measured_power_w(spec, timeout_s=2)


def _metered(prometheus) -> Federation:
    fed = load_federation()
    meter = PowerMetrics(prometheus_url=prometheus.url, settle_s=0)
    clouds = [c.model_copy(update={"power_metrics": meter}) if c.name == "beijing" else c for c in fed.clouds]
    return fed.model_copy(update={"clouds": clouds})


@pytest.mark.parametrize("after_w, held", [(850.0, True), (960.0, False)])
def test_a_metered_cut_holds_only_when_the_meter_shows_it(prometheus, monkeypatch, after_w, held):
    fed = _metered(prometheus)
    run = RunOnCloud("team-a", "r1", "cpu", 3, 8, 24, 4.0, ("shanghai",))
    plan = plan_shed(fed, "beijing", [run], reduce_pct=10, within_s=300, curve=fit_power_curve())
    assert plan.feasible and plan.actions
    prometheus.gpus(600.0, 400.0)
    plan.measured_before_w = measured_power_w(fed.cloud("beijing").power_metrics)
    # the sub-task applied the action 2 s after the request (read from its round commits in a real run)
    monkeypatch.setattr(demand_response, "_applied", lambda fed, cloud, action, since: since + 2.0)
    prometheus.gpus(after_w / 2, after_w / 2)
    result = verify(fed, plan, issued_at=1000.0, curve=fit_power_curve(), timeout_s=5)
    assert result["held"] is held
    assert result["measured_power_before_w"] == pytest.approx(1000.0)
    assert result["measured_power_after_w"] == pytest.approx(after_w)
    assert result["measured_shed_pct"] == pytest.approx(100 * (1 - after_w / 1000.0))
