"""Admission benchmark: many clients admitting at once against one ledger, PostgreSQL and then SQLite.

Each backend gets a fresh ledger: a throwaway PostgreSQL server on 127.0.0.1
(started as the tests start theirs, ``tests/pgserver.py``; the server's
default, durable settings), then a SQLite file. ``--clients`` processes
(spawned, default 16) share ``--admissions`` admissions (default 2000). Each
loops: one admission through the real ``crosscloud.scheduler.admission.admit``
(the inventory read, the placement, the ledger's transaction) of a run for a
random tenant, placement and device count over a small federation (the
embedded one, its pools and quotas times ``--scale``), timed from the call to
its return, admitted or ``NotAdmitted``; then, when it holds more than
``--hold`` runs or was not admitted, it releases its oldest. So the pools
fill, admissions wait, and runs end.

Afterwards the ledger's own rows are replayed (every reservation's
``created_at`` and ``released_at``, releases first at equal times): at no
instant may a pool hold more devices than it has, nor a tenant more than its
quota on a cloud; ``oversubscribed`` counts the instants that did.

A line per backend, ``<backend> admissions_per_s=... p99_admission_ms=...
oversubscribed=...`` and more, SQLite's before PostgreSQL's; the last line
``admissions_per_s=<pg> p99_admission_ms=<pg> oversubscribed=<pg>`` (goals:
at least 100, at most 100 ms, 0). Exit status 1 when either backend
oversubscribed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' federations and PostgreSQL server

import sqlalchemy as sa  # noqa: E402
from federations import embedded  # noqa: E402
from pgserver import PostgresServer  # noqa: E402

from crosscloud.core.federation import Federation  # noqa: E402
from crosscloud.core.job import JobSpec  # noqa: E402
from crosscloud.ledger import Ledger, ledger_url  # noqa: E402
from crosscloud.scheduler.admission import NotAdmitted, admit  # noqa: E402


def federation(scale: int) -> Federation:
    """The embedded federation with ``scale`` times its devices and quotas: 8 x scale devices over three clouds."""
    def bigger(raw: dict) -> None:
        for cloud in raw["clouds"]:
            for pool in cloud["pools"]:
                pool["count"] *= scale
        for tenant in raw["tenants"]:
            tenant["quotas"] = {c: q * scale for c, q in tenant["quotas"].items()}

    return embedded(bigger)


def job(rng: random.Random, fed: Federation) -> JobSpec:
    """A run of a random tenant: mostly ``auto`` over 1-4 devices, sometimes ``spread`` over every cloud."""
    tenant = rng.choice([t.name for t in fed.tenants])
    if rng.random() < 0.75:
        return JobSpec(tenant=tenant, placement="auto", devices=rng.randint(1, 4))
    return JobSpec(tenant=tenant, clouds=sorted(fed.tenant(tenant).quotas), devices_per_cloud=rng.randint(1, 2))


def client(where: str, index: int, count: int, args: dict, start, results) -> None:
    """One client: ``count`` admissions, releasing its oldest run past ``hold``; reports its latencies (s)."""
    try:
        results.put(admissions(where, index, count, args, start))
    except BaseException:
        results.put(traceback.format_exc())
        raise


def admissions(where: str, index: int, count: int, args: dict, start) -> tuple[list[float], int]:
    fed, ledger, rng = federation(args["scale"]), Ledger(where), random.Random(args["seed"] * 1000 + index)
    held: deque[tuple[str, str]] = deque()
    latencies, admitted = [], 0
    start.wait()  # every client has opened the ledger: the clock starts
    for k in range(count):
        spec, run_id = job(rng, fed), f"client-{index}-{k}"
        began = time.perf_counter()
        try:
            admit(fed, spec, run_id, "byte-lm", 0, {"beijing"}, ledger)
            held.append((spec.tenant, run_id))
            admitted += 1
            ends = max(len(held) - args["hold"], 0)
        except NotAdmitted:  # the client gives up on it: it leaves the queue
            ledger.queue.end(spec.tenant, run_id, "cancelled", "the client gave up", time.time())
            ends = 1  # while it waits, its oldest run ends: no client holds devices for ever
        latencies.append(time.perf_counter() - began)
        for _ in range(min(ends, len(held))):
            ledger.release(*held.popleft())
    while held:
        ledger.release(*held.popleft())
    return latencies, admitted


def oversubscribed(where: str, fed: Federation) -> int:
    """Instants at which the ledger's rows held more than a pool's devices or a tenant's quota on a cloud."""
    capacity = fed.capacity()
    quota = {(t.name, cloud): q for t in fed.tenants for cloud, q in t.quotas.items()}
    engine = sa.create_engine(ledger_url(where))
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT tenant, cloud, accelerator, devices, created_at, released_at FROM reservations").all()
    engine.dispose()
    changes = []  # (time, order, tenant, cloud, accelerator, delta): at equal times releases (order 0) go first
    for tenant, cloud, accelerator, devices, created, released in rows:
        changes.append((created, 1, tenant, cloud, accelerator, devices))
        if released is not None:
            changes.append((released, 0, tenant, cloud, accelerator, -devices))
    pools: dict[tuple[str, str], int] = {}
    tenants: dict[tuple[str, str], int] = {}
    over = 0
    for _at, _order, tenant, cloud, accelerator, delta in sorted(changes):
        pool, share = (cloud, accelerator), (tenant, cloud)
        pools[pool], tenants[share] = pools.get(pool, 0) + delta, tenants.get(share, 0) + delta
        if pools[pool] > capacity[pool] or tenants[share] > quota.get(share, 0):
            over += 1
    return over


