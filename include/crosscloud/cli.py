"""The ``crosscloud`` command line: train a program, the queue, put a dataset, the global inventory, cloud membership, and what runs left behind."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import sys
import time
from dataclasses import fields
from pathlib import Path

from crosscloud.artifacts.catalog import load_catalog
from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec, JobSpecError, key_values
from crosscloud.ledger import Ledger
from crosscloud.pipeline.inputs import upload_dataset
from crosscloud.pipeline.stages import run_job
from crosscloud.pool import membership
from crosscloud.pool.inventory import CloudView, Inventory, PoolView, TenantView, collect
from crosscloud.scheduler.admission import NotAdmitted
from crosscloud.scheduler.service import Queue
from crosscloud.scheduler.view import format_explain, format_queue, status_dict
from crosscloud.pipeline.user_errors import USER_ERRORS
from crosscloud.store.open_store import open_store
from crosscloud.tracking.progress import Progress


def _summaries(store, tenant: str) -> list[dict]:
    found = []
    for key in store.list(f"{tenant}/runs"):
        if key.endswith("/summary.json"):
            found.append(json.loads(store.get(key)))
    return found


def latest_summary(tenant: str, run_id: str | None = None, federation: str | None = None) -> dict:
    """The summary of ``run_id``, or of the newest cross-cloud run of ``tenant``."""
    store = open_store(load_federation(federation).local_cloud, tenant)
    summaries = [s for s in _summaries(store, tenant) if (s["run_id"] == run_id if run_id else s["mode"] == "cross_cloud")]
    if not summaries:
        raise SystemExit(f"no finished run{' ' + run_id if run_id else ''} for tenant {tenant} in {store!r}")
    return max(summaries, key=lambda s: s["history"][-1]["published_at"])


def format_summary(s: dict) -> str:
    m = s["metrics"]
    lines = [
        f"run {s['run_id']} (tenant {s['tenant']}, {s['mode']}): {s['rounds']} rounds x {s['inner_steps']} inner steps",
        f"{'cloud':<12}{'share':>7}{'devices':>9}{'ms/step':>10}{'compute s':>11}{'comm s':>9}{'wait s':>9}",
    ]
    for name, c in s["clouds"].items():
        lines.append(
            f"{name:<12}{c['share']:>7}{c['devices']:>9}{1000 * c['mean_iteration_time_s']:>10.1f}"
            f"{c['compute_s']:>11.2f}{c['comm_s']:>9.2f}{c['wait_s']:>9.2f}"
        )
    lines.append(f"eval loss: {m['eval_loss_start']:.4f} at start -> {m['final_eval_loss']:.4f} at end")
    lines.append(f"iteration time (job, per inner step): {1000 * m['iteration_time_s']:.1f} ms")
    if s.get("baseline"):
        b = s["baseline"]
        lines.append(
            f"single-cluster baseline ({b['source']}, run {b['run_id']}): {1000 * b['iteration_time_s']:.1f} ms"
            f" -> iteration-time gap {m['iteration_time_gap_pct']:+.1f}%"
        )
    lines.append(f"cost {m['cost']:.4f}, energy {m['energy_kwh']:.5f} kWh over {m['train_wall_s']:.1f} s of training")
    if s.get("model"):
        lines.append(f"final model registered in MLflow: {s['model']['name']} version {s['model']['version']}")
    return "\n".join(lines)


def demo_line(s: dict) -> str:
    m = s["metrics"]
    gap = m["iteration_time_gap_pct"]
    return (
        f"clouds={len(s['clouds'])} rounds={s['rounds']} eval_loss_start={m['eval_loss_start']:.4f} "
        f"eval_loss_end={m['final_eval_loss']:.4f} iteration_time_gap_pct={'nan' if gap is None else f'{gap:.2f}'}"
    )


WHERE_TO_LOOK = """
where to look (same state folder):
  make airflow-ui   # airflow standalone on http://localhost:8080: DAG cross_cloud_training, task logs, trigger form
  make mlflow-ui    # mlflow ui on http://localhost:5000: experiment cross_cloud_training, parent and per-cloud runs
