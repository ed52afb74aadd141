"""A probe measures a program on a pool before its first placement there, and the run is placed by what it measured.

Real runs through the engine (``run_job``) on the embedded federation with
shanghai's devices cut to 0.25 GB: the program's estimate fits there, but
what the probe measures on the CPU (the sub-task's peak resident set, torch
included) does not, so the run is refused on shanghai with that reason and
trains on beijing.
"""

from __future__ import annotations

import pytest
from federations import embedded_file

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.pipeline.inputs import load_job_program
from crosscloud.pipeline.probe import probes
from crosscloud.pipeline.stages import run_job
from crosscloud.run.plan import Plan
from crosscloud.store.digest import sha256
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.program, pytest.mark.slow]

TENANT = "team-b"
# an architecture no other test trains, so that no run has measured it yet in this session's ledger
SPEC = JobSpec(tenant=TENANT, program="tests/programs/factored.py", program_args={"lr": 0.05, "width": 24},
               rounds=1, inner_steps=4, global_batch=8, eval_every_steps=4, probe_steps=6)


def _small_shanghai(raw: dict) -> None:
    for cloud in raw["clouds"]:
        if cloud["name"] == "shanghai":
            cloud["pools"] = [dict(pool, memory_gb=0.25) for pool in cloud["pools"]]


def test_a_probe_measures_the_program_and_placement_refuses_a_pool_too_small_for_what_it_measured(tmp_path):
    fed_path = str(embedded_file(tmp_path / "federation.yaml", _small_shanghai))
    program = load_job_program(SPEC)
    assert program.parameters * 20 * 1.25 / 1e9 < 0.25  # the estimate alone would place it on shanghai too
    ledger = Ledger()
    [planned] = probes(load_federation(fed_path), SPEC, program.family, sha256(program.code), program.architecture,
                       ledger)
    assert (planned.accelerator, planned.cloud) == ("cpu", "beijing")  # the cpu pool whose devices hold the most
    said: list[str] = []
    run_job(SPEC, "probed-run", fed_path, log=said.append, compare_baseline=False)

    assert any("probing tests/programs/factored.py on beijing (cpu): 6 steps" in m for m in said), said
    home = open_store(load_federation(fed_path).local_cloud, TENANT)
    probe = Plan.load(home, TENANT, "probed-run-probe-beijing")
    assert [c.name for c in probe.clouds] == ["beijing"] and probe.spec.inner_steps == 6
    plan = Plan.load(home, TENANT, "probed-run")
    assert plan.sizing["measured"] and plan.sizing["source"].startswith("measured by 1 run(s) on cpu")
    assert plan.sizing["memory_gb"] > 0.25
    assert [c.name for c in plan.clouds] == ["beijing"]
    [shanghai] = [c for c in plan.candidates if c.cloud == "shanghai"]
    assert not shanghai.chosen and "needs at least" in shanghai.reason and "has 0.25 GB" in shanghai.reason
    [figure] = ledger.figures.lookup(TENANT, sha256(program.code), program.architecture).values()
    assert figure.runs == 2 and figure.run_id == "probed-run"  # the probe's measurement, then the run's own
    assert probes(load_federation(fed_path), SPEC, program.family, sha256(program.code), program.architecture,
                  ledger) == []  # measured now: the next run is not probed again
