"""The run plan keeps the job, model and outer step typed; a plan written before still loads."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from crosscloud.core.job import JobSpec, OuterConfig
from crosscloud.core.presets import ModelConfig, preset
from crosscloud.run.plan import Plan
from crosscloud.store.base import LocalStore
from crosscloud.store.chunks import BlobRef

BLOB = {"sha256": "0" * 64, "size": 1}


def _written_before(spec: JobSpec) -> dict:
    """plan.json as admit_stage wrote it when the plan held plain dicts."""
    return {
        "version": 1, "tenant": spec.tenant, "run_id": "r1", "federation": "f", "federation_path": "/f.yaml",
        "job": spec.to_dict(), "model": preset(spec.model_size).to_dict(),
        "outer": {"lr": spec.outer_lr, "momentum": spec.outer_momentum},
        "coordinator_cloud": "beijing", "clouds": [], "candidates": [], "dataset": spec.dataset,
        "shards": [BLOB], "held_out": BLOB, "init": BLOB, "tracking": {}, "created_at": 0.0,
    }


def _written_now(spec: JobSpec) -> dict:
    """plan.json as admit_stage writes it now: held-out files as a list, the program, the files' names and the
    federation's digest (empty for a plan written before it was kept)."""
    return {**_written_before(spec), "held_out": [BLOB], "program": None, "shard_names": [], "held_out_names": [],
            "federation_sha256": "", "sizing": {}}


def test_a_plan_written_before_loads_typed_and_saves_in_the_current_shape(tmp_path):
    spec = JobSpec(rounds=3, outer_lr=0.7, outer_momentum=0.9, clouds=["beijing"])
    store = LocalStore(tmp_path)
    before = _written_before(spec)
    store.put("team-a/runs/r1/plan.json", json.dumps(before).encode())
    plan = Plan.load(store, "team-a", "r1")
    assert plan.job == spec and isinstance(plan.model, ModelConfig) and plan.outer == OuterConfig(lr=0.7, momentum=0.9)
    assert plan.spec is plan.job  # the stored object, not one rebuilt per call
    plan.save(store)
    assert json.loads(store.get("team-a/runs/r1/plan.json")) == _written_now(spec)


def test_a_plan_built_from_objects_writes_the_shape_of_dicts():
    spec = JobSpec(outer_lr=0.5)
    blob = BlobRef(**BLOB)
    plan = Plan(tenant=spec.tenant, run_id="r1", federation="f", federation_path="/f.yaml", job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud="beijing", clouds=[], candidates=[],
                dataset=spec.dataset, shards=[blob], held_out=blob, init=blob)
    assert json.loads(plan.model_dump_json()) == _written_now(spec)


def test_a_stored_job_is_checked_when_the_plan_loads(tmp_path):
    store = LocalStore(tmp_path)
    bad = _written_before(JobSpec())
    bad["job"]["rounds"] = 0
    store.put("team-a/runs/r1/plan.json", json.dumps(bad).encode())
    with pytest.raises(ValidationError, match="job parameter rounds"):
        Plan.load(store, "team-a", "r1")


def test_the_outer_step_has_one_set_of_defaults():
    assert JobSpec().outer == OuterConfig(lr=JobSpec().outer_lr, momentum=JobSpec().outer_momentum)
    assert JobSpec(outer_lr=1.4, outer_momentum=0.9).outer == OuterConfig(lr=1.4, momentum=0.9)
    with pytest.raises(TypeError):
        OuterConfig()  # no defaults of its own: a run's values are its job spec's


def test_a_plan_from_before_program_names_registers_under_the_old_preset_name(tmp_path):
    from crosscloud.tracking.registry import plan_model_name

    spec = JobSpec(model_size="tiny")
    store = LocalStore(tmp_path)
    program = {"name": "examples/byte_lm/train.py", "file": "train.py", "code": BLOB, "family": "byte-lm"}
    for stored in (_written_before(spec), {**_written_before(spec), "program": program}):
        store.put("team-a/runs/r1/plan.json", json.dumps(stored).encode())
        plan = Plan.load(store, "team-a", "r1")
        assert plan_model_name(plan) == "crosscloud-team-a-tiny"  # the old name stays the one it continues
    plan.program.model = "byte-lm-tiny"
    assert plan_model_name(plan) == "crosscloud-team-a-byte-lm-tiny"