"""


def _warm(args) -> int:
    fed = load_federation(args.federation)
    cat = load_catalog(fed, args.tenant)
    rows = []
    for sha, m in sorted(cat.manifests.items(), key=lambda kv: (kv[1].kind, kv[0])):
        cells = {}
        for cloud in cat.stores:
            w = cat.warmth(sha, cloud, verify=args.verify)
            cells[cloud] = "warm" if w.warm else (f"{w.corrupt_chunks} corrupt" if w.corrupt_chunks else
                                                  f"{w.missing_bytes / 2**20:.1f} MiB missing")
        rows.append({"artifact": sha, "kind": m.kind, "size": m.size, "clouds": cells})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    clouds = list(cat.stores)
    print(f"{'artifact':<14}{'kind':<10}{'MiB':>8}" + "".join(f"{c:>18}" for c in clouds))
    for r in rows:
        print(f"{r['artifact'][:12]:<14}{r['kind']:<10}{r['size'] / 2**20:>8.2f}" + "".join(f"{r['clouds'][c]:>18}" for c in clouds))
    return 0


def _progress(args) -> int:
    progress = Progress(args.rounds)
    for line in sys.stdin:
        progress.feed(line)
    progress.close()
    return 0


def _cloud(args) -> int:
    fed = load_federation(args.federation)
    if args.action == "join":
        ok, detail = membership.join(fed, args.name)
        print(f"{args.name}: join check {'passed' if ok else 'FAILED'}: {detail}")
        return 0 if ok else 1
    getattr(membership, args.action)(fed, args.name)
    print(f"{args.name}: {'draining (no new sub-tasks)' if args.action == 'drain' else 'active'}")
    return 0


def _train(args) -> int:
    """Run a training program over the clouds in this process, through the engine's backends."""
    try:
        params = {**key_values(args.job, "--job"), "program": args.program, "program_args": key_values(args.arg)}
    except JobSpecError as exc:
        raise SystemExit(f"crosscloud train: {exc}") from None
    if args.clouds:
        params["clouds"] = [c for c in args.clouds.split(",") if c]
    spec = JobSpec.from_params(params)
    run_id = args.run_id or f"train-{time.strftime('%Y%m%dT%H%M%S')}"
    try:
        summary = run_job(spec, run_id, args.federation, args.experiment, compare_baseline=spec.mode == "cross_cloud",
                          wait=not args.no_wait)
    except NotAdmitted as waiting:  # --no-wait: one line, no traceback
        print(f"crosscloud train: run {run_id} not started (--no-wait): {waiting}", file=sys.stderr)
        return 3
    print(format_summary(summary))
    return 0


def _queue(args) -> int:
    """List, explain or cancel the queue's entries (a tenant sees only its own)."""
    fed = load_federation(args.federation)
    queue = Queue(fed, Ledger())
    if args.action == "cancel":
        tenant = _one_tenant(args)
        print(f"run {args.run_id}: {queue.cancel(tenant, args.run_id, reason=f'cancelled by {getpass.getuser()}')}")
        return 0
    if args.action == "explain":
        tenant = _one_tenant(args)
        try:
            status = queue.status(tenant, args.run_id)
        except KeyError as exc:
            raise SystemExit(f"crosscloud queue: {exc.args[0]}") from None
        print(format_explain(status, time.time()))
        return 0
    rows = [s for s in queue.listing() if not args.tenant or s.row.tenant in args.tenant]
    if args.json:
        print(json.dumps([status_dict(s, time.time()) for s in rows], indent=2))
    else:
        print(format_queue(rows, time.time()))
    return 0


def _one_tenant(args) -> str:
    if len(args.tenant) != 1:
        raise SystemExit(f"crosscloud queue {args.action}: name the run's tenant with one --tenant")
    if not args.run_id:
        raise SystemExit(f"crosscloud queue {args.action}: name the run with --run-id")
    return args.tenant[0]


def _dataset(args) -> int:
    fed = load_federation(args.federation)
    sent = upload_dataset(fed, args.tenant, args.name, Path(args.folder))
    gone = f"; {sent['removed']} file(s) of an earlier put removed" if sent["removed"] else ""
    print(f"dataset {args.name}: {sent['files']} files, {sent['bytes'] / 2**20:.1f} MiB in the store of {sent['cloud']}"
          f"{gone}")
    return 0


def _release(args) -> int:
    print(f"released {Ledger().release(args.tenant, args.run_id)} device(s) of run {args.run_id}")
    return 0


INVENTORY_WHO = """who sees what:
  without --airflow: the operator's local view. Whoever can read this host's federation file and reservation
    ledger (the ledger's credentials) sees every tenant; --tenant narrows what is printed, it guards nothing.
  with --airflow URL: asks the crosscloud page of that Airflow's api-server as a signed-in user (the token in
    AIRFLOW_API_TOKEN, or --user and a password for the auth manager's /auth/token), and shows only the
    tenants whose Airflow teams the user is in (an administrator: all), as the Airflow page does.
"""


