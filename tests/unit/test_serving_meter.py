"""A replica's own meter (tokens/s and latency percentiles over a sliding window) and the status table."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from crosscloud.serving.meter import Meter
from crosscloud.serving.status import format_status

pytestmark = pytest.mark.inference


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_an_empty_meter_serves_nothing_and_has_no_percentiles():
    clock = Clock()
    meter = Meter(window_s=60, clock=clock)
    clock.t += 30
    snap = meter.snapshot()
    assert snap["tokens_per_s"] == 0 and snap["p50_s"] is None and snap["p99_s"] is None
    assert snap["requests"] == snap["tokens"] == 0 and snap["window_s"] == 30


def test_tokens_per_second_over_the_time_since_start_then_over_the_window():
    clock = Clock()
    meter = Meter(window_s=60, clock=clock)
    clock.t += 10
    meter.record(100, 0.5)
    meter.record(100, 0.5)
    assert meter.snapshot()["tokens_per_s"] == pytest.approx(20.0)  # 200 tokens in the 10 s since start
    clock.t += 110  # 120 s since start: the window (60 s) is the span
    meter.record(300, 0.5)
    snap = meter.snapshot()
    assert snap["window_s"] == 60 and snap["tokens_per_s"] == pytest.approx(5.0)  # the first two fell out


def test_the_recent_rate_sees_traffic_that_began_within_the_minute_at_its_full_rate():
    clock = Clock()
    meter = Meter(window_s=60, clock=clock)
    clock.t += 50  # idle for 50 s, then 10 s of steady traffic at 30 tokens/s
    for _ in range(10):
        clock.t += 1
        meter.record(30, 0.1)
    snap = meter.snapshot()
    assert snap["tokens_per_s"] == pytest.approx(5.0)  # the minute's average understates the draw now
    assert snap["recent_tokens_per_s"] == pytest.approx(30.0)
    clock.t += 20
    assert meter.snapshot()["recent_tokens_per_s"] == 0


def test_old_requests_leave_the_window_but_totals_keep_counting():
    clock = Clock()
    meter = Meter(window_s=60, clock=clock)
    for latency in (1.0, 2.0, 3.0):
        meter.record(10, latency)
        clock.t += 30
    # now = start + 90: the request recorded at start is older than the window, the others are in it
    snap = meter.snapshot()
    assert snap["requests"] == 3 and snap["tokens"] == 30
    assert snap["tokens_per_s"] == pytest.approx(20 / 60)
    assert snap["p50_s"] == pytest.approx(2.5)
    clock.t += 1000
    snap = meter.snapshot()
    assert snap["tokens_per_s"] == 0 and snap["p50_s"] is None and snap["p99_s"] is None
    assert snap["requests"] == 3 and snap["tokens"] == 30
    meter.record(5, 0.1)
    assert meter.snapshot()["tokens"] == 35 and meter.snapshot()["requests"] == 4


def test_percentiles_come_from_the_recorded_latencies():
    clock = Clock()
    meter = Meter(window_s=60, clock=clock)
    for ms in range(1, 101):  # 1 ms ... 100 ms
        meter.record(1, ms / 1000)
    snap = meter.snapshot()
    assert snap["p50_s"] == pytest.approx(0.0505)
    assert snap["p99_s"] == pytest.approx(0.09901)
    for _ in range(3):  # a few slow requests (3 %) move the tail to them, the median by one place
        meter.record(1, 10.0)
    snap = meter.snapshot()
    assert snap["p99_s"] == pytest.approx(10.0) and snap["p50_s"] == pytest.approx(0.052)


def _row(cloud, **kw):
    row = {"cloud": cloud, "planned_share": 0.0, "served_share": 0.0, "replicas": 0, "replicas_total": 0,
           "tokens_per_s": 0.0, "usd_per_1k_tokens": None, "p50_ms": None, "p99_ms": None, "grid_cut_pct": None}
    return {**row, **kw}


def test_the_status_table_shows_each_cloud_and_dashes_for_the_unknown():
    decided = datetime(2024, 5, 1, 13, 7, tzinfo=timezone.utc).timestamp()
    status = {"tenant": "team-a", "model": "chat", "router": "http://127.0.0.1:8700",
              "version": {"name": "m", "version": 3}, "decided_at": decided, "latency_goal_met": True,
              "clouds": [_row("beijing", planned_share=0.75, served_share=0.7, replicas=2, replicas_total=3,
                              tokens_per_s=140.25, usd_per_1k_tokens=0.0123456, p50_ms=41.6, p99_ms=250.0,
                              grid_cut_pct=10.0),
                         _row("singapore")]}
    lines = format_status(status).splitlines()
    assert lines[0] == "team-a/chat: router http://127.0.0.1:8700; version m/3; decided 2024-05-01 13:07 UTC"
    assert lines[1].split() == ["cloud", "share", "served", "replicas", "tok/s", "$/1k", "tok", "p50", "ms",
                                "p99", "ms", "grid"]
    assert lines[2].split() == ["beijing", "0.75", "0.70", "2/3", "140.2", "0.012346", "42", "250", "-10%"]
    assert lines[3].split() == ["singapore", "0.00", "0.00", "0/0", "0.0", "-", "-", "-"]
    assert len(lines) == 4


def test_the_status_of_a_model_never_placed_and_without_a_router():
    status = {"tenant": "team-b", "model": "chat", "router": None, "version": None, "decided_at": None,
              "latency_goal_met": None, "clouds": [_row("shanghai", grid_cut_pct=2.5)]}
    lines = format_status(status).splitlines()
    assert lines[0] == "team-b/chat: router not running; version ?/?; decided never"
    assert lines[2].split()[-1] == "-2.5%"
