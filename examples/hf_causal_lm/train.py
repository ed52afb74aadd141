"""A team's own model on crosscloud: a Hugging Face ``transformers`` causal LM trained with DiLoCo.

What this example shows, as one self-contained program file:

* **Your own model.** ``build_model`` builds a GPT-2 (``arch: gpt2``) or Llama
  (``arch: llama``) from a config with random initialisation, seeded, so every
  cloud and crosscloud's evaluator build the same starting weights. Nothing is
  downloaded from a hub: ``HF_HUB_OFFLINE`` is set before ``transformers`` loads.
* **Data as files.** ``prepare.py`` (beside this file, run once where the data is)
  turns text into token arrays: ``train/shard-NNN.npy`` and ``val/val-NNN.npy``.
  Crosscloud ships them to the clouds like any blob; this program only sees
  ``run.data_files()`` (its rank's shards) and ``run.eval_files()``.
* **A tokenizer trained locally.** ``prepare.py`` trains a byte-level BPE on the
  training shards; its vocabulary size must equal the ``vocab_size`` arg here
  (4096 by default on both sides).
* **Tied embeddings.** The output head shares the input embedding matrix
  (``tie_embeddings``, on by default), so the parameter is stored, synced and
  averaged once.

The training loop is the SDK's shape: ``cc.init()``, ``run.resume``, DDP inside a
cloud, ``cc.DiLoCo`` across clouds. Batches are chosen by a generator seeded from
(seed, cloud, rank, step), so a restarted sub-task resuming at step ``start``
sees exactly the batches it would have seen. Program args (``program_args``):
``arch``, ``size`` (tiny, small, 125m), ``n_layer``, ``n_embd``, ``n_head``,
``seq_len``, ``vocab_size``, ``tie_embeddings``, ``init_std``, ``bf16``,
``grad_clip``, ``beta2``, ``eval_batches``, ``eval_batch_size``. The job's
``model_size`` sizes crosscloud's built-in byte model, not this one: use ``size``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers: this program never reaches a hub
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

FAMILY = "hf-causal-lm"
DATASET = "stdlib-bpe"  # the federation dataset of token files prepare.py writes (unless the job names another)

VOCAB_SIZE = 4096  # prepare.py's default --vocab-size
EOS_ID = 0  # prepare.py's one special token, <|endoftext|>
SIZES = {
    "tiny": {"n_layer": 3, "n_embd": 128, "n_head": 4, "seq_len": 64},  # a CPU step in ~40 ms at batch 4
    "small": {"n_layer": 6, "n_embd": 384, "n_head": 6, "seq_len": 256},
    "125m": {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq_len": 1024},  # GPT-2 small's shape
}


def model_shape(args: dict) -> dict:
    """The model's dimensions: the ``size`` preset overridden key by key, so every reader agrees on them."""
    size = args.get("size", "tiny")
    if size not in SIZES:
        raise ValueError(f"size {size!r} is unknown; choose one of {sorted(SIZES)} or give n_layer/n_embd/n_head")
    shape = dict(SIZES[size], vocab_size=VOCAB_SIZE)
    shape.update({k: int(args[k]) for k in tuple(shape) if args.get(k) is not None})
    # Init std: GPT-2's 0.02 at its width 768, scaled by 1/sqrt(width) for others. A narrow model's tied logits then
    # start large enough to learn fast (at 0.02 a 128-wide one stays near the unigram loss for its first ~150 steps).
    shape["init_std"] = float(args.get("init_std") or 0.02 * (768 / shape["n_embd"]) ** 0.5)
    if shape["n_embd"] % shape["n_head"]:
        raise ValueError(f"n_embd {shape['n_embd']} is not a multiple of n_head {shape['n_head']}")
    return shape


def model_name(args: dict) -> str:
    """Its registered model: one per architecture and size (a size overridden key by key names its shape)."""
    shape = model_shape(args)
    size = args.get("size", "tiny")
    if any(args.get(k) is not None for k in ("n_layer", "n_embd", "n_head", "seq_len")):
        size = f"l{shape['n_layer']}-d{shape['n_embd']}-h{shape['n_head']}-s{shape['seq_len']}"
    return f"{args.get('arch', 'gpt2')}-{size}"


