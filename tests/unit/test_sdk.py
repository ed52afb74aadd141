"""The SDK a training program calls: init from the environment, device selection, resume, and DiLoCo's hooks."""

from __future__ import annotations

import json
import time

import pytest
import torch

import crosscloud.sdk as cc
from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.presets import preset
from crosscloud.run.plan import CloudAssignment, Plan, ProgramRef
from crosscloud.store.chunks import BlobRef, put_blob
from crosscloud.store.commit import read_commit, read_object, write_step
from crosscloud.store.digest import IntegrityError
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes, to_bytes
from crosscloud.training import devices
from crosscloud.training.resume import CloudState, StateWriter, latest_state, save_state, snapshot
from crosscloud.training.session import parameters

pytestmark = pytest.mark.program


class Tied(torch.nn.Module):
    """Input and output embeddings share one weight, as many language models do."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.embed(x))


def _plan(run_id: str, spec: JobSpec, share: int = 6) -> tuple[Plan, object]:
    fed = load_federation()
    store = open_store(fed.cloud("beijing"), spec.tenant)
    shards = [put_blob(store, spec.tenant, bytes([i]) * 1000, kind="dataset")[0] for i in range(4)]
    held = put_blob(store, spec.tenant, b"held out" * 100, kind="dataset")[0]
    code = put_blob(store, spec.tenant, b"FAMILY = 'byte-lm'\n\n\ndef build_model(args):\n    raise NotImplementedError\n\n\n"
                    b"def evaluate(model, run):\n    return float(model.embed.weight.sum())\n", kind="program")[0]
    blob = BlobRef(sha256="0" * 64, size=1)
    plan = Plan(tenant=spec.tenant, run_id=run_id, federation=fed.name, federation_path="", job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud="beijing",
                clouds=[CloudAssignment(name="beijing", role="local", method="local", accelerator="cpu", devices=2,
                                        throughput=2.0, share=share, shards=[0, 1, 2], image="")],
                candidates=[], dataset="python-stdlib", shards=shards, held_out=[held], init=blob,
                program=ProgramRef(name="p.py", file="p.py", code=code, family="byte-lm"), created_at=time.time())
    plan.save(store)
    return plan, store


@pytest.fixture()
def environment(monkeypatch):
    def set_env(run_id: str, rank: int = 0, world: int = 1):
        for key, value in {"CROSSCLOUD_TENANT": "team-a", "CROSSCLOUD_RUN_ID": run_id, "CROSSCLOUD_CLOUD": "beijing",
                           "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}.items():
            monkeypatch.setenv(key, value)
    return set_env


def test_init_reads_the_run_from_the_environment(environment):
    spec = JobSpec(seed=5, inner_lr=0.01, program_args={"lr": 0.2, "width": 64})
    plan, store = _plan("sdk-init", spec)
    environment("sdk-init")
    run = cc.init()
    assert (run.cloud, run.rank, run.world_size, run.device) == ("beijing", 0, 1, torch.device("cpu"))
    assert run.args == {"seed": 5, "lr": 0.2, "model_size": spec.model_size, "width": 64}  # program_args win
    assert run.batch_size == 6
    files = run.data_files()
    assert [f.read_bytes() for f in files] == [bytes([i]) * 1000 for i in range(3)]  # its shards, as local files
    assert run.eval_files()[0].read_bytes() == b"held out" * 100
    assert json.loads(store.get(plan.keys.sdk_started("beijing")))["device"] == "cpu"


def test_ranks_split_their_clouds_shards_and_batch(environment):
    plan, store = _plan("sdk-ranks", JobSpec(), share=7)
    run = cc.Run(plan, "beijing", store, rank=1, world_size=2)
    assert [f.read_bytes()[0] for f in run.data_files()] == [1]  # shards 0, 1, 2: rank 1 of 2 reads shard 1
    assert run.batch_size == 3  # 7 sequences over two ranks: 4 and 3


def test_init_outside_a_subtask_says_what_is_missing(monkeypatch):
    for key in ("CROSSCLOUD_TENANT", "CROSSCLOUD_RUN_ID", "CROSSCLOUD_CLOUD"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(cc.ProgramError, match="CROSSCLOUD_TENANT, CROSSCLOUD_RUN_ID, CROSSCLOUD_CLOUD not set"):
        cc.init()


@pytest.mark.parametrize(("accelerator", "cuda", "npu", "expected"), [
    ("nvidia-h100", True, False, ("cuda:3", "nccl")),
    ("hygon-k100", True, False, ("cuda:3", "nccl")),  # ROCm's torch answers as cuda
    ("ascend-910b", False, True, ("npu:3", "hccl")),
    ("ascend-910b", False, False, ("cpu", "gloo")),  # no torch_npu here: the CPU, said in the log
    ("nvidia-a100", False, False, ("cpu", "gloo")),
    ("cpu", True, True, ("cpu", "gloo")),
])
def test_the_device_follows_the_pools_accelerator(monkeypatch, accelerator, cuda, npu, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(devices, "_npu_available", lambda: npu)
    said = []
    device, backend = devices.select_device(accelerator, 3, log=said.append)
    assert (device, backend) == expected
    assert bool(said) == (expected[0] == "cpu" and accelerator != "cpu")


def test_tied_weights_are_exchanged_once():
    assert list(parameters(Tied())) == ["embed.weight"]
    to_bytes({n: p.detach() for n, p in parameters(Tied()).items()})  # safetensors takes it: nothing is shared


def _train(model, opt, steps=3):
    for _ in range(steps):
        loss = model(torch.arange(16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        yield loss


def test_diloco_commits_the_round_and_resume_gives_everything_back(environment):
    spec = JobSpec(rounds=1, inner_steps=3, compression="none", overlap=False)
    plan, store = _plan("sdk-round", spec)
    start = Tied()
    write_step(store, plan.keys.global_step(0), {"params.safetensors": to_bytes(dict(parameters(start)))},
               meta={"round": -1, "published_at": time.time()})
    environment("sdk-round")
    run = cc.init()
    model, opt = Tied(), None
    torch.nn.init.zeros_(model.embed.weight)  # DiLoCo loads global 0 over whatever the program built
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert run.resume(model, opt) == 0
    with cc.DiLoCo(run, model, opt) as diloco:
        assert torch.equal(model.embed.weight, start.embed.weight)
        for loss in _train(model, opt):
            diloco.step(loss=loss)
        assert diloco.done
        diloco.step(loss=loss)  # after the last round: nothing more happens
    commit = read_commit(store, plan.keys.cloud_step("beijing", 0))
    delta = from_bytes(read_object(store, commit, "delta.safetensors"))
    assert torch.allclose(delta["embed.weight"], start.embed.weight - model.embed.weight)
    assert len(commit["meta"]["losses"]) == 3 and commit["meta"]["samples"] == 6 * 3
    again, again_opt = Tied(), None
    again_opt = torch.optim.AdamW(again.parameters(), lr=0.1)
    assert cc.Run(plan, "beijing", store).resume(again, again_opt) == 3  # the data position
    assert torch.equal(again.embed.weight, model.embed.weight)
    saved, now = again_opt.state_dict(), opt.state_dict()
    assert torch.equal(saved["state"][0]["exp_avg"], now["state"][0]["exp_avg"]) and saved["param_groups"] == now["param_groups"]
    state = latest_state(store, plan.keys, "beijing")
    assert state.round == 0 and torch.equal(state.known_params["embed.weight"], start.embed.weight)
    # the state names the global it holds (its cloud's committed copy) instead of writing it again
    state_commit = read_commit(store, plan.keys.cloud_state("beijing", 0))
    assert state_commit["objects"]["known.safetensors"] == read_commit(store, plan.keys.global_step(0))["objects"][
        "params.safetensors"]
    layout = json.loads(read_object(store, state_commit, "state.json"))["layout"]
    assert layout and not any(n.startswith("known/") for n in layout)
    # the cloud reduced its round itself, and the home cloud evaluated the start and the end with the program's evaluate
    evals = {g: json.loads(store.get(plan.keys.evaluation(g)))["eval_loss"] for g in (0, 1)}
    assert evals[0] == pytest.approx(float(start.embed.weight.sum()))
    assert evals[1] == pytest.approx(float(model.embed.weight.sum()))
    assert read_commit(store, plan.keys.global_step(1))["meta"]["members"] == ["beijing"]


def test_a_state_that_names_its_global_resumes_exactly_and_refuses_a_changed_one(environment):
    plan, store = _plan("sdk-state", JobSpec())
    known = {"w": torch.randn(64), "b": torch.randn(3)}
    entry = write_step(store, plan.keys.global_step(4), {"params.safetensors": to_bytes(known)})["objects"][
        "params.safetensors"]
    params, own = {n: t + 1 for n, t in known.items()}, {n: torch.randn_like(t) for n, t in known.items()}
    save_state(store, plan.keys, "beijing", CloudState(
        round=4, steps=40, params=params, optimizer={"state": {}, "param_groups": []}, known_round=4,
        known_params=known, own={4: own}, drift={}, metas={4: {}}, share=6), known=entry)
    state = latest_state(store, plan.keys, "beijing")
    assert all(torch.equal(state.known_params[n], known[n]) and torch.equal(state.params[n], params[n])
               and torch.equal(state.own[4][n], own[n]) for n in known)
    store.put(entry["key"], to_bytes({n: t * 2 for n, t in known.items()}))  # the named global is not what it was
    with pytest.raises(IntegrityError):
        latest_state(store, plan.keys, "beijing")


def test_states_pack_their_tensors_and_each_new_one_replaces_the_last(environment):
    """A state of many small tensors is a few flat ones; it reads back exactly, dtypes and shapes included, and writing
    round r deletes round r - 1's state but nothing else of the folder."""
    plan, store = _plan("sdk-pack", JobSpec())
    store.put(plan.keys.sdk_started("beijing"), b"{}")
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    writer = StateWriter(store, plan.keys, "beijing")
    for r in (3, 4):
        snap = snapshot(CloudState(round=r, steps=10 * r, params=params, optimizer=opt.state_dict(), known_round=r,
                                   known_params=params, own={r: params}, drift={},
                                   residual={"x": torch.arange(6, dtype=torch.int8)}, metas={r: {}}, share=6))
        assert sorted(snap.packed) == ["pack/float32", "pack/int8"]  # however many tensors the model has
        writer.write(snap, known=None)  # no committed copy to name: the global is packed too
    state = latest_state(store, plan.keys, "beijing")
    assert state.round == 4 and state.steps == 40
    assert all(torch.equal(state.params[n], t) and torch.equal(state.known_params[n], t) for n, t in params.items())
    assert torch.equal(state.residual["x"], torch.arange(6, dtype=torch.int8))
    again = torch.optim.AdamW(model.parameters(), lr=0.1)
    again.load_state_dict(state.optimizer)
    assert all(torch.equal(again.state_dict()["state"][i][k], v) for i, slots in opt.state_dict()["state"].items()
               for k, v in slots.items())
    folder = f"{plan.keys.root}/state/beijing/"
    assert sorted(k[len(folder):] for k in store.list(folder.rstrip("/"))) == [
        "4/COMMIT.json", "4/state.json", "4/state.safetensors", "sdk-started.json"]


def test_a_committed_step_is_never_written_again(environment):
    plan, store = _plan("sdk-once", JobSpec())
    step = plan.keys.cloud_step("beijing", 0)
    write_step(store, step, {"delta.safetensors": b"first"})
    with pytest.raises(IntegrityError, match="already committed with other content"):
        write_step(store, step, {"delta.safetensors": b"second"})
    assert store.get(f"{step}/delta.safetensors") == b"first"  # the retry wrote nothing


def test_the_documented_program_is_the_one_the_tests_train():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    documented = (root / "docs" / "programs.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
    assert (root / "tests" / "programs" / "bigram.py").read_text().endswith(documented)
