"""Iteration-time gap of a cross-cloud run against a single cluster, measured side by side.

Three configurations of the same job (model, global batch, inner steps, total
tokens, seed), each a real run through the engine's stages:

1. single-cluster, synchronous: one cloud, 2 worker processes, gradient
   all-reduce every step (torch.distributed, gloo);
2. single-cluster, same algorithm: crosscloud's rounds with one worker in each
   of two zones of one site, exchanging through object storage with no WAN;
3. cross-cloud: 2 clouds x 1 worker, every transfer between them over an
   emulated WAN link (bandwidth and round trip are flags).

A run's final loss moves by about 1% with the draw of its batches alone (the
single cluster's, seeds 0-2 of the data with one init: 1.974, 2.011, 1.997), so
each repeat takes the next seed, the same for all three configurations; the
table's losses are their means. The default run (80 rounds x 20 steps) goes on
until the descent slows: a run stopped mid-descent compares how fast the two
descend at that moment, not where they end (the rounds are some steps behind
early on and catch up); the evaluations on the way show the ratio along the run.

Each figure is computed per repeat, from the three configurations that ran one
after another on that repeat's seed, and quoted as the median over repeats with
its range (``spread.Spread``). The configurations share the machine's two
cores with whatever else runs: the table's ``CPU/wall`` column is the CPU time
each sub-task process got per second of its rounds (``cpu_s`` of its records),
so a configuration that ran short of CPU shows. Prints a table (means over the
repeats) and ends with
``iteration_time_gap_pct=<(3) vs (1)> wan_penalty_pct=<(3) vs (2)> loss_ratio=<(3)/(1)> bytes_per_round=<WAN bytes
of (3)>``, each with ``_range=<lo>..<hi>`` and ``_repeats=<n>``, and the first three with
``_spread_wider_than_margin=<0|1>`` against their goals (3, 3, 1.02).
``--sweep`` adds the gap for several model sizes and link bandwidths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, load_federation
from crosscloud.core.job import LR_SCALINGS, JobSpec, key_values
from crosscloud.core.paths import state_dir
from crosscloud.pipeline.stages import run_job
from crosscloud.run.baseline import gap_pct, iteration_time, round_seconds
from spread import Spread

GOALS = {"iteration_time_gap_pct": 3.0, "wan_penalty_pct": 3.0, "loss_ratio": 1.02}

EXPERIMENT = "bench_gap"


def federation(bandwidth_mbps: float, rtt_ms: float) -> dict:
    """Site A (two zones, no WAN between them) and cloud B behind an emulated WAN link."""

    def cloud(name: str, role: str, devices: int) -> dict:
        return {
            "name": name, "role": role, "jurisdiction": "EU", "region": name, "access": {"method": "local"},
            "store": {"url": f"file://bench-gap/{name}"},
            "pools": [{"accelerator": "cpu", "count": devices, "power_w": 65, "price_per_device_hour": 0.1}],
        }

    return {
        "name": "bench-gap",
        "jurisdictions": {"EU": {}},
        "clouds": [cloud("site-a", "local", 2), cloud("site-a-zone2", "collaboration", 1), cloud("cloud-b", "collaboration", 1)],
        "links": [
            {"a": "site-a", "b": "site-a-zone2", "bandwidth_mbps": 100000, "latency_ms": 0.1},
            {"a": "site-a", "b": "cloud-b", "bandwidth_mbps": bandwidth_mbps, "latency_ms": rtt_ms, "emulate": True},
        ],
        "tenants": [{"name": "bench", "quotas": {"site-a": 2, "site-a-zone2": 1, "cloud-b": 1}}],
        # the embedded federation's model families and datasets, homed at site A: any program it can run runs here
        "images": [{"accelerator": "cpu", "family": f, "image": "crosscloud-worker:cpu"}
                   for f in sorted({i.family for i in load_federation(DEFAULT_FEDERATION).images})],
        "datasets": [{**d.model_dump(exclude_none=True), "home": "site-a", "residency": None}
                     for d in load_federation(DEFAULT_FEDERATION).datasets],
    }


CONFIGS = {
    "single_sync": {"mode": "single_cluster", "clouds": ["site-a"], "devices_per_cloud": 2},
    "single_rounds": {"clouds": ["site-a", "site-a-zone2"]},
    "cross_cloud": {"clouds": ["site-a", "cloud-b"]},
}


def measure(history: list[dict], h: int, overlap: bool) -> dict:
    """Per-round seconds split into compute / communication / waiting, from the slowest cloud."""
    rounds = history[1:] or history
    per_step = [round_seconds(r) / h for r in rounds]
    # overlap: the steps a cloud trained on its own progress before the last round's global came (all h
    # when it came only after the round); blocking rounds start from it
    folds = [h if c.get("folded_at_step") is None else c["folded_at_step"] for r in rounds for c in r["clouds"].values()]

    def part(r: dict, keys: tuple[str, ...]) -> float:
        slowest = max(r["clouds"].values(), key=lambda c: c["wait_s"] + c["download_s"] + c["compute_s"] + c["upload_s"])
        return sum(slowest[k] for k in keys)

    return {
        "mean_s": iteration_time(history, h),
        "p95_s": sorted(per_step)[max(0, round(0.95 * len(per_step)) - 1)],
        "compute_s": statistics.mean(part(r, ("compute_s",)) for r in rounds),
        "comm_s": statistics.mean(part(r, ("download_s", "upload_s")) for r in rounds),
        "wait_s": statistics.mean(part(r, ("wait_s",)) for r in rounds),
        "wan_bytes": statistics.mean(r.get("wan_bytes", 0) for r in rounds),
        "late_steps": statistics.mean(folds) if overlap else 0.0,
        "cpu_share": cpu_share(rounds),
    }


def cpu_share(rounds: list[dict]) -> float:
    """The CPU time a cloud's sub-task process got per second of its round (every thread; above 1 when the
    exchange works beside training), mean over clouds and rounds: what the shared machine gave each configuration.
    NaN for records without ``cpu_s``."""
    shares = [c["cpu_s"] / total for r in rounds for c in r["clouds"].values()
              if c.get("cpu_s") is not None and (total := c["wait_s"] + c["download_s"] + c["compute_s"] + c["upload_s"])]
    return statistics.mean(shares) if shares else float("nan")


def repeat_figures(runs: dict[str, list[dict]]) -> dict[str, Spread]:
    """Each figure per repeat (the three configurations of a repeat ran one after another, on one seed), as a spread."""
    per = list(zip(runs["single_sync"], runs["single_rounds"], runs["cross_cloud"]))
    return {
        "iteration_time_gap_pct": Spread.of(gap_pct(three["mean_s"], one["mean_s"]) for one, _, three in per),
        "wan_penalty_pct": Spread.of(gap_pct(three["mean_s"], two["mean_s"]) for _, two, three in per),
        "loss_ratio": Spread.of(three["loss"] / one["loss"] for one, _, three in per),
        "bytes_per_round": Spread.of(three["wan_bytes"] for _, _, three in per),
    }


def run_config(name: str, base: dict, fed_path: Path, tag: str, log) -> dict:
    spec = JobSpec(tenant="bench", **{**base, **CONFIGS[name]})
    summary = run_job(spec, f"gap-{tag}-{name}", str(fed_path), EXPERIMENT, log=log, compare_baseline=False)
    curve = {(r["round"] + 1) * spec.inner_steps: r["eval_loss"] for r in summary["history"] if r["eval_loss"] is not None}
    return {**measure(summary["history"], spec.inner_steps, spec.overlap), "loss": summary["metrics"]["final_eval_loss"],
            "curve": curve}


def write_federation(folder: Path, bandwidth: float, rtt: float) -> Path:
    path = folder / f"federation-{bandwidth:g}.yaml"
    path.write_text(yaml.safe_dump(federation(bandwidth, rtt)))
    return path


def loss_along(cross: list[dict], single: list[dict], points: int = 4) -> str:
    """The loss ratio of the means at a few steps of the run, from the evaluations every run makes on its way:
    how far the rounds are behind mid-descent, and whether they catch up."""
    steps = sorted(set.intersection(*(set(r["curve"]) for r in cross + single)))
    picks = sorted({max((s for s in steps if s <= steps[-1] * k / points), default=0) for k in range(1, points + 1)} - {0})
    ratios = (statistics.mean(r["curve"][s] for r in cross) / statistics.mean(r["curve"][s] for r in single) for s in picks)
    return "loss ratio along the run (step: cross_cloud / single_sync): " + ", ".join(
        f"{s}: {q:.4f}" for s, q in zip(picks, ratios))


def table(results: dict[str, dict]) -> str:
    head = (f"{'configuration':<16}{'mean ms/step':>13}{'p95 ms/step':>12}{'compute s':>11}{'comm s':>8}{'wait s':>8}"
            f"{'WAN bytes/rd':>14}{'global late':>12}{'eval loss':>10}{'CPU/wall':>9}")
    rows = [head]
    for name, r in results.items():
        rows.append(
            f"{name:<16}{1000 * r['mean_s']:>13.1f}{1000 * r['p95_s']:>12.1f}{r['compute_s']:>11.2f}{r['comm_s']:>8.3f}"
            f"{r['wait_s']:>8.3f}{r['wan_bytes']:>14.0f}{r['late_steps']:>12.1f}{r['loss']:>10.4f}{r['cpu_share']:>9.2f}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bandwidth-mbps", type=float, default=100.0)
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--program", default=JobSpec.program, help="the training program every configuration runs")
    p.add_argument("--arg", action="append", default=[], metavar="K=V", help="a program argument (JSON or text)")
    p.add_argument("--dataset", default=JobSpec.dataset, help="the federation's dataset (default: the program's own)")
    p.add_argument("--model-size", default="small")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--inner-steps", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=24)
    p.add_argument("--inner-lr", type=float, default=JobSpec.inner_lr)
    p.add_argument("--local-lr-scaling", default=JobSpec.local_lr_scaling, choices=list(LR_SCALINGS),
                   help="a cloud's lr against its share of the global batch (job.local_lr)")
    p.add_argument("--fold-mix", type=float, default=JobSpec.fold_mix,
                   help="overlap: the share of its own drift a cloud keeps when the late global is folded in")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-overlap", action="store_true", help="blocking rounds, to see what overlapping buys")
    p.add_argument("--compression", default="int8", choices=["int8", "none"])
    p.add_argument("--repeats", type=int, default=3,
                   help="run each configuration this many times, interleaved, with seeds seed, seed + 1, ...; figures are medians")
    p.add_argument("--sweep", action="store_true", help="add the gap over model sizes and link bandwidths")
    p.add_argument("--sweep-sizes", nargs="+", default=["tiny", "small", "base"])
    p.add_argument("--sweep-bandwidths", nargs="+", type=float, default=[10.0, 100.0, 1000.0], metavar="MBPS")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    log = print if args.verbose else (lambda msg: None)
    tag = time.strftime("%Y%m%d-%H%M%S")
    base = {"model_size": args.model_size, "rounds": args.rounds, "inner_steps": args.inner_steps,
            "global_batch": args.global_batch, "inner_lr": args.inner_lr, "seed": args.seed, "overlap": not args.no_overlap,
            "compression": args.compression, "local_lr_scaling": args.local_lr_scaling, "fold_mix": args.fold_mix,
            "program": args.program, "program_args": key_values(args.arg), "dataset": args.dataset}
    folder = Path(tempfile.mkdtemp(prefix="bench-gap-"))
    fed = write_federation(folder, args.bandwidth_mbps, args.rtt_ms)
    print(f"link {args.bandwidth_mbps:g} Mbit/s, {args.rtt_ms:g} ms RTT; program {args.program} {base['program_args']}, "
          f"model {args.model_size}, "
          f"{args.rounds} rounds x {args.inner_steps} steps, global batch {args.global_batch}", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for i in range(args.repeats):  # interleaved, so that a slow spell of the machine hits every configuration
        seeded = {**base, "seed": args.seed + i}
        for name in CONFIGS:
            runs[name].append(run_config(name, seeded, fed, f"{tag}-{i}", log))
            r = runs[name][-1]
            print(f"  {name} (seed {seeded['seed']}): {1000 * r['mean_s']:.1f} ms/step, eval loss {r['loss']:.4f}", flush=True)
        print(f"  seed {seeded['seed']}: loss ratio {runs['cross_cloud'][-1]['loss'] / runs['single_sync'][-1]['loss']:.4f}", flush=True)
    results = {name: {k: statistics.mean(r[k] for r in rs) for k in rs[0] if k != "curve"} for name, rs in runs.items()}
    print(table(results))
    print(loss_along(runs["cross_cloud"], runs["single_sync"]))
    if args.sweep:
        print(sweep(base, folder, tag, args.rtt_ms, log, args.sweep_sizes, args.sweep_bandwidths))
    figures = repeat_figures(runs)
    # bench-scheduling takes a split job's penalty from here
    out = state_dir() / "bench" / "gap.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**{k: v.median for k, v in figures.items()}, "args": vars(args), "measured_at": tag},
                              indent=2))
    print(" ".join(v.fields(k, GOALS.get(k), 4 if k == "loss_ratio" else (0 if k == "bytes_per_round" else 2))
                   for k, v in figures.items()))
    return 0


def sweep(base: dict, folder: Path, tag: str, rtt: float, log, sizes: list[str], bandwidths: list[float]) -> str:
    """Gap of cross-cloud against single-cluster sync over model sizes x link bandwidths."""
    short = {**base, "rounds": max(2, 120 // base["inner_steps"])}  # the main run's rounds, about 120 steps
    lines = [f"sweep ({short['rounds']} rounds x {short['inner_steps']} steps): iteration-time gap % vs single-cluster sync",
             f"{'model':<8}" + "".join(f"{f'{b:g} Mbit/s':>14}" for b in bandwidths)]
    for size in sizes:
        cfg = {**short, "model_size": size}
        fed = write_federation(folder, 1000.0, rtt)
        sync = run_config("single_sync", cfg, fed, f"{tag}-{size}", log)["mean_s"]
        cells = []
        for bw in bandwidths:
            cross = run_config("cross_cloud", cfg, write_federation(folder, bw, rtt), f"{tag}-{size}-{bw:g}", log)
            cells.append(f"{gap_pct(cross['mean_s'], sync):>+14.1f}")
            print(f"  sweep {size} {bw:g} Mbit/s: {cells[-1].strip()}%", flush=True)
        lines.append(f"{size:<8}" + "".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
