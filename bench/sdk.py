"""SDK overhead: the same model trained for the same steps by a plain loop and through crosscloud's SDK, one cloud.

Both legs train ``--program`` (default the built-in ``examples/byte_lm/train.py``;
``--arg K=V`` its arguments): its ``build_model(args)`` (same seed, same
initial weights), its optimizer, ``--batch`` sequences per step, for
``--steps`` steps, on its dataset's training files as the run stores them
(``pipeline.inputs.dataset_files``: the python-stdlib shards built with the
federation's shard count and the seed, or a files dataset such as the HF
example's ``stdlib-bpe``, prepared on first use; one cloud gets them all),
drawn by the program's own batch generator (``windows``, or ``batches`` with
``optimizer`` and ``train_step`` as the HF example defines them), so both legs
see the very same batches. Legs alternate, ``--repeats`` times each.

- plain: an ordinary PyTorch loop with no SDK, one thread (sub-tasks run with
  ``OMP_NUM_THREADS=1``), in a fresh process of its own as the SDK's sub-task is
  (see ``plain_in_fresh_process``); timed from the first batch drawn to the last
  optimizer step.
- SDK: a real single-cluster run through the engine's stages
  (``pipeline.stages.run_job``): one cloud (``--cloud``), one device,
  ``--steps // --inner-steps`` rounds of ``--inner-steps``, no compression.
  Timed as the sub-task lived it: the sum over rounds of
  ``run.baseline.round_seconds`` (waits, downloads and fold-ins, compute, and
  uploads: the cloud's resume state and its delta) less round 0's wait, which is
  start-up (the wait for global 0), and less the program's ``evaluate`` calls
  (each round's ``eval_s``: the evaluations the job asks for with
  ``eval_every_steps``, which the plain loop does not do; printed apart). So
  every round-boundary cost counts, the copies around an evaluation included.

On a shared machine the wall time of one leg swings with whatever else runs
(other processes take the core it trains on), so the overhead is measured on
CPU time by process: the plain leg's process over its loop, and the SDK
sub-task's process (every thread: training, the exchange beside it, the
state and delta writes) over its rounds, from each round's ``cpu_s`` (less the
evaluations' ``eval_cpu_s``), and after its last round, from what the sub-task
writes when it ends (``sdk-finished.json``: the last round's state, commit and
exchange, and the fold-in of the last global). A thread that works beside
training on the other core counts in full. Each repeat's overhead compares the
two legs of that repeat, which ran one after the other.

Legs that last seconds swing by more than the goal with the machine's load,
CPU time too (a busy neighbour slows the caches both legs share). So the SDK
leg also measures its own cost inside the same process, at the same moment:
its CPU less the program's steps (each round's ``train_cpu_s``, the training
thread between ``diloco.step`` calls) is what the SDK spent, in every thread.
That figure misses only what the SDK's work does to the program's steps; the
plain leg's CPU against ``train_cpu_s`` shows whether there is any. Last line:
``plain_tokens_per_s=<x> sdk_tokens_per_s=<y> sdk_overhead_pct=<z>
sdk_overhead_pct_range=<lo>..<hi> sdk_overhead_pct_repeats=<n>
sdk_overhead_pct_spread_wider_than_margin=<0|1>`` and the same four fields of
``sdk_own_cpu_pct`` (the SDK's own CPU in percent of the leg's) and of
``sdk_wall_overhead_pct``: tokens/s are wall-clock medians (tokens = steps *
batch * seq_len); ``z = (1 - plain_s / sdk_s) * 100`` is the SDK's cost in
percent of its CPU time, positive when the SDK costs more (goal: at most 3),
its median with its range over the repeats and whether that range is wider
than the median's distance to the goal (``spread.Spread``); the wall figure is
the same on wall seconds. Exit status 1 when a leg did not train.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from crosscloud.core.federation import load_federation
from crosscloud.core.job import DEFAULT_PROGRAM, JobSpec, key_values
from crosscloud.training.program import load_program, program_source
from spread import Spread

GOAL_PCT = 3.0

EXPERIMENT = "bench_sdk"
DATASET = "python-stdlib"  # built from this machine's stdlib, so both legs can read the same bytes


def job(args: argparse.Namespace) -> JobSpec:
    """The SDK leg's job; the plain leg takes its seed, lr, model and batch from it too."""
    program = load_program(program_source(args.program))
    dataset = args.dataset or getattr(program, "DATASET", DATASET)  # the program's own, as admission settles it
    return JobSpec(mode="single_cluster", clouds=[args.cloud], devices_per_cloud=1,
                   rounds=args.steps // args.inner_steps, inner_steps=args.inner_steps, global_batch=args.batch,
                   model_size=args.model_size, seed=args.seed, compression="none", dataset=dataset,
                   program=args.program, program_args=key_values(args.arg))


