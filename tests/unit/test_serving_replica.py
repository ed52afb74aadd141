"""A replica's pieces without processes: the warm check's refusal, both programs' models and tokenizers, the
Hugging Face export vLLM loads, and the vLLM Deployment against the Kubernetes OpenAPI schema."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import kubernetes_validate
import pytest
import torch

from crosscloud.core.federation import DEFAULT_FEDERATION, load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.presets import preset
from crosscloud.run.plan import Plan, ProgramRef
from crosscloud.serving.replica import VLLM_PORT, ServeSpec, federation_configmap, vllm_deployment
from crosscloud.serving.server import NotWarm, artifact_ref, build_engine, export_hf, program_file, warm_bytes
from crosscloud.store.base import LocalStore
from crosscloud.store.chunks import BlobRef, put_blob
from crosscloud.store.tensors import to_bytes
from crosscloud.training.program import load_program, program_source
from crosscloud.training.session import parameters

pytestmark = pytest.mark.inference

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.37.0"


def weights_of(program: str, args: dict) -> bytes:
    module = load_program(program_source(program), program)
    return to_bytes({n: p.detach() for n, p in parameters(module.build_model(args)).items()})


def test_a_cold_cloud_is_refused_and_a_warm_one_serves_byte_lm(tmp_path):
    args = {"seed": 1, "model_size": "tiny"}
    data = weights_of("examples/byte_lm/train.py", args)
    cold, warm = LocalStore(tmp_path / "cold", cloud="cold"), LocalStore(tmp_path / "warm", cloud="warm")
    ref, _ = put_blob(warm, "t", data, kind="model")
    with pytest.raises(NotWarm, match="preheat the model to cold"):
        artifact_ref(cold, "t", ref.sha256)
    with pytest.raises(NotWarm, match="not warm here"):
        warm_bytes(cold, "t", ref)
    assert artifact_ref(warm, "t", ref.sha256) == ref
    code, _ = put_blob(warm, "t", (ROOT / "examples/byte_lm/train.py").read_bytes(), kind="program")
    with pytest.raises(NotWarm, match="program .* not warm here"):
        program_file(cold, "t", "train.py", f"{code.sha256}:{code.size}")
    program = program_file(warm, "t", "train.py", f"{code.sha256}:{code.size}")  # the code as the run stored it
    assert Path(program).name == "train.py" and Path(program).read_bytes() == (ROOT / "examples/byte_lm/train.py").read_bytes()
    engine = build_engine(program, args, warm_bytes(warm, "t", ref), None)
    text, prompt, completion, reason = engine.complete("def ", 12, 0.0)
    assert (prompt, completion, reason) == (4, 12, "length")
    assert engine.complete("def ", 12, 0.0)[0] == text  # greedy: the same answer every time
    assert engine.complete("x" * 200, 3, 1.0, seed=5)[2] == 3  # a prompt longer than the context is cut to it


def test_a_runs_plan_gives_what_to_serve_its_stored_program_and_its_args():
    spec = JobSpec(tenant="team-a", seed=7, model_size="tiny", program_args={"size": "tiny"})
    code, weights = BlobRef(sha256="c" * 64, size=10), BlobRef(sha256="w" * 64, size=20)
    plan = Plan(tenant="team-a", run_id="r1", federation="f", federation_path="/f.yaml", job=spec, model=preset("tiny"),
                outer=spec.outer, coordinator_cloud="beijing", clouds=[], candidates=[], dataset="python-stdlib",
                shards=[], held_out=[], init=weights,
                program=ProgramRef(name="examples/hf_causal_lm/train.py", file="train.py", code=code, family="hf-causal-lm"))
    serve = ServeSpec.from_plan(plan, "gpt2-tiny", weights, tokenizer="/t/tokenizer.json")
    args = serve.server_args("beijing", 8101)
    assert args[args.index("--program-code") + 1] == f"{'c' * 64}:10" and args[args.index("--program") + 1] == "train.py"
    assert json.loads(args[args.index("--args") + 1]) == {"seed": 7, "lr": spec.inner_lr, "model_size": "tiny", "size": "tiny"}
    assert args[args.index("--model") + 1] == f"{'w' * 64}:20" and args[args.index("--federation") + 1] == "/f.yaml"


def test_hf_causal_lm_served_with_its_bpe_and_exported_for_vllm(tmp_path):
    train_tokenizer = runpy.run_path(str(ROOT / "examples" / "hf_causal_lm" / "prepare.py"))["train_tokenizer"]
    tokenizer = tmp_path / "tokenizer.json"
    train_tokenizer(["def f(x):\n    return x + 1\n"] * 50 + ["class A:\n    pass\n"] * 50, 300).save(str(tokenizer))
    args = {"seed": 2, "size": "tiny", "n_layer": 1}
    engine = build_engine("examples/hf_causal_lm/train.py", args, weights_of("examples/hf_causal_lm/train.py", args),
                          str(tokenizer))
    _, prompt, completion, _ = engine.complete("def f(x):", 6, 0.0)
    assert prompt == len(engine.tokenizer.encode("def f(x):")) and 1 <= completion <= 6
    out = export_hf(engine, str(tokenizer), tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([engine.tokenizer.encode("def f(x):")])
    with torch.no_grad():
        assert torch.allclose(again(ids).logits, engine.model(ids).logits, atol=1e-5)
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"


def test_the_vllm_deployment_is_a_valid_manifest_on_the_pools_accelerator():
    fed = load_federation(DEFAULT_FEDERATION.with_name("federation.remote.yaml"))
    wuhan = fed.cloud("wuhan")
    spec = ServeSpec(tenant="team-a", name="gpt2-small", model="ab" * 32 + ":1000", program="examples/hf_causal_lm/train.py",
                     args={"seed": 0, "size": "small"}, tokenizer="/data/tokenizer.json")
    manifest = vllm_deployment(spec, wuhan, "nvidia-a100", "registry.example.com/crosscloud-worker:cuda", devices=2)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    pod = manifest["spec"]["template"]["spec"]
    vllm, init = pod["containers"][0], pod["initContainers"][0]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert vllm["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert vllm["readinessProbe"]["httpGet"] == {"path": "/health", "port": VLLM_PORT}
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"
    assert init["command"][:3] == ["python", "-m", "crosscloud.serving.server"] and "--export" in init["command"]
    assert init["command"][init["command"].index("--cloud") + 1] == "wuhan"  # the warm check runs on wuhan's store
    assert manifest["metadata"]["namespace"] == "crosscloud"
    assert init["command"][init["command"].index("--federation") + 1] == "/etc/crosscloud/federation.yaml"
    secrets = [e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e]
    assert secrets and all(set(ref) <= {"name", "key", "optional"} for ref in secrets)  # keys by reference, never values
    configmap = federation_configmap(spec, wuhan, DEFAULT_FEDERATION.with_name("federation.remote.yaml").read_text())
    kubernetes_validate.validate(configmap, K8S_VERSION, strict=True)
    assert {"name": "federation", "configMap": {"name": configmap["metadata"]["name"]}} in pod["volumes"]


def test_the_tokenizer_is_published_as_an_artifact_that_a_replica_reads_only_where_it_is_warm(tmp_path):
    from crosscloud.artifacts.preheat import TransferReport, fetch
    from crosscloud.serving.placement import ServingPlacementError, needed, tokenizer_artifact
    from crosscloud.serving.server import tokenizer_file

    home, other = LocalStore(tmp_path / "home", "beijing"), LocalStore(tmp_path / "other", "shanghai")
    file = tmp_path / "tokenizer.json"
    file.write_text('{"model": {"type": "BPE"}}')
    named = tokenizer_artifact(home, "team-a", str(file))
    assert named == BlobRef.of(file.read_bytes()).text and tokenizer_artifact(home, "team-a", named) == named
    spec = ServeSpec(tenant="team-a", name="m", model="ab" * 32 + ":1000", program="p.py", tokenizer=named)
    assert BlobRef.parse(named) in needed(spec)  # preheated and warm-checked with the weights
    with pytest.raises(NotWarm, match="tokenizer .* is not warm|no artifact"):
        tokenizer_file(other, "team-a", named)
    fetch(other, [home], "team-a", BlobRef.parse(named), TransferReport())
    assert Path(tokenizer_file(other, "team-a", named)).read_bytes() == file.read_bytes()
    assert tokenizer_file(other, "team-a", "/legacy/tokenizer.json") == "/legacy/tokenizer.json"  # specs from before
    with pytest.raises(ServingPlacementError, match="cannot read it here"):
        tokenizer_artifact(home, "team-a", str(tmp_path / "missing.json"))
