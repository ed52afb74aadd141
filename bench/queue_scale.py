"""Queue benchmark: the production scheduler's pass at scale, submissions under load, and fair share.

Every part runs ``crosscloud.scheduler`` as a deployment does:

1. **pass**: ``--entries`` (10,000) runs of ``--tenants`` (8) tenants wait in a
   SQLite ledger over a federation of ``--clouds`` (64) clouds (the embedded
   federation's clouds, repeated), whose devices are mostly held by runs the
   queue started first. Then ``--passes`` rounds of: one running run ends,
   ``--arrivals`` (5) runs are submitted, and one ``Queue.run_pass`` runs,
   timed from the call to its return (reading the queue and the inventory,
   deciding, writing the starts and the decisions). ``pass_p99_ms`` is the
   99th percentile of those passes (goal: at most 1,000).
2. **submissions**: ``bench/admission.py``'s ``--clients`` (16) processes make
   ``--submissions`` (2,000) submissions in all against a PostgreSQL ledger
   on 127.0.0.1, each one ``admit``: enter the queue, a pass, the answer; a
   run that waits is given up (cancelled), a started one ends after a while.
   ``submissions_per_s`` (goal: at least 100) and ``oversubscribed``, the
   instants the ledger's rows, replayed, held more than a pool or a quota
   (goal: 0).
3. **fair share**: two tenants of equal weight on one center of
   ``--fair-devices`` devices; one submits twice the jobs of the other (the
   same sizes: 1-4 devices, 1-10 h), all at once, so both are backlogged.
   The trace simulator (``bench/simulation.py``) runs the production pass.
   While both still wait, each tenant's device-hours against its weighted
   share: ``fair_share_error`` = the largest difference (goal: at most 0.1).

Last line: ``pass_p99_ms=<ms> submissions_per_s=<n> oversubscribed=<n> fair_share_error=<f>``.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' federations and PostgreSQL server

from federations import embedded_raw  # noqa: E402

from crosscloud.core.federation import Federation, parse_federation  # noqa: E402
from crosscloud.core.job import JobSpec  # noqa: E402
from crosscloud.ledger import Ledger  # noqa: E402
from crosscloud.scheduler.admission import entry_for  # noqa: E402
from crosscloud.scheduler.service import Queue  # noqa: E402


def federation(clouds: int, tenants: int, seed: int) -> Federation:
    """``clouds`` clouds like the embedded ones (8 to 64 cpu devices each), ``tenants`` tenants with quota everywhere."""
    raw, rng = embedded_raw(), random.Random(seed)
    base = raw["clouds"][1]
    raw["clouds"] = raw["clouds"][:1]
    for i in range(1, clouds):
        c = copy.deepcopy(base)
        c["name"], c["store"]["url"] = f"cloud-{i:02d}", f"file://clouds/cloud-{i:02d}"
        c["jurisdiction"] = "CN" if i % 2 else "SG"
        raw["clouds"].append(c)
    for c in raw["clouds"]:
        c["pools"][0]["count"] = rng.choice([8, 16, 32, 64])
    names = [c["name"] for c in raw["clouds"]]
    raw["tenants"] = [{"name": f"tenant-{t}", "quotas": {n: 64 for n in names}, "weight": 1 + t % 2}
                      for t in range(tenants)]
    raw["links"] = []
    return parse_federation(raw)


def _spec(rng: random.Random, fed: Federation) -> JobSpec:
    tenant = rng.choice(fed.tenants).name
    return JobSpec(tenant=tenant, placement="auto", devices=rng.choice([1, 1, 2, 4, 8]), rounds=rng.randint(5, 200),
                   priority=rng.choice([0, 0, 0, 1]))


def pass_times(args) -> list[float]:
    """Seconds of each timed pass over a full federation with ``args.entries`` runs waiting."""
    fed = federation(args.clouds, args.tenants, args.seed)
    ledger = Ledger(Path(tempfile.mkdtemp(prefix="crosscloud-bench-queue-")) / "ledger.sqlite")
    queue, rng, n = Queue(fed, ledger, max_scan=args.max_scan), random.Random(args.seed), 0

    def submit(count: int) -> None:
        nonlocal n
        for _ in range(count):
            queue.submit(entry_for(fed, _spec(rng, fed), f"run-{n}", "byte-lm", 0, set(), time.time()))
            n += 1

    total = sum(p.count for c in fed.clouds for p in c.pools)
    while sum(r.devices for r in ledger.active()) < 0.9 * total:  # the federation fills first
        submit(200)
        queue.run_pass(force=True)
    submit(args.entries - len(ledger.queue.rows(("queued",))))
    print(f"pass: {len(ledger.queue.rows(('queued',)))} runs waiting, {sum(r.devices for r in ledger.active())} of "
          f"{total} devices held, {len(fed.clouds)} clouds, {len(fed.tenants)} tenants", flush=True)
    times = []
    for _ in range(args.passes):
        running = ledger.queue.rows(("running",))
        done = rng.choice(running)
        ledger.release(done.tenant, done.run_id)
        submit(args.arrivals)
        began = time.perf_counter()
        queue.run_pass()
        times.append(time.perf_counter() - began)
    return times


def submissions(args) -> dict:
    """bench-admission's clients, each submission an ``admit`` through the queue, on PostgreSQL."""
    import admission
    from pgserver import PostgresServer

    options = argparse.Namespace(clients=args.clients, admissions=args.submissions, hold=2, scale=8, seed=args.seed,
                                 timeout_s=900.0)
    with PostgresServer() as server:
        return admission.run_backend(server.create_database("ledger"), options)