def _airflow_token(base: str, args) -> str:
    """A JWT of the Airflow auth manager for ``--user``, else the one in AIRFLOW_API_TOKEN."""
    import httpx

    if not args.user:
        token = os.environ.get("AIRFLOW_API_TOKEN")
        if not token:
            raise SystemExit("crosscloud inventory --airflow: set AIRFLOW_API_TOKEN or give --user")
        return token
    password = args.password or os.environ.get("AIRFLOW_PASSWORD") or getpass.getpass(f"Airflow password of {args.user}: ")
    r = httpx.post(f"{base}/auth/token", json={"username": args.user, "password": password}, timeout=60)
    if r.status_code not in (200, 201):
        raise SystemExit(f"crosscloud inventory: {base}/auth/token refused {args.user}: {r.status_code} {r.text[:300]}")
    return r.json()["access_token"]


def _airflow_inventory(args) -> tuple[dict, Inventory]:
    """(what the plugin answered, as an Inventory): the signed-in user's view, their own tenants only."""
    import httpx

    base = args.airflow.rstrip("/")
    r = httpx.get(f"{base}/crosscloud/api/inventory", headers={"Authorization": f"Bearer {_airflow_token(base, args)}"},
                  timeout=120)
    if r.status_code != 200:
        raise SystemExit(f"crosscloud inventory: {base}/crosscloud/api/inventory answered {r.status_code}: {r.text[:300]}")
    got = r.json()
    keep = {f.name for f in fields(PoolView)}  # to_dict adds derived figures (free, in use); they are properties here
    clouds = [CloudView(**{**c, "pools": [PoolView(**{k: v for k, v in p.items() if k in keep}) for p in c["pools"]]})
              for c in got["clouds"]]
    return got, Inventory(got["federation"], got["generated_at"], clouds, [TenantView(**t) for t in got["tenants"]])


def _inventory(args) -> int:
    if args.airflow:
        out, inv = _airflow_inventory(args)
        if out["shown_to"]["note"]:
            print(out["shown_to"]["note"], file=sys.stderr)
    else:
        fed = load_federation(args.federation)
        unknown = sorted(set(args.tenant) - {t.name for t in fed.tenants})
        if unknown:
            raise SystemExit(f"crosscloud inventory: unknown tenant(s) {unknown}; the federation has {[t.name for t in fed.tenants]}")
        inv = collect(fed)
        out = inv.to_dict()
    if args.tenant:
        inv.tenants = [t for t in inv.tenants if t.name in args.tenant]
        out["tenants"] = [t for t in out["tenants"] if t["name"] in args.tenant]
    store = None if args.airflow else Ledger().figures
    figures = [f for t in inv.tenants for f in store.of_tenant(t.name)] if store else []
    out["programs"] = [dataclasses.asdict(f) for f in figures]
    print(json.dumps(out, indent=2) if args.json else inv.format() + _figures_text(figures))
    return 0


def _figures_text(figures: list) -> str:
    """The programs the shown tenants' runs measured: what placement sizes their next runs by."""
    if not figures:
        return ""
    lines = ["", "programs as their runs measured them (placement sizes their next runs by these):",
             f"  {'tenant':10} {'program':34} {'accelerator':14} {'parameters':>14} {'s/sample@1':>11} "
             f"{'peak GB':>8} {'batch':>5} {'runs':>4}"]
    lines += [f"  {f.tenant:10} {f.name[-34:]:34} {f.accelerator:14} {f.parameters:>14,} {f.seconds_per_sample:>11.5f} "
              f"{f.peak_memory_gb:>8.2f} {f.batch:>5} {f.runs:>4}" for f in figures]
    return "\n".join(lines)


def _summary(args) -> int:
    s = latest_summary(args.tenant, args.run_id, args.federation)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(format_summary(s))
    if args.demo:
        m = s["metrics"]
        drop = 1 - m["final_eval_loss"] / m["eval_loss_start"]
        ok = drop >= args.min_loss_drop and m["iteration_time_gap_pct"] is not None
        print(WHERE_TO_LOOK)
        print(f"demo {'ok' if ok else 'failed'} {demo_line(s)}")
        return 0 if ok else 1
    return 0


