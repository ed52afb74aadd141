"""Preheat benchmark: bytes moved to make a cloud ready for its jobs, time to a migrated task's first step, plan scale.

1. **Catalog.** A model repository is built for real, with the project's own
   model and training code (``crosscloud.training.model``, CPU, ``--model-size``), in a
   *source* cloud's store (``LocalStore`` under a temporary folder), every
   artifact stored with ``crosscloud.store.chunks.put_blob`` (content-defined
   chunks, safetensors cut at tensors, packs):

   - ``base``: a model pretrained ``--base-steps`` AdamW steps on the first
     half of the training shards;
   - ``full-ft``: ``--full-variants`` full fine-tunes of the base (every
     parameter trained, ``--ft-steps`` steps, each on its own "domain" shard);
   - ``frozen-ft``: fine-tunes of the base that train only some tensors, one per
     ``--frozen-variants`` scope (``head``: final norm and output head;
     ``last-block``: the last transformer block, the final norm and the head),
     each on its own domain shard; the other tensors stay byte-identical;
   - ``quantized``: casts (``--quantize``, default fp16 and bf16) of the base,
     of the first frozen fine-tune and of the first full fine-tune, saved as
     safetensors;
   - ``checkpoint``: every ``--ckpt-every`` steps of one continued-pretraining
     run of ``--ckpt-steps`` steps from the base on all training shards, each a
     safetensors file of the model plus its AdamW state (what a resume needs);
   - ``dataset``: the ``--shards`` training shards and the held-out shard of
     ``crosscloud.training.corpus.build_corpus``.

   Printed per artifact: name, group, kind, size, bytes it added to the source
   store (``put_blob``'s answer, in catalog order) and ``held by base`` = the
   fraction of its bytes whose chunks the base model's manifest also lists.
   Per group: ``dedup within`` = logical bytes / bytes of the group's distinct
   chunks; ``dedup with base`` = logical bytes / bytes of the group's distinct
   chunks the base does not hold (what the group costs once the base is
   stored). Whole catalog: logical bytes / bytes the store holds (packs).

2. **Bytes moved.** A *target* cloud, empty, must get ready for the job sets
   printed (each job: the artifacts it reads). A *near* cloud already holds the
   base model; sources are ``[near, source]``, nearest first. Three ways:

   a. **whole-file copy** (as ``aws s3 sync``): every needed object, each once
      by name, at its full size;
   b. **whole-file content-addressed cache** (as Dragonfly's pieces keyed by
      file): every needed file whose digest is not yet at the target, each
      distinct digest once; nothing below file level is shared;
   c. **crosscloud**: ``crosscloud.artifacts.preheat.fetch_all`` per job, in job order
      (missing chunks only, each from the nearest source holding it, verified).
      Its bytes moved are every byte read from a source cloud: chunk payload
      (``TransferReport``) plus the manifests and source chunk indexes the
      transfer reads, counted on a zero-cost metering link wrapped around
      each source store. Afterwards every needed artifact is checked warm and
      verified at the target (``warmth(verify=True)``).

   (a) and (b) are what those tools would send, computed from the files' names,
   sizes and digests; (c) is measured. ``logical`` = sum of the sizes of the
   distinct needed artifacts (= (a)); ``read by jobs`` counts an artifact once
   per job reading it.

3. **First step of a migrated task.** The ``resume`` job (latest checkpoint
   and its shards) starts on the target: check ``warmth``; fetch what is not
   warm (sources reached over emulated WAN links: ``LinkedStore`` +
   ``EmulatedLink``, the source at ``--bandwidth-mbps`` / ``--rtt-ms``, the
   near cloud at ``--near-bandwidth-mbps`` / ``--near-rtt-ms``, cap
   ``--rate-cap-mbps``); read the artifacts from the target's packs
   (``read_blob``, verified), load model and optimizer state, run one training
   step. ``first_step_cold_s``: target empty; ``first_step_warm_s``: target
   already preheated with the same artifacts (fetched beforehand, untimed).
   Median of ``--repeats`` interleaved runs, each cold one on a fresh empty
   target. Both run in this process after torch is initialised (catalog
   training), so neither includes interpreter or torch start-up.

4. **Planner scale.** ``distribution.choose_warm_sets`` on
   ``synthetic_catalog(--plan-artifacts, --plan-clouds, --plan-bytes, --seed)``
   (metadata only); ``plan_s`` times ``choose_warm_sets`` alone (catalog
   generation printed separately).

Last line: ``bytes_moved_vs_whole_file=<(c) / (a)> bytes_moved_vs_file_cache=<(c) / (b)>
first_step_warm_s=<s> first_step_cold_s=<s> plan_s=<s>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from crosscloud.artifacts.distribution import choose_warm_sets, human_bytes
from crosscloud.artifacts.preheat import RateCap, TransferReport, fetch_all
from crosscloud.core.presets import ModelConfig, preset
from synthetic_catalog import SYNTHETIC_NOW, synthetic_catalog
from crosscloud.store.base import LocalStore
from crosscloud.store.chunks import BlobRef, ChunkIndex, load_manifest, put_blob, read_blob, warmth
from crosscloud.store.network import EmulatedLink, LinkedStore
from crosscloud.store.tensors import from_bytes, to_bytes
from crosscloud.training.corpus import build_corpus
from crosscloud.training.model import batches, build_model, lm_loss

TENANT = "bench"
GROUPS = ("base", "full-ft", "frozen-ft", "quantized", "checkpoint", "dataset")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Entry:
    name: str
    group: str
    kind: str  # distribution.KINDS: model | dataset | checkpoint
    ref: BlobRef
    stored: int  # bytes put_blob added to the source store


# ---------------------------------------------------------------- training


def data_tensor(shards: list[bytes]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"\n".join(shards)), dtype=torch.uint8)


def trainable_scope(scope: str, cfg: ModelConfig) -> tuple[str, ...] | None:
    """Parameter-name prefixes a frozen-layer fine-tune trains (None: all)."""
    if scope == "all":
        return None
    if scope == "head":
        return ("ln.", "head.")
    if scope == "last-block":
        return (f"blocks.{cfg.n_layers - 1}.", "ln.", "head.")
    raise ValueError(f"unknown frozen scope {scope!r}; choose head or last-block")


def train(model: torch.nn.Module, data: torch.Tensor, steps: int, batch: int, lr: float, seed: int,
          scope: tuple[str, ...] | None = None, every: int = 0, on_checkpoint=None) -> torch.optim.Optimizer:
    """AdamW steps as the project's worker takes them (weight decay 0); frozen tensors get no optimizer."""
    for name, p in model.named_parameters():
        p.requires_grad_(scope is None or name.startswith(scope))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(1, steps + 1):
        loss = lm_loss(model, batches(data, batch, model.cfg.seq_len, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if every and step % every == 0 and on_checkpoint is not None:
            on_checkpoint(step, model, opt)
    for p in model.parameters():
        p.requires_grad_(True)
    return opt


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def checkpoint_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> bytes:
    """Model and AdamW state as one safetensors file: ``model.<p>``, ``optim.<p>.<exp_avg|exp_avg_sq|step>``."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in opt.state.items():
        for key, value in state.items():
            tensors[f"optim.{names[id(p)]}.{key}"] = torch.as_tensor(value)
    return to_bytes(tensors)


def resume_from(ckpt: dict[str, torch.Tensor], cfg: ModelConfig, lr: float, seed: int):
    """A model and its optimizer restored from ``checkpoint_bytes``' tensors."""
    model = build_model(cfg, seed)
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt.items() if k.startswith("model.")})
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    state = opt.state_dict()
    order = [n for n, _ in model.named_parameters()]
    state["state"] = {i: {key: ckpt[f"optim.{n}.{key}"] for key in ("step", "exp_avg", "exp_avg_sq")}
                      for i, n in enumerate(order) if f"optim.{n}.step" in ckpt}
    opt.load_state_dict(state)
    return model, opt