def fair_share(args) -> tuple[float, dict[str, float]]:
    """(largest share error, each tenant's share of the device-hours) while both tenants are backlogged."""
    from simulation import Center, SimJob, Simulation

    rng = random.Random(args.seed)
    jobs = []
    for tenant, count in (("heavy", 2 * args.fair_jobs), ("light", args.fair_jobs)):
        for k in range(count):
            hours = 10 ** rng.uniform(0, 1)
            jobs.append(SimJob(f"{tenant}-{k}", "A", k * 1e-3, rng.choice([1, 2, 4]), {"v100": hours * 3600},
                               tenant=tenant))
    result = Simulation([Center("A", "v100", args.fair_devices, "X")], jobs, "crosscloud").run()
    # both are backlogged until the first job of either is dispatched as its tenant's last
    until = min(max(o.dispatch_s for o in result.outcomes if o.job.tenant == t) for t in ("heavy", "light"))
    held = {"heavy": 0.0, "light": 0.0}
    for o in result.outcomes:
        held[o.job.tenant] += o.job.devices * max(0.0, min(o.finish_s, until) - o.dispatch_s)
    shares = {t: h / sum(held.values()) for t, h in held.items()}
    return max(abs(s - 0.5) for s in shares.values()), shares


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--clouds", type=int, default=64)
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--passes", type=int, default=30)
    p.add_argument("--arrivals", type=int, default=5, help="runs submitted before each timed pass")
    p.add_argument("--max-scan", type=int, default=256, help="entries a pass decides afresh at most")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--submissions", type=int, default=2000)
    p.add_argument("--fair-devices", type=int, default=32)
    p.add_argument("--fair-jobs", type=int, default=400, help="jobs of the lighter tenant (the heavier: twice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parts", nargs="+", default=["pass", "submissions", "fair"], choices=["pass", "submissions", "fair"],
                   help="which parts to run (the last line names only their figures)")
    args = p.parse_args(argv)
    os.environ["CROSSCLOUD_STATE_DIR"] = tempfile.mkdtemp(prefix="crosscloud-bench-queue-state-")  # no sub-tasks
    figures, over = [], 0
    if "pass" in args.parts:
        ms = sorted(1000 * t for t in pass_times(args))
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        print(f"pass: {len(ms)} passes, median {statistics.median(ms):.0f} ms, p99 {p99:.0f} ms, max {ms[-1]:.0f} ms",
              flush=True)
        figures.append(f"pass_p99_ms={p99:.0f}")
    if "submissions" in args.parts:
        sub = submissions(args)
        over = sub["oversubscribed"]
        print(f"submissions: {sub['attempts']} from {args.clients} clients in {sub['wall_s']:.1f} s, "
              f"{sub['admitted']} started, p99 {sub['p99_admission_ms']:.0f} ms, oversubscribed {over}", flush=True)
        figures += [f"submissions_per_s={sub['admissions_per_s']:.1f}", f"oversubscribed={over}"]
    if "fair" in args.parts:
        error, shares = fair_share(args)
        print("fair share while both are backlogged: " + ", ".join(f"{t} {s:.3f}" for t, s in shares.items())
              + " of the device-hours (weights equal: 0.5 each)")
        figures.append(f"fair_share_error={error:.3f}")
    print(" ".join(figures))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