def run_backend(where: str, args: argparse.Namespace) -> dict:
    """All clients against the ledger at ``where``, started together once each has opened it."""
    Ledger(where)  # migrated once here, not by sixteen clients at once
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Barrier(args.clients + 1), spawn.Queue()
    shares = [args.admissions // args.clients + (i < args.admissions % args.clients) for i in range(args.clients)]
    options = {"scale": args.scale, "hold": args.hold, "seed": args.seed}
    procs = [spawn.Process(target=client, args=(where, i, n, options, start, results)) for i, n in enumerate(shares)]
    for p in procs:
        p.start()
    start.wait(timeout=args.timeout_s)
    began = time.perf_counter()
    reports = [results.get(timeout=args.timeout_s) for _ in procs]
    wall = time.perf_counter() - began
    for p in procs:
        p.join(30)
    failed = [r for r in reports if isinstance(r, str)]
    if failed:
        raise SystemExit(f"a client failed:\n{failed[0]}")
    latencies = sorted(x for lat, _ in reports for x in lat)
    return {"admissions_per_s": len(latencies) / wall, "p99_admission_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
            "oversubscribed": oversubscribed(where, federation(args.scale)),
            "p50_admission_ms": 1000 * statistics.median(latencies), "admitted": sum(a for _, a in reports),
            "attempts": len(latencies), "wall_s": wall}


def line(result: dict) -> str:
    return (f"admissions_per_s={result['admissions_per_s']:.1f} p99_admission_ms={result['p99_admission_ms']:.1f} "
            f"oversubscribed={result['oversubscribed']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16, help="client processes admitting at once")
    p.add_argument("--admissions", type=int, default=2000, help="admissions in all, shared by the clients")
    p.add_argument("--hold", type=int, default=2, help="runs a client holds before it releases its oldest")
    p.add_argument("--scale", type=int, default=8, help="the embedded federation's devices and quotas times this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=900.0)
    args = p.parse_args(argv)
    os.environ["CROSSCLOUD_STATE_DIR"] = tempfile.mkdtemp(prefix="crosscloud-bench-admission-")  # no sub-tasks
    with PostgresServer() as server:
        pg = run_backend(server.create_database("ledger"), args)
    lite = run_backend(str(Path(os.environ["CROSSCLOUD_STATE_DIR"]) / "ledger.sqlite"), args)
    for name, result in (("sqlite", lite), ("postgresql", pg)):
        print(f"{name} {line(result)} p50_admission_ms={result['p50_admission_ms']:.1f} admitted={result['admitted']} "
              f"of {result['attempts']} wall_s={result['wall_s']:.1f}")
    print(line(pg))
    return 1 if pg["oversubscribed"] or lite["oversubscribed"] else 0


if __name__ == "__main__":
    sys.exit(main())