# ---------------------------------------------------------------- catalog


def build_catalog(source: LocalStore, args, cfg: ModelConfig) -> tuple[dict[str, Entry], dict[str, list[str]], dict]:
    """Train and store the repository; returns entries by name, the domain shard names, and facts for the jobs."""
    entries: dict[str, Entry] = {}
    t0 = time.perf_counter()
    index = ChunkIndex(source, TENANT)

    def store(name: str, group: str, kind: str, data: bytes) -> None:
        ref, written = put_blob(source, TENANT, data, kind, index=index)
        entries[name] = Entry(name, group, kind, ref, written)

    shards, held_out = build_corpus(args.shards, args.seed)
    half = max(1, args.shards // 2)
    pre, domains = list(range(half)), list(range(half, args.shards)) or [0]
    shard_names = [f"python-stdlib/shard-{i:02d}" for i in range(args.shards)]
    family = f"byte-lm-{args.model_size}"

    model = build_model(cfg, args.seed)
    train(model, data_tensor([shards[i] for i in pre]), args.base_steps, args.batch, args.lr, args.seed)
    base = weights(model)
    store(family, "base", "model", to_bytes(base))
    print(f"  base: {args.base_steps} steps ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    def fine_tune(scope: str, i: int) -> tuple[dict[str, torch.Tensor], int]:
        m = build_model(cfg, args.seed)
        m.load_state_dict(base)
        d = domains[i % len(domains)]
        train(m, data_tensor([shards[d]]), args.ft_steps, args.batch, args.ft_lr, args.seed * 1000 + 17 * i + 1,
              scope=trainable_scope(scope, cfg))
        return weights(m), d

    first: dict[str, tuple[str, dict[str, torch.Tensor]]] = {"base": (family, base)}
    domain_of: dict[str, list[str]] = {}
    for i in range(args.full_variants):
        w, d = fine_tune("all", i)
        name = f"{family}-ft-full-{i}"
        store(name, "full-ft", "model", to_bytes(w))
        domain_of[name] = [shard_names[d]]
        first.setdefault("full-ft", (name, w))
    for i, scope in enumerate(args.frozen_variants):
        w, d = fine_tune(scope, args.full_variants + i)
        name = f"{family}-ft-{scope}-{i}"
        store(name, "frozen-ft", "model", to_bytes(w))
        domain_of[name] = [shard_names[d]]
        first.setdefault("frozen-ft", (name, w))
    print(f"  fine-tunes done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    for src in ("base", "frozen-ft", "full-ft"):
        if src not in first:
            continue
        name, w = first[src]
        for q in args.quantize:
            store(f"{name}-{q}", "quantized", "model", to_bytes({k: v.to(DTYPES[q]) for k, v in w.items()}))

    run = f"{family}-run-cpt"
    ckpts: list[str] = []

    def on_checkpoint(step: int, m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        name = f"{run}/step-{step:06d}"
        store(name, "checkpoint", "checkpoint", checkpoint_bytes(m, opt))
        ckpts.append(name)

    m = build_model(cfg, args.seed)
    m.load_state_dict(base)
    train(m, data_tensor(shards), args.ckpt_steps, args.batch, args.lr, args.seed * 1000 + 999,
          every=args.ckpt_every, on_checkpoint=on_checkpoint)
    print(f"  checkpoint run done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    for name, data in zip(shard_names, shards):
        store(name, "dataset", "dataset", data)
    store("python-stdlib/held-out", "dataset", "dataset", held_out)
    facts = {"family": family, "base": family, "pre": [shard_names[i] for i in pre], "all_shards": shard_names,
             "checkpoints": ckpts, "domain_of": domain_of}
    return entries, domain_of, facts


def chunk_sets(source: LocalStore, entries: dict[str, Entry]) -> dict[str, dict[str, int]]:
    return {n: load_manifest(source, TENANT, e.ref).unique() for n, e in entries.items()}


def print_catalog(source: LocalStore, entries: dict[str, Entry], chunks: dict[str, dict[str, int]], base: str) -> None:
    base_chunks = chunks[base]
    print(f"{'artifact':<40} {'group':<10} {'kind':<10} {'size':>10} {'stored':>10} {'held by base':>12}")
    for e in entries.values():
        m = load_manifest(source, TENANT, e.ref)
        held = sum(c.size for c in m.chunks if c.sha256 in base_chunks)
        print(f"{e.name:<40} {e.group:<10} {e.kind:<10} {human_bytes(e.ref.size):>10} {human_bytes(e.stored):>10} "
              f"{held / e.ref.size:>11.1%}")
    print()
    print(f"{'group':<10} {'n':>3} {'logical':>10} {'distinct':>10} {'dedup within':>12} "
          f"{'not in base':>11} {'dedup with base':>15} {'held by base (min-max)':>23}")
    for group in GROUPS:
        names = [n for n, e in entries.items() if e.group == group]
        if not names:
            continue
        logical = sum(entries[n].ref.size for n in names)
        distinct: dict[str, int] = {}
        for n in names:
            distinct.update(chunks[n])
        unique = sum(distinct.values())
        beyond = sum(s for d, s in distinct.items() if d not in base_chunks)
        fracs = []
        for n in names:
            m = load_manifest(source, TENANT, entries[n].ref)
            fracs.append(sum(c.size for c in m.chunks if c.sha256 in base_chunks) / entries[n].ref.size)
        with_base = f"{logical / beyond:.2f}x" if beyond else "inf"
        print(f"{group:<10} {len(names):>3} {human_bytes(logical):>10} {human_bytes(unique):>10} "
              f"{logical / unique:>11.2f}x {human_bytes(beyond):>11} {with_base:>15} "
              f"{f'{min(fracs):.1%} - {max(fracs):.1%}':>23}")
    logical = sum(e.ref.size for e in entries.values())
    packs = sum(len(source.get(k)) for k in source.list(f"{TENANT}/packs") if not k.endswith(".idx"))
    stored = sum(e.stored for e in entries.values())
    print(f"catalog: {len(entries)} artifacts, {human_bytes(logical)} logical, {human_bytes(packs)} in packs "
          f"(put_blob reported {human_bytes(stored)}): dedup {logical / packs:.2f}x")


# ---------------------------------------------------------------- jobs and bytes moved


def job_sets(facts: dict, entries: dict[str, Entry]) -> dict[str, list[str]]:
    """The jobs the target must get ready for: each the artifacts it reads."""
    frozen = [n for n, e in entries.items() if e.group == "frozen-ft"]
    full = [n for n, e in entries.items() if e.group == "full-ft"]
    quant = [n for n, e in entries.items() if e.group == "quantized"]
    jobs: dict[str, list[str]] = {}
    if frozen:  # continue the last frozen-layer fine-tune, the base as reference model, on its domain shard
        ft = frozen[-1]
        jobs["finetune"] = [facts["base"], ft, *facts["domain_of"][ft]]
    if quant:  # evaluate the quantized variants on the held-out shard
        jobs["eval-quantized"] = [*quant, "python-stdlib/held-out"]
    if full:  # compare the full fine-tunes with the base on the held-out shard
        jobs["compare-full"] = [facts["base"], *full, "python-stdlib/held-out"]
    if facts["checkpoints"]:  # resume the continued-pretraining run from its latest checkpoint
        jobs["resume"] = [facts["checkpoints"][-1], *facts["all_shards"]]
    return jobs


class CountingLink(EmulatedLink):
    """An emulated link that also counts its requests (each one costs a round trip)."""

    def __init__(self, bandwidth_mbps: float, latency_ms: float):
        super().__init__(bandwidth_mbps, latency_ms)
        self.requests, self._count = 0, threading.Lock()

    def transfer(self, nbytes: int) -> None:
        with self._count:
            self.requests += 1
        super().transfer(nbytes)


def metered(store: LocalStore) -> tuple[LinkedStore, EmulatedLink]:
    """The store behind a link that costs nothing but counts every byte read or written over it."""
    link = EmulatedLink(bandwidth_mbps=1e12, latency_ms=0.0)
    return LinkedStore(store, link), link


def bytes_moved(root: Path, source: LocalStore, near: LocalStore, entries: dict[str, Entry],
                jobs: dict[str, list[str]], rate: float | None) -> dict:
    needed = list(dict.fromkeys(n for arts in jobs.values() for n in arts))
    logical = sum(entries[n].ref.size for n in needed)
    read_by_jobs = sum(entries[n].ref.size for arts in jobs.values() for n in arts)
    whole_file = sum(entries[n].ref.size for n in needed)  # each object once by key
    by_digest = {entries[n].ref.sha256: entries[n].ref.size for n in needed}
    file_cache = sum(by_digest.values())  # target empty: each distinct file digest once

    target = LocalStore(root / "target", "target")
    (near_m, near_link), (src_m, src_link) = metered(near), metered(source)
    report = TransferReport()
    per_job = {}
    for job, arts in jobs.items():
        before = (sum(report.sent_bytes.values()), near_link.bytes_sent + src_link.bytes_sent)
        fetch_all(target, [near_m, src_m], TENANT, [entries[n].ref for n in arts], report,
                  RateCap(rate) if rate else None)
        per_job[job] = (sum(report.sent_bytes.values()) - before[0],
                        near_link.bytes_sent + src_link.bytes_sent - before[1])
    index = ChunkIndex(target, TENANT)
    cold = [n for n in needed if not warmth(target, TENANT, entries[n].ref, verify=True, index=index).warm]
    if cold:
        raise SystemExit(f"after preheating, not warm at the target: {cold}")
    payload = sum(report.sent_bytes.values())
    wire = near_link.bytes_sent + src_link.bytes_sent
    return {"needed": needed, "logical": logical, "read_by_jobs": read_by_jobs, "whole_file": whole_file,
            "file_cache": file_cache, "payload": payload, "wire": wire, "per_job": per_job,
            "sources": dict(report.sources), "wire_by_source": {near.cloud: near_link.bytes_sent,
                                                                source.cloud: src_link.bytes_sent}}


def print_moved(jobs: dict[str, list[str]], entries: dict[str, Entry], r: dict) -> None:
    for job, arts in jobs.items():
        size = sum(entries[n].ref.size for n in arts)
        payload, wire = r["per_job"][job]
        print(f"job {job}: {human_bytes(size)} read; crosscloud moved {human_bytes(wire)} "
              f"(chunks {human_bytes(payload)}) in job order")
        for n in arts:
            print(f"    {n} ({entries[n].group}, {human_bytes(entries[n].ref.size)})")
    print()
    print(f"{'way':<36} {'bytes moved':>12} {'vs logical':>10} {'vs whole-file':>13}")
    rows = [("(a) whole-file copy (s3 sync)", r["whole_file"]),
            ("(b) whole-file cache (by digest)", r["file_cache"]),
            ("(c) crosscloud, chunks only", r["payload"]),
            ("(c) crosscloud, with metadata", r["wire"])]
    for label, n in rows:
        print(f"{label:<36} {human_bytes(n):>12} {n / r['logical']:>10.3f} {n / r['whole_file']:>13.3f}")
    print(f"logical bytes (distinct needed artifacts: {len(r['needed'])}): {human_bytes(r['logical'])}; "
          f"read by jobs (per job): {human_bytes(r['read_by_jobs'])}")
    print("crosscloud chunk bytes per source: "
          + ", ".join(f"{c} {human_bytes(b)}" for c, b in sorted(r["sources"].items()))
          + "; all bytes read per source (chunks, manifests, indexes): "
          + ", ".join(f"{c} {human_bytes(b)}" for c, b in r["wire_by_source"].items()))
    print(f"crosscloud metadata overhead: {human_bytes(r['wire'] - r['payload'])} "
          f"({(r['wire'] - r['payload']) / max(1, r['wire']):.1%} of bytes moved)")


# ---------------------------------------------------------------- first step


def first_step(target: LocalStore, sources: list, refs: dict[str, BlobRef], ckpt: str, shards: list[str],
               cfg: ModelConfig, args, rate: float | None) -> tuple[float, float]:
    """Seconds until the resume task's first training step is done on ``target``; also the fetch part."""
    t0 = time.perf_counter()
    index = ChunkIndex(target, TENANT)
    missing = [refs[n] for n in [ckpt, *shards] if not warmth(target, TENANT, refs[n], index=index).warm]
    if missing:
        fetch_all(target, sources, TENANT, missing, TransferReport(), RateCap(rate) if rate else None)
    t_fetch = time.perf_counter() - t0
    state = from_bytes(read_blob(target, TENANT, refs[ckpt]))
    data = data_tensor([read_blob(target, TENANT, refs[n]) for n in shards])
    model, opt = resume_from(state, cfg, args.lr, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 4242)
    loss = lm_loss(model, batches(data, args.batch, cfg.seq_len, gen))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if not torch.isfinite(loss):
        raise SystemExit("resume step gave a non-finite loss")
    return time.perf_counter() - t0, t_fetch


def time_first_step(root: Path, source: LocalStore, near: LocalStore, entries: dict[str, Entry], facts: dict,
                    cfg: ModelConfig, args, rate: float | None) -> dict:
    ckpt, shards = facts["checkpoints"][-1], facts["all_shards"]
    refs = {n: e.ref for n, e in entries.items()}
    warm_target = LocalStore(root / "warm-target", "target")
    fetch_all(warm_target, [near, source], TENANT, [refs[n] for n in [ckpt, *shards]], TransferReport())  # preheat
    cold, warm, cold_fetch = [], [], []
    for i in range(args.repeats):
        links = (CountingLink(args.near_bandwidth_mbps, args.near_rtt_ms), CountingLink(args.bandwidth_mbps, args.rtt_ms))
        sources = [LinkedStore(near, links[0]), LinkedStore(source, links[1])]
        total, fetched = first_step(LocalStore(root / f"cold-target-{i}", "target"), sources, refs, ckpt, shards,
                                    cfg, args, rate)
        cold.append(total)
        cold_fetch.append(fetched)
        wire = [link.bytes_sent for link in links]
        requests = [link.requests for link in links]
        at_rate = sum(b / link.bytes_per_s for b, link in zip(wire, links))
        total, _ = first_step(warm_target, sources, refs, ckpt, shards, cfg, args, rate)
        warm.append(total)
        print(f"  first step run {i + 1}/{args.repeats}: cold {cold[-1]:.2f} s (fetch {fetched:.2f} s, "
              f"{human_bytes(links[0].bytes_sent + links[1].bytes_sent)} over WAN), warm {warm[-1]:.3f} s",
              file=sys.stderr, flush=True)
    return {"cold": statistics.median(cold), "warm": statistics.median(warm),
            "cold_fetch": statistics.median(cold_fetch), "cold_all": cold, "warm_all": warm,
            "wire": wire, "requests": requests, "at_rate": at_rate,
            "bytes": sum(refs[n].size for n in [ckpt, *shards])}


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-size", default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shards", type=int, default=8, help="training shards of the corpus (first half pretrains the base)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3, help="pretraining and checkpoint-run learning rate")
    p.add_argument("--ft-lr", type=float, default=1e-3)
    p.add_argument("--base-steps", type=int, default=40)
    p.add_argument("--ft-steps", type=int, default=20)
    p.add_argument("--full-variants", type=int, default=3)
    p.add_argument("--frozen-variants", nargs="*", default=["head", "last-block", "last-block"],
                   help="one frozen-layer fine-tune per entry: head | last-block (what it trains)")
    p.add_argument("--quantize", nargs="*", default=["fp16", "bf16"], choices=sorted(DTYPES))
    p.add_argument("--ckpt-steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--bandwidth-mbps", type=float, default=100.0, help="WAN link source -> target")
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--near-bandwidth-mbps", type=float, default=1000.0, help="link near cloud -> target")
    p.add_argument("--near-rtt-ms", type=float, default=10.0)
    p.add_argument("--rate-cap-mbps", type=float, default=0.0, help="preheat rate cap (0: none)")
    p.add_argument("--repeats", type=int, default=3, help="cold/warm first-step runs (median)")
    p.add_argument("--plan-artifacts", type=int, default=50_000)
    p.add_argument("--plan-clouds", type=int, default=16)
    p.add_argument("--plan-bytes", type=float, default=10e12)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--workdir", default=None, help="keep the stores here instead of a temporary folder")
    args = p.parse_args(argv)
    if args.ckpt_every <= 0 or args.ckpt_steps < args.ckpt_every:
        p.error("--ckpt-steps must be >= --ckpt-every > 0 (the resume job needs a checkpoint)")
    torch.set_num_threads(args.threads)
    cfg = preset(args.model_size)
    rate = args.rate_cap_mbps * 1e6 / 8 if args.rate_cap_mbps > 0 else None

    with tempfile.TemporaryDirectory(prefix="bench-preheat-") as tmp:
        root = Path(args.workdir or tmp)
        source, near = LocalStore(root / "source", "source"), LocalStore(root / "near", "near")
        print(f"model {args.model_size} ({cfg.d_model}d x {cfg.n_layers} layers), seed {args.seed}; "
              f"building the catalog in cloud 'source'", flush=True)
        t0 = time.perf_counter()
        entries, _, facts = build_catalog(source, args, cfg)
        put_blob(near, TENANT, read_blob(source, TENANT, entries[facts["base"]].ref), "model")
        print(f"catalog built in {time.perf_counter() - t0:.1f} s; cloud 'near' holds {facts['base']}\n")
        chunks = chunk_sets(source, entries)
        print_catalog(source, entries, chunks, facts["base"])

        print("\n== making cloud 'target' (empty) ready for the jobs; sources nearest first: near, source")
        jobs = job_sets(facts, entries)
        moved = bytes_moved(root / "moved", source, near, entries, jobs, rate)
        print_moved(jobs, entries, moved)

        print(f"\n== first step of the migrated 'resume' task: source link {args.bandwidth_mbps:g} Mbit/s "
              f"{args.rtt_ms:g} ms RTT, near link {args.near_bandwidth_mbps:g} Mbit/s {args.near_rtt_ms:g} ms RTT, "
              f"rate cap {args.rate_cap_mbps or 'none'}", flush=True)
        fs = time_first_step(root / "first-step", source, near, entries, facts, cfg, args, rate)
        print(f"resume task reads {human_bytes(fs['bytes'])} ({facts['checkpoints'][-1]} + {len(facts['all_shards'])} shards)")
        print(f"cold target:       {fs['cold']:.3f} s to first step (of which fetch {fs['cold_fetch']:.3f} s; "
              f"runs {', '.join(f'{s:.2f}' for s in fs['cold_all'])})")
        print(f"  cold fetch over the links (last run): near {human_bytes(fs['wire'][0])} in {fs['requests'][0]} requests, "
              f"source {human_bytes(fs['wire'][1])} in {fs['requests'][1]} requests; the bytes alone at link rate "
              f"take {fs['at_rate']:.3f} s, the rest is round trips and local work")
        print(f"preheated target:  {fs['warm']:.3f} s to first step (runs {', '.join(f'{s:.3f}' for s in fs['warm_all'])}); "
              f"{fs['warm'] / fs['cold']:.1%} of cold")

    print(f"\n== planner: synthetic catalog of {args.plan_artifacts} artifacts, {human_bytes(args.plan_bytes)} logical, "
          f"{args.plan_clouds} clouds", flush=True)
    t0 = time.perf_counter()
    artifacts, held, budgets, dem, pins = synthetic_catalog(args.plan_artifacts, args.plan_clouds,
                                                            int(args.plan_bytes), args.seed)
    t1 = time.perf_counter()
    result = choose_warm_sets(artifacts, held, budgets, dem, pins, SYNTHETIC_NOW)
    plan_s = time.perf_counter() - t1
    print(f"catalog generated in {t1 - t0:.2f} s ({len(dem)} (artifact, cloud) demand pairs, {len(pins)} pins); "
          f"plan in {plan_s:.2f} s: fetch {human_bytes(result.fetch_bytes)}, evict {human_bytes(result.evict_bytes)}, "
          f"warm {human_bytes(result.used_bytes)}")

    print(f"bytes_moved_vs_whole_file={moved['wire'] / moved['whole_file']:.4f} "
          f"bytes_moved_vs_file_cache={moved['wire'] / moved['file_cache']:.4f} "
          f"first_step_warm_s={fs['warm']:.3f} first_step_cold_s={fs['cold']:.3f} plan_s={plan_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