def plain_inputs(spec: JobSpec, folder: Path, federation: str | None, cloud: str) -> dict:
    """What the plain leg reads of a run (plain values, for another process): the run's files, local, in its order.

    ``dataset_files`` is what admission reads: the stdlib's shards built, or a files dataset's files (prepared on
    first use)."""
    from crosscloud.pipeline.inputs import dataset_files

    train, held = dataset_files(load_federation(federation), spec)

    def write(f) -> str:
        with open(folder / f.name, "wb") as fh:
            for block in f.blocks():
                fh.write(block)
        return str(folder / f.name)

    return {"args": spec.program_run_args(), "cloud": cloud, "batch": spec.global_batch, "program": spec.program,
            "data": [write(f) for f in train], "evals": [write(f) for f in held]}


def plain_in_fresh_process(inputs: dict, steps: int) -> dict:
    """The plain leg in a process of its own, as the SDK's sub-task is. Not in this one: once a run's coordinator
    has worked here, glibc's malloc hands the training step's freed memory back to the kernel and faults it in
    again every step (7x the page faults, the loop about 25% slower), a cost of this benchmark, not of the SDK."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(plain_leg, (inputs, steps))


def plain_loop(program, run):
    """The program's model, an optimizer, its batches and one training step, as a plain loop (no SDK) runs them:
    the program's own ``optimizer``/``batches``/``train_step`` where it has them (the HF example), else the
    built-in byte model's loop (AdamW at the job's lr, ``windows``, next-byte cross entropy)."""
    model = program.build_model(run.args)
    if hasattr(program, "train_step"):
        opt = program.optimizer(model, run.args)
        return model, program.batches(run, 0), lambda batch: program.train_step(model, model, opt, batch, run)
    opt = torch.optim.AdamW(model.parameters(), lr=run.args["lr"], weight_decay=0.0)

    def step(batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return model, program.windows(run, 0), step


def plain_leg(inputs: dict, steps: int) -> dict:
    """The program's model trained by an ordinary loop: no rounds, no commits, no state saved."""
    torch.set_num_threads(1)  # sub-tasks run with OMP_NUM_THREADS=1
    program = load_program(program_source(inputs["program"]))
    data, evals = [Path(f) for f in inputs["data"]], [Path(f) for f in inputs["evals"]]
    run = SimpleNamespace(args=inputs["args"], cloud=inputs["cloud"], rank=0, world_size=1,  # what the batches read
                          batch_size=inputs["batch"], device=torch.device("cpu"),
                          data_files=lambda: data, eval_files=lambda: evals)
    model, batches, step = plain_loop(program, run)
    start_loss = program.evaluate(model, run)
    losses, tokens = [], 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i, batch in enumerate(batches):
        losses.append(step(batch))
        tokens += batch.shape[0] * (batch.shape[1] - 1)  # windows of seq_len + 1: every position predicts the next
        if i + 1 == steps:
            break
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": seconds, "cpu_s": cpu, "tokens": tokens, "eval_start": start_loss,
            "eval_end": program.evaluate(model, run),
            "train_first": float(losses[0]), "train_last": float(torch.stack(losses[-50:]).mean())}


