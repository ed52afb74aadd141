"""Memory stays bounded: a cloud's round exchange holds fragments, not models; today's central round held them all.

One cloud's exchange of a round (N = 2) and the central coordinator's round it
replaced, each in a fresh process at P = 50 M parameters (a 200 MB fp32
model), through ``bench/exchange.py`` (``make bench-exchange``): the peak RSS
each adds beyond the model it holds, as a ratio of the fp32 model's bytes.
A ratio, never a time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "exchange.py"
P = 50_000_000
GOAL = 1.25  # the goal for the exchange's peak RSS beyond the model


def _bench():
    spec = importlib.util.spec_from_file_location("bench_exchange", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_clouds_exchange_adds_a_fraction_of_the_model_where_the_central_round_added_copies(tmp_path):
    bench = _bench()
    cfg = {"bandwidth_mbps": 10_000.0, "latency_ms": 1.0, "seed": 0, "compression": "int8", "rounds": 1,
           "outer_lr": 0.7, "outer_momentum": 0.9}
    found = bench.measure(P, 2, cfg, tmp_path, only=["cloud-0"], watcher=False)
    assert not found["errors"], found["errors"]
    assert found["central"] is not None, found["central_note"]
    cloud, central = found["clouds"]["cloud-0"], found["central"]
    model_mb = 4 * found["p_real"] / 1e6
    seen = (f"model {model_mb:.0f} MB: exchange +{cloud['extra'] / 1e6:.0f} MB ({cloud['ratio']:.2f}), "
            f"central +{central['extra'] / 1e6:.0f} MB ({central['ratio']:.2f})")
    assert cloud["read"] > 0 and cloud["written"] >= 4 * found["p_real"], seen  # it fetched and published for real
    assert cloud["ratio"] <= GOAL, seen
    assert central["ratio"] > 2 * GOAL, seen
