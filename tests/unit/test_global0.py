"""Global 0 of a fresh run: built by its builder cloud's sub-task, copied byte for byte by the others."""

from __future__ import annotations

import time

import pytest
import torch

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.presets import preset
from crosscloud.run.plan import CloudAssignment, Plan, ProgramRef
from crosscloud.store.chunks import BlobRef
from crosscloud.store.commit import read_commit, read_object
from crosscloud.store.header import count, fingerprint
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes
from crosscloud.training.checkpoint import PARAMS
from crosscloud.training.global0 import publish_global0
from crosscloud.training.layout import model_layout, tensors_layout
from crosscloud.training.program import ProgramError
from crosscloud.training.session import Run

pytestmark = pytest.mark.program


def _build(args):
    torch.manual_seed(args["seed"])
    return torch.nn.Sequential(torch.nn.Embedding(32, args.get("width", 8)), torch.nn.Linear(args.get("width", 8), 32))


class Program:  # what materialize_inputs reads of a program module
    build_model = staticmethod(_build)


def _plan(run_id: str, clouds: list[str]) -> Plan:
    spec = JobSpec(seed=3, round_timeout_s=20)
    tensors = model_layout(Program, spec.program_run_args())  # as admission describes it, on the meta device
    code = BlobRef(sha256="1" * 64, size=1)
    return Plan(tenant="team-a", run_id=run_id, federation="f", federation_path="", job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud="beijing",
                clouds=[CloudAssignment(name=c, role="x", method="local", accelerator="cpu", devices=1, throughput=1.0,
                                        share=4, shards=[], image="") for c in clouds],
                candidates=[], dataset="python-stdlib", shards=[], held_out=[], init=None,
                program=ProgramRef(name="p.py", file="p.py", code=code, family="byte-lm",
                                   architecture=fingerprint(tensors), parameters=count(tensors)), created_at=time.time())


def _stores():
    fed = load_federation()
    return {c: open_store(fed.cloud(c), "team-a") for c in ("beijing", "shanghai", "singapore")}


def test_the_builder_commits_its_model_and_the_others_copy_the_same_bytes():
    plan, stores = _plan(f"g0-{time.time_ns()}", ["beijing", "shanghai"]), _stores()
    assert plan.builder == "beijing"  # the home cloud, which trains
    model = _build(plan.spec.program_run_args())
    publish_global0(Run(plan, "beijing", stores["beijing"]), model, stores["beijing"])
    other = _build(plan.spec.program_run_args())
    torch.nn.init.zeros_(other[1].weight)  # whatever shanghai's program holds, it starts from the builder's
    publish_global0(Run(plan, "shanghai", stores["shanghai"]), other, stores["beijing"])
    step = plan.keys.global_step(0)
    built, copied = (read_commit(stores[c], step) for c in ("beijing", "shanghai"))
    assert built["objects"][PARAMS]["sha256"] == copied["objects"][PARAMS]["sha256"]
    assert built["meta"]["built_on"] == "beijing" and copied["meta"]["built_on"] == "beijing"
    params = from_bytes(read_object(stores["shanghai"], copied, PARAMS))
    assert torch.equal(params["1.weight"], model[1].weight) and fingerprint(tensors_layout(params)) == plan.program.architecture
    publish_global0(Run(plan, "beijing", stores["beijing"]), other, stores["beijing"])  # started again: nothing changes
    assert read_commit(stores["beijing"], step) == built


def test_a_run_without_its_home_cloud_is_built_by_its_first_cloud():
    plan = _plan("g0-away", ["singapore", "shanghai"])
    assert plan.builder == "singapore"


def test_a_model_other_than_admission_described_stops_the_run_before_any_round():
    plan, stores = _plan(f"g0-bad-{time.time_ns()}", ["beijing"]), _stores()
    wide = _build({**plan.spec.program_run_args(), "width": 16})  # not what build_model(run.args) builds
    with pytest.raises(ProgramError, match=r"is architecture \w+ \(1,056 parameters\), and build_model\(run.args\) "
                       r"at admission was \w+ \(544 parameters\).*deterministic in its args"):
        publish_global0(Run(plan, "beijing", stores["beijing"]), wide, stores["beijing"])
    assert read_commit(stores["beijing"], plan.keys.global_step(0)) is None