def sdk_leg(spec: JobSpec, run_id: str, federation: str | None, cloud: str, log) -> dict:
    """A real run on one cloud; its training time from the sub-task's own round records."""
    # imported here, so that the plain leg's process need not import the engine
    from crosscloud.pipeline.stages import run_job
    from crosscloud.run.baseline import round_seconds

    summary = run_job(spec, run_id, federation, EXPERIMENT, log=log, compare_baseline=False)
    history = summary["history"]
    if len(history) != spec.rounds or any(cloud not in r["clouds"] for r in history):
        raise RuntimeError(f"run {run_id}: {len(history)} of {spec.rounds} rounds recorded with {cloud}")
    recs = [r["clouds"][cloud] for r in history]
    evals = sum(c.get("eval_s") or 0.0 for c in recs[1:])  # round 0's evaluation of global 0 is in its wait
    cpu = sum(c["cpu_s"] for c in recs) - sum(c["eval_cpu_s"] for c in recs[1:])  # round 0's from its start
    tail = finished(spec, run_id, federation, cloud)  # after the last round's end: its state, commit and exchange
    cpu += tail["cpu_s"] - tail["eval_cpu_s"]
    train_cpu = sum(c["train_cpu_s"] for c in recs)  # the program's steps, measured inside the same process
    seconds = sum(round_seconds(r) for r in history) - recs[0]["wait_s"] - evals
    parts = {k: sum(c[k] for c in recs) for k in ("compute_s", "upload_s", "download_s", "wait_s")}
    parts["wait_s"] -= recs[0]["wait_s"]
    # a cross-check of the method: time between round starts that no record holds (progress, base copies, the log)
    first, last = recs[0].get("started_at"), recs[-1].get("started_at")
    outside = None if first is None or last is None else \
        (last - first) - (seconds + evals - recs[-1]["compute_s"] - recs[-1]["upload_s"])
    m = summary["metrics"]
    return {"seconds": seconds, "eval_start": m["eval_loss_start"], "eval_end": m["final_eval_loss"],
            "outside_s": outside, "eval_s": evals, "cpu_s": cpu, "train_cpu_s": train_cpu, **parts}


def finished(spec: JobSpec, run_id: str, federation: str | None, cloud: str) -> dict:
    """What the sub-task wrote when it ended: the CPU it spent after its last round's record."""
    from crosscloud.core.keys import RunKeys
    from crosscloud.store.open_store import open_store

    store = open_store(load_federation(federation).cloud(cloud), spec.tenant)
    return json.loads(store.get(RunKeys(spec.tenant, run_id).sdk_finished(cloud)))


def overhead_pct(plain_s: float, sdk_s: float) -> float:
    """The SDK's throughput cost in percent: same tokens, ``plain_s`` against ``sdk_s`` seconds."""
    return (1.0 - plain_s / sdk_s) * 100


def trained(leg: dict) -> bool:
    """Held-out loss fell, and clearly: a leg that trained nothing measures nothing."""
    return leg["eval_end"] < leg["eval_start"] - 0.1


