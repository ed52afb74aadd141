"""The single-cluster baseline a cross-cloud run is measured against.

A baseline is the same job - model, global batch, inner steps, dataset, total
devices - run on one cloud with synchronous data parallelism. Runs are matched
by ``baseline_key``, so a cross-cloud run finds its baseline among earlier runs
and only calibrates (a short baseline run) when there is none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from crosscloud.core.job import JobSpec

CALIBRATION_ROUNDS = 3
# a calibration runs inside its run's last task, which holds a worker slot: it waits that long in the queue, ahead
# of the runs of its own priority (it is short), then the run is reported without a gap, saying why
CALIBRATION_WAIT_S = 300.0


def baseline_key(plan) -> str:
    spec = plan.spec
    config = {
        "model": plan.model.to_dict(),
        "global_batch": spec.global_batch,
        "inner_steps": spec.inner_steps,
        "dataset": spec.dataset,
        "devices": sum(c.devices for c in plan.clouds),
    }
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def round_seconds(record: dict) -> float:
    """A round's wall time as the slowest cloud's worker lived it: waiting, transfers and compute."""
    return max(c["wait_s"] + c["download_s"] + c["compute_s"] + c["upload_s"] for c in record["clouds"].values())


def iteration_time(history: list[dict], inner_steps: int) -> float:
    """Wall seconds per inner step of the whole job, communication and waiting included.

    Round 0 also holds the sub-tasks' start-up, so it is left out when later
    rounds exist.
    """
    rounds = history[1:] or history
    return sum(round_seconds(r) for r in rounds) / (len(rounds) * inner_steps)


def calibration_spec(plan) -> JobSpec:
    """A short single-cluster job on the home cloud with the same total devices."""
    return dataclasses.replace(
        plan.spec,
        mode="single_cluster",
        clouds=[plan.coordinator_cloud],
        devices_per_cloud=sum(c.devices for c in plan.clouds),
        rounds=min(plan.spec.rounds, CALIBRATION_ROUNDS),
        priority=plan.spec.priority + 1,
        deferrable=False,
        deadline="",
    )


def gap_pct(iteration_time_s: float, baseline_s: float) -> float:
    return 100.0 * (iteration_time_s / baseline_s - 1.0)