def _config(arch: str, shape: dict, tie: bool):
    """A ``transformers`` config from our shape: dropout off (deterministic steps), no KV cache, SDPA attention."""
    common = {"vocab_size": shape["vocab_size"], "tie_word_embeddings": tie, "use_cache": False,
              "initializer_range": shape["init_std"], "attn_implementation": "sdpa",  # PyTorch's, CPU and GPU
              "bos_token_id": EOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID}
    if arch == "gpt2":
        config = GPT2Config(n_positions=shape["seq_len"], n_embd=shape["n_embd"], n_layer=shape["n_layer"],
                            n_head=shape["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    elif arch == "llama":
        d = shape["n_embd"]
        hidden = 64 * ((8 * d // 3 + 63) // 64)  # SwiGLU's usual 8/3 d, so its MLP costs about GPT-2's 4 d
        config = LlamaConfig(hidden_size=d, intermediate_size=hidden, num_hidden_layers=shape["n_layer"],
                             num_attention_heads=shape["n_head"], num_key_value_heads=shape["n_head"],
                             max_position_embeddings=shape["seq_len"], attention_dropout=0.0, **common)
    else:
        raise ValueError(f"arch {arch!r} is unknown; choose gpt2 or llama")
    return config


def build_model(args: dict) -> torch.nn.Module:
    """The initial model, random weights from ``args["seed"]``: every caller with the same args gets the same bytes."""
    torch.manual_seed(int(args["seed"]))
    arch = args.get("arch", "gpt2")
    config = _config(arch, model_shape(args), bool(args.get("tie_embeddings", True)))
    model = (GPT2LMHeadModel if arch == "gpt2" else LlamaForCausalLM)(config)
    return model.train()


def lm_loss(net: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over windows of seq_len + 1 tokens: every position predicts its successor.

    The model reads ``batch[:, :-1]`` (seq_len tokens, its position limit), so the
    loss is computed here rather than by ``labels=``, which would want seq_len + 1
    positions. ``net`` may be the model or its DistributedDataParallel wrapper.
    """
    logits = net(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def load_tokens(files: list[Path], vocab_size: int) -> np.ndarray:
    """The files' token arrays end to end, checked against the model's vocabulary (a mismatched prepare fails here)."""
    if not files:
        raise ValueError("no token files: run examples/hf_causal_lm/prepare.py and give its train/ and val/ files")
    tokens = np.concatenate([np.load(f, mmap_mode="r") for f in sorted(files)])
    top = int(tokens.max()) if tokens.size else -1
    if top >= vocab_size:
        raise ValueError(f"token id {top} in {len(files)} file(s) is outside vocab_size {vocab_size}: "
                         "give the model the vocab_size prepare.py's tokenizer was trained with")
    return tokens


def _windows(tokens: np.ndarray, starts: np.ndarray, length: int, device: torch.device) -> torch.Tensor:
    """Rows ``tokens[s : s + length]`` for each start, as an int64 tensor on ``device``."""
    rows = tokens[starts[:, None] + np.arange(length)[None, :]]
    return torch.from_numpy(rows.astype(np.int64)).to(device, non_blocking=True)


def batches(run, start: int) -> Iterator[torch.Tensor]:
    """This rank's batches from step ``start`` on: step i's windows depend on (seed, cloud, rank, i) alone.

    ``run.batch_size`` is read at every step, since crosscloud moves shares between rounds.
    """
    shape = model_shape(run.args)
    length = shape["seq_len"] + 1
    tokens = load_tokens(list(run.data_files()), shape["vocab_size"])
    if tokens.size < length:
        raise ValueError(f"{tokens.size} training tokens are fewer than one window of {length}")
    step = start
    while True:
        key = f"{run.args['seed']}/{run.cloud}/{run.rank}/{step}".encode()
        gen = torch.Generator().manual_seed(zlib.crc32(key))
        starts = torch.randint(0, tokens.size - length + 1, (int(run.batch_size),), generator=gen).numpy()
        yield _windows(tokens, starts, length, run.device)
        step += 1


@torch.no_grad()
def evaluate(model: torch.nn.Module, run) -> float:
    """Mean next-token cross-entropy on fixed, evenly spaced eval windows: the same params give the same number."""
    shape = model_shape(run.args)
    length = shape["seq_len"] + 1
    n_batches = int(run.args.get("eval_batches", 8))
    batch_size = int(run.args.get("eval_batch_size", 8))
    tokens = load_tokens(list(run.eval_files()), shape["vocab_size"])
    if tokens.size < length:
        raise ValueError(f"{tokens.size} eval tokens are fewer than one window of {length}")
    starts = np.linspace(0, tokens.size - length, n_batches * batch_size).astype(np.int64)
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for i in range(n_batches):
            batch = _windows(tokens, starts[i * batch_size:(i + 1) * batch_size], length, run.device)
            total += lm_loss(model, batch).item()  # equal-sized batches: the mean of means is the token mean
        return total / n_batches
    finally:
        model.train(was_training)


def optimizer(model: torch.nn.Module, args: dict) -> torch.optim.Optimizer:
    """AdamW, no weight decay, beta2 0.95 (``beta2`` arg): short runs adapt faster than with 0.999's long memory."""
    betas = (0.9, float(args.get("beta2", 0.95)))
    return torch.optim.AdamW(model.parameters(), lr=float(args["lr"]), betas=betas, weight_decay=0.0)


def train_step(net: torch.nn.Module, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor,
               run) -> torch.Tensor:
    """One inner step: forward (bf16 autocast on GPU when asked, fp32 params), backward, clip, AdamW."""
    bf16 = bool(run.args.get("bf16", False)) and run.device.type == "cuda"
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = lm_loss(net, batch)
    loss.backward()
    clip = float(run.args.get("grad_clip", 1.0))
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def main() -> None:
    """The sub-task: train this rank's share of every round until DiLoCo says the job is done."""
    import crosscloud.sdk as cc  # here, not at the top: crosscloud imports this file for build_model and evaluate

    run = cc.init()
    model = build_model(run.args).to(run.device)
    opt = optimizer(model, run.args)
    start = run.resume(model, opt)
    ids = [run.device.index] if run.device.type == "cuda" else None
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids) if run.world_size > 1 else model
    with cc.DiLoCo(run, model, opt) as diloco:  # the unwrapped model: DiLoCo averages its parameters
        for step, batch in enumerate(batches(run, start), start):
            loss = train_step(net, model, opt, batch, run)
            diloco.step(loss=loss)
            if diloco.done:
                break


if __name__ == "__main__":
    main()
