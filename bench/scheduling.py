"""Trace-driven scheduling benchmark: centers scheduling alone against the production queue.

Scenario (defaults): the Philly-derived Gavel traces of four virtual clusters
(6214e9, 6c71a0, b436b2, ee9e8c) as four centers with accelerator types v100,
p100, k80, v100, in two jurisdictions (A A B B). The jobs arriving in
``[0, window)`` are simulated (default window: the traces' whole span, i.e.
every job, ending 1 s after the last arrival), each job known only from its
arrival, and every job runs to completion (the simulation drains the queues
after the window). Run times come from Gavel's measured throughputs
(``job_traces``). Each job gets a dataset, drawn from ``--seed``: a
size log-uniform in ``[--data-min-gb, --data-max-gb]`` held at its home center,
and with probability ``--resident-frac`` a residency rule that keeps it in its
home center's jurisdiction. Moving data costs ``bytes / --bandwidth-gbps``.

Definitions:

* **offered load** = sum over jobs arriving in the window of
  (devices x run time on its own center's accelerator) / (total devices x window).
  Every center gets the same device count, the one that makes this ``--load``
  (rounded to whole devices; the achieved value is printed).
* **ideal run time** of a job = its run time alone on the fastest accelerator
  type present in the federation, on its own device count, with no waiting,
  no data transfer and no split.
* **execution efficiency** = ideal run time / job completion time (finish -
  arrival), averaged over jobs (a job that never ran counts as 0); 1.0 means
  no waiting and no slowdown.
* **useful device-hours per hour** = sum over jobs of devices x ideal run time x
  (fraction of the job's run that falls within the window), divided by the
  window in hours: work done in the window, valued at the fastest type's rate.
* **utilization** of a center = device-seconds held (data transfer and run)
  within the window / (devices x window).
* **bytes forwarded** = data moved because a job (or a part of it) ran away
  from its home center.

The split penalty (iteration-time penalty of a job split over clouds) is
``max(0, iteration_time_gap_pct, wan_penalty_pct) / 100`` from
``$CROSSCLOUD_STATE_DIR/bench/gap.json`` when bench-gap left it there, else
2.33 % (bench-gap's last measured wan_penalty_pct), or ``--split-penalty-pct``.

* **longest wait of the largest jobs** = the longest arrival-to-dispatch
  time among the 5 % of jobs asking for the most devices.

``crosscloud`` is the production scheduler's pass (``crosscloud.scheduler``), where a job that can start
now starts (``--wait-for-faster``: it may wait for a faster center, the federation's ``wait_for_faster_pools``);
``greedy`` is admission as it was before the queue: each waiting job starts
wherever placement finds its devices free now, and reserves nothing.

Last line: ``efficiency_gain_vs_independent=<crosscloud / independent>
efficiency_gain_vs_best_reference=<crosscloud / max(first_fit, static_split)>
mean_jct_ratio=<crosscloud / independent>
max_wait_ratio_largest_jobs=<crosscloud / greedy, longest wait of the largest jobs>`` (1 when both are 0,
inf when only greedy's is).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from crosscloud.core.paths import data_dir, state_dir
from crosscloud.pool.placement import JobRequest, Site, Weights, place
from simulation import POLICIES, Center, SimJob, Simulation, largest, max_wait_s, metrics
from job_traces import read_throughputs, read_trace

DEFAULT_VCS = ("6214e9", "6c71a0", "b436b2", "ee9e8c")
DEFAULT_ACCELERATORS = ("v100", "p100", "k80", "v100")
DEFAULT_JURISDICTIONS = ("A", "A", "B", "B")
LAST_MEASURED_WAN_PENALTY_PCT = 2.33
GIB = 1 << 30


def split_penalty(arg_pct: float | None) -> tuple[float, str]:
    if arg_pct is not None:
        return max(0.0, arg_pct) / 100, f"--split-penalty-pct {arg_pct:g}"
    path = state_dir() / "bench" / "gap.json"
    if path.exists():
        try:
            raw = json.loads(path.read_text())
            pct = max(0.0, float(raw["iteration_time_gap_pct"]), float(raw["wan_penalty_pct"]))
            return pct / 100, f"{path} (max(0, iteration_time_gap_pct, wan_penalty_pct) = {pct:g} %)"
        except (ValueError, KeyError, TypeError) as e:
            print(f"warning: {path} unreadable ({e}); using the last measured value", file=sys.stderr)
    return LAST_MEASURED_WAN_PENALTY_PCT / 100, f"bench-gap's last measured wan_penalty_pct (no {path})"


def scenario(args) -> tuple[list[Center], list[SimJob], dict]:
    traces = args.traces or [data_dir() / "traces" / "philly-gavel" / f"{vc}.trace" for vc in DEFAULT_VCS]
    thr_path = args.throughputs or data_dir() / "traces" / "philly-gavel" / "simulation_throughputs.json"
    accs = args.accelerators
    jurs = args.jurisdictions or [DEFAULT_JURISDICTIONS[i % 4] if len(traces) == 4 else "AB"[2 * i // len(traces)]
                                  for i in range(len(traces))]
    if len(accs) != len(traces) or len(jurs) != len(traces):
        sys.exit(f"--accelerators ({len(accs)}) and --jurisdictions ({len(jurs)}) need one entry per trace ({len(traces)})")
    thr = read_throughputs(thr_path)
    for a in set(accs):
        if a not in thr.worker_types:
            sys.exit(f"accelerator {a!r} has no throughputs in {thr_path} (have {', '.join(thr.worker_types)})")
    types = sorted(set(accs))
    rng = random.Random(args.seed)
    names = [Path(t).stem for t in traces]
    if len(set(names)) != len(names):
        names = [f"{n}-{i}" for i, n in enumerate(names)]
    rows = [read_trace(path) for path in traces]
    if args.window_s is None:  # every job of every trace: the window ends just after the last arrival
        args.window_s = max((tj.arrival_s for r in rows for tj in r), default=0.0) + 1.0
    jobs, offered = [], 0.0
    lo, hi = math.log(args.data_min_gb), math.log(args.data_max_gb)
    for name, trace, acc in zip(names, rows, accs):
        for k, tj in enumerate(trace):
            size = int(math.exp(rng.uniform(lo, hi)) * GIB)
            resident = rng.random() < args.resident_frac
            if tj.arrival_s >= args.window_s:
                continue
            rt = {a: tj.runtime_s(thr, a) for a in types}
            jobs.append(SimJob(f"{name}:{k + 1}", name, tj.arrival_s, tj.num_gpus, rt, size, resident, tj.job_type))
            offered += tj.num_gpus * rt[acc]
    if not jobs:
        sys.exit(f"no job arrives within the window of {args.window_s:g} s")
    devices = args.devices or max(1, round(offered / (args.load * len(traces) * args.window_s)))
    centers = [Center(n, a, devices, j) for n, a, j in zip(names, accs, jurs)]
    info = {"offered_load": offered / (devices * len(traces) * args.window_s), "devices": devices,
            "traces": [str(t) for t in traces], "throughputs": str(thr_path)}
    return centers, jobs, info


def table(results: dict[str, dict], centers: list[Center]) -> str:
    head = (f"{'policy':<14}{'efficiency':>11}{'mean JCT h':>12}{'p95 JCT h':>11}{'useful dev-h/h':>16}"
            f"{'forwarded':>11}{'faster':>8}{'split':>7}{'GB fwd':>9}{'never ran':>10}  utilization " + " ".join(c.name for c in centers))
    lines = [head]
    for p, m in results.items():
        util = " ".join(f"{m['utilization'][c.name]:>{len(c.name)}.2f}" for c in centers)
        lines.append(f"{p:<14}{m['efficiency']:>11.3f}{m['mean_jct_s'] / 3600:>12.1f}{m['p95_jct_s'] / 3600:>11.1f}"
                     f"{m['useful_device_hours_per_hour']:>16.1f}{m['forwarded_jobs']:>11}{m['faster_jobs']:>8}{m['split_jobs']:>7}"
                     f"{m['bytes_forwarded'] / 1e9:>9.0f}{m['unfinished']:>10}  {'':<12}{util}")
    return "\n".join(lines)


def scale(repeats: int, clouds: int = 64, queued: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Median ms of one decision with ``clouds`` sites and ``queued`` jobs queued: (state to sites + place, place alone)."""
    rng = random.Random(seed)
    accs = ["v100", "p100", "k80", "a100"]
    names = [f"cloud-{i:02d}" for i in range(clouds)]
    totals = {n: rng.choice([64, 128, 256, 512]) for n in names}
    free = {n: rng.randrange(0, 9) for n in names}
    releases = {n: sorted((rng.uniform(60, 86400), rng.choice([1, 1, 1, 2, 4, 8])) for _ in range(totals[n] // 2))
                for n in names}
    queue = [(rng.choice(names), rng.choice([1, 1, 2, 4, 8]), rng.uniform(600, 36000)) for _ in range(queued)]
    job = JobRequest(name="probe", tenant="t", family="trace", devices=8,
                     runtime_s={a: rng.uniform(3600, 20000) for a in accs}, data_bytes=100 * GIB,
                     data_at=frozenset({names[0]}), split_penalty=0.0233)
    net = lambda src, dst, n: 0.0 if src == dst else n / 1.25e9  # noqa: E731

    def sites() -> list[Site]:
        ahead, ahead_n = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
        for where, d, rt in queue:  # the work queued ahead, per cloud
            ahead[where] += d * rt
            ahead_n[where] += d
        return [Site(n, accs[i % len(accs)], "AB"[i % 2], totals[n], free[n], 1.0 + i % 3, families=frozenset({"trace"}),
                     queued_device_s=ahead[n], queued_devices=ahead_n[n], frees=tuple(releases[n]))
                for i, n in enumerate(names)]

    full, alone = [], []
    built = sites()
    for _ in range(repeats):
        t0 = time.perf_counter()
        place(job, sites(), net)
        full.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        place(job, built, net)
        alone.append(time.perf_counter() - t0)
    return 1000 * statistics.median(full), 1000 * statistics.median(alone)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", nargs="+", type=Path, help="one trace file per center")
    p.add_argument("--throughputs", type=Path)
    p.add_argument("--accelerators", nargs="+", default=list(DEFAULT_ACCELERATORS), help="one per trace")
    p.add_argument("--jurisdictions", nargs="+", help="one per trace (default A A B B)")
    p.add_argument("--load", type=float, default=0.8, help="federation-wide offered load the device count is sized for")
    p.add_argument("--devices", type=int, help="devices per center (overrides --load)")
    p.add_argument("--window-s", type=float,
                   help="simulate the jobs arriving in [0, window); default: every job (the traces' whole span)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-min-gb", type=float, default=1.0)
    p.add_argument("--data-max-gb", type=float, default=500.0)
    p.add_argument("--resident-frac", type=float, default=0.3)
    p.add_argument("--bandwidth-gbps", type=float, default=10.0, help="link bandwidth between centers")
    p.add_argument("--split-penalty-pct", type=float)
    p.add_argument("--wait-for-faster", action="store_true",
                   help="crosscloud lets a job that could start now wait for a faster pool where it finishes sooner "
                        "(the federation's wait_for_faster_pools)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--scale", action="store_true", help="also time one placement at 64 clouds and 1,000 queued jobs")
    p.add_argument("--scale-repeats", type=int, default=200)
    args = p.parse_args(argv)

    penalty, source = split_penalty(args.split_penalty_pct)
    centers, jobs, info = scenario(args)
    print(f"traces: {', '.join(info['traces'])}; throughputs: {info['throughputs']}")
    print(f"{len(jobs)} jobs arriving in {args.window_s / 86400:g} days; {len(centers)} centers x {info['devices']} devices: "
          + ", ".join(f"{c.name} {c.accelerator} ({c.jurisdiction})" for c in centers))
    print(f"offered load {info['offered_load']:.3f} (target {args.load:g}); datasets {args.data_min_gb:g}-{args.data_max_gb:g} GB, "
          f"{args.resident_frac:.0%} resident, links {args.bandwidth_gbps:g} Gbit/s; seed {args.seed}")
    print(f"split penalty {100 * penalty:.2f} % from {source}")
    results, t_all = {}, time.perf_counter()
    big = largest(jobs)
    for policy in args.policies:
        t0 = time.perf_counter()
        sim = Simulation(centers, jobs, policy, window_s=args.window_s, bandwidth_bytes_per_s=args.bandwidth_gbps * 1.25e8,
                         split_penalty=penalty, weights=Weights(wait_for_faster=args.wait_for_faster))
        res = sim.run()
        results[policy] = metrics(res)
        results[policy]["largest_max_wait_s"] = max_wait_s(res, big)
        extra = f", {res.place_calls} placement calls" if policy == "crosscloud" else ""
        print(f"  {policy}: {res.events} events in {time.perf_counter() - t0:.1f} s{extra}", flush=True)
    print(f"simulated in {time.perf_counter() - t_all:.1f} s")
    print(table(results, centers))
    if args.scale:
        full, alone = scale(args.scale_repeats)
        print(f"scale: one placement decision at 64 clouds, 1000 queued jobs: {full:.3f} ms median "
              f"(sites from state + place; place alone {alone:.3f} ms; goal < 5 ms)")
    print(f"longest wait of the {len(big)} largest jobs (5 % by devices): "
          + ", ".join(f"{p} {m['largest_max_wait_s'] / 3600:.1f} h" for p, m in results.items()))
    if {"crosscloud", "independent", "first_fit", "static_split", "greedy"} <= set(results):
        cc, ind, greedy = results["crosscloud"], results["independent"], results["greedy"]
        ref = max(results["first_fit"]["efficiency"], results["static_split"]["efficiency"])
        waits = cc["largest_max_wait_s"], greedy["largest_max_wait_s"]
        ratio = waits[0] / waits[1] if waits[1] else (1.0 if waits[0] == 0 else math.inf)
        print(f"efficiency_gain_vs_independent={cc['efficiency'] / ind['efficiency']:.3f} "
              f"efficiency_gain_vs_best_reference={cc['efficiency'] / ref:.3f} "
              f"mean_jct_ratio={cc['mean_jct_s'] / ind['mean_jct_s']:.3f} "
              f"max_wait_ratio_largest_jobs={ratio:.3f}")


if __name__ == "__main__":
    main()