def report(i: int, plain: dict, sdk: dict, tokens: int) -> str:
    """One repeat: both rates, both losses, and where the SDK's seconds went (rounds: all but compute)."""
    outside = "n/a" if sdk["outside_s"] is None else f"{sdk['outside_s']:.2f}"
    rounds_pct = (sdk["seconds"] - sdk["compute_s"]) / sdk["seconds"] * 100  # evaluations are out of both
    return (f"repeat {i}: CPU time plain {plain['cpu_s']:.2f} s, sdk {sdk['cpu_s']:.2f} s "
            f"(overhead {overhead_pct(plain['cpu_s'], sdk['cpu_s']):.2f}%; its steps {sdk['train_cpu_s']:.2f} s, "
            f"the SDK's own {overhead_pct(sdk['train_cpu_s'], sdk['cpu_s']):.2f}%); "
            f"plain {tokens / plain['seconds']:.1f} tok/s in {plain['seconds']:.2f} s "
            f"(train loss {plain['train_first']:.3f} -> {plain['train_last']:.3f} last-50 mean, "
            f"eval {plain['eval_start']:.4f} -> {plain['eval_end']:.4f}); "
            f"sdk {tokens / sdk['seconds']:.1f} tok/s in {sdk['seconds']:.2f} s "
            f"(eval {sdk['eval_start']:.4f} -> {sdk['eval_end']:.4f}): compute {sdk['compute_s']:.2f} s, "
            f"upload (state + delta) {sdk['upload_s']:.2f} s, download/fold-in {sdk['download_s']:.2f} s, "
            f"wait {sdk['wait_s']:.2f} s (rounds' own cost {rounds_pct:.1f}% of the leg), evaluations "
            f"{sdk['eval_s']:.2f} s not counted; "
            f"between round starts outside the records ~{outside} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--program", default=DEFAULT_PROGRAM, help="the training program both legs train")
    p.add_argument("--arg", action="append", default=[], metavar="K=V", help="a program argument (JSON or text)")
    p.add_argument("--dataset", default=None, help="the federation's dataset (default: the program's own)")
    p.add_argument("--model-size", default="small", help="the built-in byte model's size (other programs: --arg)")
    p.add_argument("--steps", type=int, default=400, help="total inner steps of each leg")
    p.add_argument("--inner-steps", type=int, default=50, help="H: steps per round of the SDK leg")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--repeats", type=int, default=3, help="plain and SDK legs alternate this many times; medians")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cloud", default="beijing")
    p.add_argument("--federation", default=None, help="federation file (default: the embedded one)")
    p.add_argument("--verbose", action="store_true", help="print the SDK run's log")
    args = p.parse_args(argv)
    if args.steps % args.inner_steps:
        p.error(f"--steps {args.steps} is not a multiple of --inner-steps {args.inner_steps}")
    spec, log = job(args), (print if args.verbose else (lambda m: None))
    inputs = plain_inputs(spec, Path(tempfile.mkdtemp(prefix="bench-sdk-")), args.federation, args.cloud)
    print(f"program {args.program} {spec.program_args or ''} (model_size {args.model_size}), dataset {spec.dataset}, "
          f"{args.steps} steps x {args.batch} sequences ({spec.rounds} rounds x {args.inner_steps} for the SDK), "
          f"cloud {args.cloud}, seed {args.seed}", flush=True)
    tag, legs, ok = time.strftime("%Y%m%d-%H%M%S"), [], True
    for i in range(args.repeats):  # alternated, so that a slow spell of the shared machine hits both legs
        plain = plain_in_fresh_process(inputs, args.steps)
        sdk = sdk_leg(spec, f"bench-sdk-{tag}-{i}", args.federation, args.cloud, log)
        legs.append((plain, sdk))
        print(report(i, plain, sdk, plain["tokens"]), flush=True)  # the SDK leg trained the very same batches
        for name, leg in (("plain", plain), ("sdk", sdk)):
            if not trained(leg):
                print(f"  {name} leg did not train: eval loss {leg['eval_start']:.4f} -> {leg['eval_end']:.4f}")
                ok = False
    cpu = Spread.of(overhead_pct(p["cpu_s"], s["cpu_s"]) for p, s in legs)
    own = Spread.of(overhead_pct(s["train_cpu_s"], s["cpu_s"]) for _, s in legs)
    wall = Spread.of(overhead_pct(p["seconds"], s["seconds"]) for p, s in legs)
    print(f"plain_tokens_per_s={statistics.median(p['tokens'] / p['seconds'] for p, _ in legs):.1f} "
          f"sdk_tokens_per_s={statistics.median(p['tokens'] / s['seconds'] for p, s in legs):.1f} "
          f"{cpu.fields('sdk_overhead_pct', GOAL_PCT)} {own.fields('sdk_own_cpu_pct', GOAL_PCT)} "
          f"{wall.fields('sdk_wall_overhead_pct', GOAL_PCT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
