"""The Hugging Face example program end to end: its tokenizer and token files prepared on first use, a GPT-2
with tied input and output embeddings trained over the embedded clouds, its held-out loss falling."""

from __future__ import annotations

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import run_job
from crosscloud.run.plan import Plan
from crosscloud.store.commit import read_commit, read_object
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes
from crosscloud.training.program import load_program, program_source
from crosscloud.training.session import load_params

pytestmark = [pytest.mark.e2e, pytest.mark.program, pytest.mark.slow]

PROGRAM = "examples/hf_causal_lm/train.py"


@pytest.fixture(scope="module")
def trained() -> dict:
    spec = JobSpec(rounds=4, inner_steps=10, global_batch=12, seed=2, program=PROGRAM, eval_every_steps=40)
    return run_job(spec, "hf-tied", log=lambda m: None, compare_baseline=False)


def test_the_hf_example_trains_on_its_files_dataset(trained):
    m = trained["metrics"]
    assert m["final_eval_loss"] < 0.85 * m["eval_loss_start"], m
    home = open_store(load_federation().local_cloud, "team-a")
    plan = Plan.load(home, "team-a", "hf-tied")
    assert plan.dataset == "stdlib-bpe" and plan.program.family == "hf-causal-lm"  # the program's own DATASET
    assert all(name.endswith(".npy") for name in plan.shard_names) and len(plan.shards) == 12


def test_tied_embeddings_are_exchanged_once_and_stay_tied(trained):
    home = open_store(load_federation().local_cloud, "team-a")
    plan = Plan.load(home, "team-a", "hf-tied")
    final = from_bytes(read_object(home, read_commit(home, plan.keys.final), "model.safetensors"))
    assert "transformer.wte.weight" in final and "lm_head.weight" not in final  # one tensor for the tied pair
    program = load_program(program_source(PROGRAM))
    model = program.build_model(plan.spec.program_run_args())
    load_params(model, final)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert model.lm_head.weight.equal(final["transformer.wte.weight"])