def _serve(args) -> int:
    from crosscloud.ledger.fleets import FleetBusy
    from crosscloud.serving.fleet import FleetError
    from crosscloud.serving.router import RouterError
    from crosscloud.serving.status import fleet_status, fleets, format_status

    chosen = [f for f in fleets(args.tenant or None) if args.model is None or f.name == args.model]
    if not chosen:
        print("no served model" + (f" {args.model}" if args.model else "") + " in the ledger "
              "(the inference_placement DAG starts one)", file=sys.stderr)
        return 1
    try:
        if args.action == "stop":
            for f in chosen:
                print(f"{f.tenant}/{f.name}: stopped {', '.join(f.stop()) or 'no replica'} and its router")
            return 0
        if args.action == "restore":
            for f in chosen:
                router = f.restore()
                print(f"{f.tenant}/{f.name}: router {router.url} with {', '.join(sorted(router.endpoints)) or 'no replica'}")
            return 0
    except (FleetError, FleetBusy, RouterError) as exc:  # another host's router, a change under way: what to do
        print(f"crosscloud serve {args.action}: {exc}", file=sys.stderr)
        return 2
    rows = [fleet_status(f) for f in chosen]
    print(json.dumps(rows, indent=2) if args.json else "\n\n".join(format_status(r) for r in rows))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crosscloud", description="crosscloud: training across sovereign clouds")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (default: its message)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="summary of a finished run (default: the tenant's newest cross-cloud run)")
    p.add_argument("--tenant", default="team-a")
    p.add_argument("--run-id")
    p.add_argument("--federation")
    p.add_argument("--json", action="store_true", help="print the whole summary as JSON")
    p.add_argument("--demo", action="store_true", help="end with the demo's machine-readable line and check it")
    p.add_argument("--min-loss-drop", type=float, default=0.3, help="with --demo: required relative eval-loss drop")
    p = sub.add_parser("train", help="train a program over the clouds, in this process (docs/programs.md)")
    p.add_argument("program", help="a file relative to the project folder, or package.module")
    p.add_argument("--arg", action="append", default=[], metavar="K=V", help="a program argument (run.args), JSON or text")
    p.add_argument("--job", action="append", default=[], metavar="K=V", help="a job parameter, e.g. rounds=5 dataset=D")
    p.add_argument("--clouds", help="comma-separated clouds (default: every cloud the tenant may use)")
    p.add_argument("--run-id")
    p.add_argument("--experiment", help="MLflow experiment to track the run in")
    p.add_argument("--federation")
    p.add_argument("--no-wait", action="store_true", help="fail at once (exit 3) if the queue does not start it now")
    p = sub.add_parser("queue", help="the federation's queue: position, expected start, cloud, reason, deadline; cancel")
    p.add_argument("action", nargs="?", default="list", choices=["list", "explain", "cancel"])
    p.add_argument("--run-id")
    p.add_argument("--tenant", action="append", default=[], metavar="T", help="only this tenant's entries (repeatable)")
    p.add_argument("--federation")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("dataset", help="put a folder's train/ and val/ files in a files dataset's home store")
    p.add_argument("action", choices=["put"])
    p.add_argument("name")
    p.add_argument("folder")
    p.add_argument("--tenant", default="team-a")
    p.add_argument("--federation")
    p = sub.add_parser("inventory", help="every cloud's pools, use and state; tenants' use against quota",
                       epilog=INVENTORY_WHO, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenant", action="append", default=[], metavar="T", help="show only this tenant's use and runs (repeatable)")
    p.add_argument("--airflow", metavar="URL", help="ask this Airflow api-server's crosscloud page: only your own tenants")
    p.add_argument("--user", help="with --airflow: sign in as this Airflow user (default: the token in AIRFLOW_API_TOKEN)")
    p.add_argument("--password", help="with --user (default: AIRFLOW_PASSWORD, else asked for); write --password=P if P starts with -")
    p.add_argument("--federation")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("warm", help="is each artifact really warm on each cloud: present and (with --verify) intact")
    p.add_argument("--tenant", default="team-a")
    p.add_argument("--federation")
    p.add_argument("--verify", action="store_true", help="read and hash every chunk, not only the index")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("cloud", help="join (check and admit), drain or activate a cloud at runtime")
    p.add_argument("action", choices=["join", "drain", "activate"])
    p.add_argument("name")
    p.add_argument("--federation")
    p = sub.add_parser("progress", help="read a run's log on stdin; show each cloud's rounds on one live line")
    p.add_argument("--rounds", type=int, default=JobSpec().rounds, help="rounds of the run (default: the DAG's default)")
    p = sub.add_parser("release", help="give back the devices a run holds (a run whose teardown never ran)")
    p.add_argument("--tenant", required=True)
    p.add_argument("--run-id", required=True)
    p = sub.add_parser("serve", help="served models: each cloud's share, replicas, tokens/s, cost per 1k tokens, "
                       "p50/p99 latency (status), stop them (stop), or start a router that died again with "
                       "the replicas still running and the shares in force (restore)")
    p.add_argument("action", choices=["status", "stop", "restore"])
    p.add_argument("--tenant", action="append", default=[], metavar="T", help="only this tenant's (repeatable)")
    p.add_argument("--model", help="only this served model (its registered name)")
    p.add_argument("--json", action="store_true")
    return parser


COMMANDS = {"summary": _summary, "train": _train, "queue": _queue, "dataset": _dataset, "inventory": _inventory, "warm": _warm,
            "cloud": _cloud, "progress": _progress, "release": _release, "serve": _serve}


def main(argv: list[str] | None = None) -> int:
    """Run one command; a user's error is its message and exit code 2 (``--debug``: the traceback too)."""
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"crosscloud {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
