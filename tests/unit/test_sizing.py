"""A run's sizing: measured figures win over what the program declares, which wins over an estimate; placement
refuses a pool whose devices hold less than the program measured it needs."""

from __future__ import annotations

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.ledger.figures import Figure
from crosscloud.pool.placement import PlacementError
from crosscloud.run.plan import CloudAssignment, Plan, ProgramRef
from crosscloud.core.presets import preset
from crosscloud.scheduler.admission import preflight
from crosscloud.scheduler.sizing import measured_figures, resolve_sizing
from crosscloud.store.chunks import BlobRef

pytestmark = pytest.mark.program

SPEC = JobSpec(rounds=2, inner_steps=10, global_batch=8)


def _figure(accelerator="cpu", sps=0.01, peak=1.5, runs=1) -> Figure:
    return Figure("team-a", "p" * 64, "a" * 16, accelerator, 1_000_000, sps, peak, 4, runs)


def test_measured_figures_win_and_say_so():
    sizing = resolve_sizing(SPEC, {"cpu": _figure()}, {"seconds_per_sample": 9.0, "memory_gb": 9.0}, 1_000_000)
    assert sizing.measured and sizing.seconds_per_sample == {"cpu": 0.01, "*": 0.01} and sizing.memory_gb == 1.5
    assert sizing.runtime_s(SPEC)["cpu"] == pytest.approx(2 * 10 * 8 * 0.01)
    assert sizing.source.startswith("measured by 1 run(s) on cpu (1 run(s), peak 1.50 GB at batch 4)")


def test_without_measurements_the_declaration_then_the_parameter_count_are_used_as_estimates():
    declared = resolve_sizing(SPEC, {}, {"seconds_per_sample": {"nvidia-h100": 0.002}, "memory_gb": 3.0}, 10)
    assert not declared.measured and declared.seconds_per_sample["nvidia-h100"] == 0.002 and declared.memory_gb == 3.0
    assert "declared by the program" in declared.source
    small, large = (resolve_sizing(SPEC, {}, None, n) for n in (1_000_000, 1_000_000_000))
    assert "an estimate from its 1,000,000,000 parameters" in large.source
    assert large.seconds_per_sample["*"] == pytest.approx(1000 * small.seconds_per_sample["*"])
    assert large.memory_gb == pytest.approx(25.0)  # 20 bytes a parameter and a quarter for activations
    assert "byte-LM preset 'small'" in resolve_sizing(SPEC, {}, None, 0).source


def test_a_program_measured_larger_than_a_pools_devices_is_refused_there_with_that_reason(tmp_path):
    fed = load_federation()
    big = resolve_sizing(SPEC, {"cpu": _figure(peak=400.0)}, None, 1_000_000)
    with pytest.raises(PlacementError, match=r"needs at least 400.00 GB per device to train, a cpu here has"):
        preflight(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "byte-lm", Ledger(tmp_path / "l.sqlite"),
                  sizing=big)
    preflight(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "byte-lm", Ledger(tmp_path / "l.sqlite"),
              sizing=resolve_sizing(SPEC, {"cpu": _figure(peak=1.0)}, None, 1))


def test_a_finished_run_measures_seconds_per_sample_at_speed_one_and_its_peak(tmp_path):
    blob = BlobRef(sha256="0" * 64, size=1)
    plan = Plan(tenant="team-a", run_id="r", federation="f", federation_path="", job=SPEC, model=preset("small"),
                outer=SPEC.outer, coordinator_cloud="beijing", dataset="python-stdlib", shards=[], held_out=[],
                clouds=[CloudAssignment(name="beijing", role="x", method="local", accelerator="cpu", devices=2,
                                        throughput=1.0, share=8, shards=[], image="")], candidates=[],
                program=ProgramRef(name="p", file="p", code=blob, family="byte-lm", architecture="a" * 16,
                                   parameters=7))
    def meta(steps, peak):
        return {"step_s": steps, "samples": 8 * len(steps), "peak_memory_gb": peak, "batch": 4}

    history = [{"clouds": {"beijing": meta([30.0, 0.5, 0.4, 0.5], 0.5)}},  # the first step warms up
               {"clouds": {"beijing": meta([0.4, 0.6, 9.0, 0.5], 0.7)}},  # a fold-in lengthened one step
               {"clouds": {"beijing": meta([0.5, 0.5, 0.4, 0.6], 0.6)}}]
    [figure] = measured_figures(plan, history)
    # the median step, 0.5 s for 8 samples on 2 devices of speed 0.5 each: 0.5 x 2 x 0.5 / 8 device-seconds
    assert figure.seconds_per_sample == pytest.approx(0.5 * 2 * 0.5 / 8) and figure.peak_memory_gb == 0.7
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.figures.record(figure)
    ledger.figures.record(figure)
    [kept] = ledger.figures.lookup("team-a", blob.sha256, "a" * 16).values()
    assert kept.runs == 2 and kept.parameters == 7 and ledger.figures.lookup("team-b", blob.sha256, "a" * 16) == {}
