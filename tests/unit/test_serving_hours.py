"""The benchmark's MLflow record: its arguments and figures, a nested run per policy with its hourly shares."""

from __future__ import annotations

import pytest

from crosscloud.tracking.mlflow_runs import Tracker
from crosscloud.tracking.serving_hours import BENCH_EXPERIMENT, log_benchmark

pytestmark = pytest.mark.inference


def test_a_benchmark_run_is_one_parent_with_a_child_per_policy_and_its_shares_per_hour():
    tracker = Tracker()
    policies = {"price-unaware": {"usd_per_mtoken": 0.0096, "p99_s": 12.7, "failed": 0},
                "crosscloud": {"usd_per_mtoken": 0.0046, "p99_s": 12.1, "failed": 0}}
    shares = {"crosscloud": {"us-cal": [0.7, 0.8, 0.1], "de": [0.3, 0.2, 0.9]}}
    pid = log_benchmark({"start": "2023-07-10", "end": "2023-07-12", "grid": "auto:10:5:30:2"}, policies, shares,
                        {"cost_per_token_reduction_pct": 52.8, "failed_requests": 0, "source": "text is no metric"},
                        tracker)
    parent = tracker.client.get_run(pid)
    assert parent.data.params["grid"] == "auto:10:5:30:2"
    assert parent.data.metrics == {"cost_per_token_reduction_pct": 52.8, "failed_requests": 0.0}
    exp = tracker.client.get_experiment_by_name(BENCH_EXPERIMENT)
    children = tracker.client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{pid}'")
    assert {c.info.run_name for c in children} == {"price-unaware", "crosscloud"}
    mine = next(c for c in children if c.info.run_name == "crosscloud")
    assert mine.data.metrics["usd_per_mtoken"] == pytest.approx(0.0046)
    history = tracker.client.get_metric_history(mine.info.run_id, "share.de")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(0, 0.3), (1, 0.2), (2, 0.9)]
    assert all(c.info.status == "FINISHED" for c in children) and parent.info.status == "FINISHED"
