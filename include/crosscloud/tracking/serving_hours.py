"""MLflow records of inference placement: a parent run per served model, a nested run per decision.

Why nested: MLflow's compare view then lines up every hour of one served
model (shares, replicas, cost per 1k tokens per cloud), and the parent's tags
say which tenant and model the hours belong to. Each hour keeps its reasons
(``decision.txt``) and the whole record (``decision.json``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from crosscloud.tracking.mlflow_runs import TAG, Tracker

EXPERIMENT = "inference_placement"


def _parent(tracker: Tracker, exp_id: str, tenant: str, model: str) -> str:
    key = f"{tenant}/{model}"
    found = tracker.client.search_runs([exp_id], f"tags.`{TAG}.serving` = '{key}' and tags.`{TAG}.level` = 'serving'",
                                       max_results=1)
    if found:
        return found[0].info.run_id
    run = tracker.client.create_run(exp_id, run_name=f"serving {key}", tags={
        f"{TAG}.serving": key, f"{TAG}.tenant": tenant, f"{TAG}.level": "serving"})
    return run.info.run_id


def log_decision(record: dict, reason: str, tracker: Tracker | None = None) -> str:
    """One decision (an hour, or a grid request's re-plan: ``reason``) as a finished nested run; its run id."""
    tracker = tracker or Tracker()
    exp_id = tracker.experiment_id(EXPERIMENT)
    req = record["request"]
    parent = _parent(tracker, exp_id, req["tenant"], record["spec"]["name"])
    hour = datetime.fromtimestamp(record["hour"], timezone.utc).strftime("%Y-%m-%dT%H:%M")
    run = tracker.client.create_run(exp_id, run_name=f"{hour} {reason}", tags={
        "mlflow.parentRunId": parent, f"{TAG}.level": "serving-decision", f"{TAG}.tenant": req["tenant"],
        f"{TAG}.reason": reason, f"{TAG}.model_version": f"{record['version']['name']}/{record['version']['version']}"})
    rid = run.info.run_id
    tracker.log_params(rid, {"tokens_per_s": req["tokens_per_s"], "p99_goal_ms": req["p99_goal_ms"],
                              "min_share": req["min_share"], "users_near": req["users_near"],
                              "jurisdictions": ",".join(req["jurisdictions"]) or "anywhere",
                              "clouds": ",".join(o["name"] for o in record["offers"])})
    demand = record.get("demand") or {}  # how the hour's tokens/s was found (decisions before it have none)
    if demand:
        tracker.log_params(rid, {"demand": "tokens_per_s Param" if demand["override"] is not None else demand["method"]})
    metrics = {"cost_usd_per_hour": record["cost_usd_per_hour"], "unserved_tps": record["unserved_tps"],
               "latency_goal_met": float(record["latency_goal_met"]),
               **({"demand_forecast_mape": demand["mape"]} if demand.get("mape") is not None else {})}
    for cloud, share in record["shares"].items():
        metrics.update({f"share.{cloud}": share, f"replicas.{cloud}": record["replicas"].get(cloud, 0),
                        f"usd_per_1k_tokens.{cloud}": record["usd_per_1k_tokens"].get(cloud, 0.0)})
    tracker.log_metrics(rid, metrics)
    reasons = "\n".join(f"{c['cloud']}: {'CHOSEN' if c['chosen'] else 'not chosen'} - {c['reason']}"
                        for c in record["considered"])
    tracker.client.log_text(rid, reasons + "\n", "decision.txt")
    tracker.client.log_text(rid, json.dumps(record, indent=2), "decision.json")
    tracker.client.set_terminated(rid, "FINISHED")
    return rid


BENCH_EXPERIMENT = "bench-inference"


def log_benchmark(params: dict, policies: dict[str, dict], hourly_shares: dict[str, dict[str, list[float]]],
                  figures: dict, tracker: Tracker | None = None) -> str:
    """One run of ``make bench-inference``: a parent run with its arguments and last-line figures, a nested run per
    policy with its cost and latency, and per replay hour its share of each cloud (metric steps = hours)."""
    tracker = tracker or Tracker()
    exp_id = tracker.experiment_id(BENCH_EXPERIMENT)
    parent = tracker.client.create_run(exp_id, run_name=f"{params.get('start')}..{params.get('end')}",
                                       tags={f"{TAG}.level": "benchmark"})
    pid = parent.info.run_id
    tracker.log_params(pid, params)
    tracker.log_metrics(pid, {k: v for k, v in figures.items() if isinstance(v, (int, float))})
    for name, outcome in policies.items():
        child = tracker.client.create_run(exp_id, run_name=name, tags={"mlflow.parentRunId": pid,
                                                                      f"{TAG}.level": "policy"})
        cid = child.info.run_id
        tracker.log_metrics(cid, outcome)
        for cloud, shares in hourly_shares.get(name, {}).items():
            tracker.log_series(cid, f"share.{cloud}", shares)
        tracker.client.set_terminated(cid, "FINISHED")
    tracker.client.set_terminated(pid, "FINISHED")
    return pid
