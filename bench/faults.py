"""Fault benchmark: a fixed schedule of injected faults against real runs; each must be detected, survived and lose nothing.

Real cross-cloud training runs (the engine's stages, ``pipeline.stages.run_job``) on a
temporary federation of local clouds (a fresh state folder: stores, ledger and
sub-tasks of their own), small model, few rounds. First a fault-free run of the
seed, then one run per fault, each injected for real once ``--at-round`` rounds
are committed:

- ``kill``: the ``--cloud``'s worker process is killed (SIGKILL); it is started again and
  resumes from its cloud's own state (or, with ``subtask_retries`` 0, is lost);
- ``outage``: shanghai's store (an S3 server behind a gate) refuses every
  connection for ``--outage-s`` seconds; transfers retry with backoff;
- ``corrupt``: one bit of the cloud's committed delta flipped on disk;
- ``poison``: the cloud commits a well-formed delta 1000x the norm of its last
  one, with a commit that vouches for it (a cloud lying about its work);
- ``drain``: the cloud set to draining in the ledger;
- ``coordinator``: the coordinator, in its own process as the
  ``sync_checkpoints`` task, killed (SIGKILL) and started again.

A flipped bit is damage at rest after the commit: beijing's worker is paused
(SIGSTOP) until the cloud's delta of the round the coordinator waits for is
committed and damaged, then resumed. A poisoned delta is committed in the
cloud's name while its worker is paused mid-round.

Per fault: ``detected`` (the run's record names the fault), ``recovered`` (the
run completed all its rounds), ``rounds_lost`` (rounds of work that never
reached the global model: rounds in which a cloud was lost or a contribution
refused, plus global rounds missing from or repeated in the committed
history) and the final eval loss against the fault-free run.
``committed_bytes_lost``: bytes of committed objects (global checkpoints, deltas,
the final model) in any store that are missing or fail their sha256 at the end,
the objects the benchmark damaged itself excepted (``Bench.committed_bytes_lost``).

Last line: ``faults_injected=<n> runs_completed=<n> rounds_lost=<n> committed_bytes_lost=<n>``; the exit
status is 0 only when every fault was detected and recovered from with at most one round lost, and no
committed byte was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

FAULTS = ("kill", "outage", "corrupt", "poison", "drain", "coordinator")
COORDINATOR = "import sys; from crosscloud.pipeline.stages import RunRef, run_handles, sync_stage; " \
              "ref = RunRef(*sys.argv[1:4]); sync_stage(ref, run_handles(ref), log=print)"
Detect = Callable[[list[dict]], bool]
Outcome = tuple[dict | None, Detect, int]  # the summary (None: the run failed), detection, committed bytes lost


class Bench:
    """The runs of one schedule on the federation at ``fed_path``; ``cloud`` is the one the faults hit."""

    def __init__(self, spec, fed_path: str, cloud: str, at_round: int):
        from crosscloud.core.federation import load_federation

        self.spec, self.fed_path, self.cloud, self.at_round = spec, fed_path, cloud, at_round
        self.fed = load_federation(fed_path)
        self.damaged: set[tuple[str, str]] = set()  # (cloud, key) of the objects the benchmark damaged itself
        self.lines: list[str] = []  # the coordinator's log of the runs

    def store(self, cloud: str):
        from crosscloud.store.open_store import open_store

        return open_store(self.fed.cloud(cloud), self.spec.tenant)

    def history(self, run_id: str) -> list[dict]:
        from crosscloud.core.keys import RunKeys

        key, home = RunKeys(self.spec.tenant, run_id).history, self.store(self.fed.local_cloud.name)
        return json.loads(home.get(key)) if home.exists(key) else []

    def at(self, run_id: str, action: Callable[[], None], done: threading.Event) -> threading.Thread:
        """Run ``action`` once ``at_round`` rounds of the run are committed (never, if the run ends first)."""
        def watch():
            while not done.is_set() and len(self.history(run_id)) < self.at_round:
                time.sleep(0.05)
            if not done.is_set():
                action()

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread

    def run(self, run_id: str, action: Callable[[], None] | None = None) -> dict | None:
        """A run of the engine's stages with ``action`` injected; its summary, or None when it failed."""
        from crosscloud.pipeline.stages import run_job

        done = threading.Event()
        self.lines = []  # this run's log only
        watcher = self.at(run_id, action, done) if action else None
        try:
            return run_job(self.spec, run_id, self.fed_path, log=self.lines.append, compare_baseline=False)
        except Exception as exc:  # reported as not recovered; the schedule goes on
            print(f"  run {run_id} failed: {exc!r}", flush=True)
            return None
        finally:
            done.set()
            if watcher:
                watcher.join()

    def worker_pids(self, run_id: str, cloud: str) -> list[int]:
        """The worker processes of a cloud's sub-task, under the wrapper shell the local backend starts."""
        import psutil

        from crosscloud.backends import get_backend

        handle = get_backend("local").find(self.spec.tenant, run_id, cloud)
        return [p.pid for p in psutil.Process(handle["pid"]).children(recursive=True)]

    def damage_next_delta(self, run_id: str, damage: Callable) -> None:
        """``damage(store, commit, plan)`` the cloud's next delta before the coordinator reads it.

        beijing's worker is paused first: the coordinator cannot read a round
        beijing has not committed, so the cloud's delta of that round is damaged
        as soon as it is committed, and beijing resumed.
        """
        from crosscloud.run.plan import Plan
        from crosscloud.store.commit import read_commit

        store, beijing = self.store(self.cloud), self.store("beijing")
        plan = Plan.load(store, self.spec.tenant, run_id)
        holder = self.worker_pids(run_id, "beijing")
        for pid in holder:
            os.kill(pid, signal.SIGSTOP)
        try:
            r = next((r for r in range(self.spec.rounds) if read_commit(beijing, plan.keys.cloud_step("beijing", r)) is None), None)
            if r is None:
                print(f"  {run_id}: beijing had committed every round; nothing left to damage (raise --rounds)", flush=True)
                return
            while (commit := read_commit(store, plan.keys.cloud_step(self.cloud, r))) is None:
                time.sleep(0.02)
            damage(store, commit, plan)
        finally:
            for pid in holder:
                os.kill(pid, signal.SIGCONT)

    def flip_bit(self, store, commit: dict, plan) -> None:
        entry = next(iter(commit["objects"].values()))
        data = bytearray(store.get(entry["key"]))
        data[len(data) // 2] ^= 0x10
        store.put(entry["key"], bytes(data))
        self.damaged.add((self.cloud, entry["key"]))

    def commit_poisoned_delta(self, run_id: str) -> None:
        """The cloud lies about its work: its next round committed by it as 1000x its last delta, well-formed and
        sha256-consistent. Its worker is paused mid-round while the lie is committed in its name; resumed, it
        finds the round committed and, as a committed step is never written again, goes on without writing it."""
        from crosscloud.run.plan import Plan
        from crosscloud.store.commit import read_commit, write_step
        from crosscloud.store.tensors import to_bytes
        from crosscloud.training.compression import encode
        from crosscloud.training.coordinator import load_global
        from crosscloud.training.screening import read_delta

        store = self.store(self.cloud)
        plan = Plan.load(store, self.spec.tenant, run_id)
        holder = self.worker_pids(run_id, self.cloud)
        for pid in holder:
            os.kill(pid, signal.SIGSTOP)
        try:  # the first round it has not committed, read once it is stopped, so that it cannot change
            r = next(r for r in range(self.spec.rounds) if read_commit(store, plan.keys.cloud_step(self.cloud, r)) is None)
            last = read_commit(store, plan.keys.cloud_step(self.cloud, r - 1))
            delta = {n: 1000.0 * t for n, t in read_delta(store, self.cloud, last, load_global(store, plan, 0)[0]).items()}
            name = next(iter(last["objects"]))
            data = to_bytes(encode(delta) if name.endswith(".int8.safetensors") else delta)
            write_step(store, plan.keys.cloud_step(self.cloud, r), {name: data}, meta={**last["meta"], "round": r})
        finally:
            for pid in holder:
                os.kill(pid, signal.SIGCONT)

    def outcome(self, run_id: str, summary: dict | None, detect: Detect) -> Outcome:
        return summary, detect, self.committed_bytes_lost(run_id)

    def committed_bytes_lost(self, run_id: str) -> int:
        """Bytes of the run's committed objects that are missing or fail their sha256, in every store.

        Every commit found is verified object by object; every global round the
        history recorded must still be committed in the coordinator's store and
        in the store of every cloud that was not lost (a missing one counts its
        params' size).
        """
        from crosscloud.core.keys import RunKeys
        from crosscloud.store.base import StoreError
        from crosscloud.store.commit import read_commit, read_object

        keys, lost = RunKeys(self.spec.tenant, run_id), 0
        history = self.history(run_id)
        home = read_commit(self.store(self.fed.local_cloud.name), keys.global_step(len(history)))
        params_size = home["objects"]["params.safetensors"]["size"] if home else 0
        gone = {c for r in history for c in r.get("lost", {})}
        for cloud in self.fed.clouds:
            store = self.store(cloud.name)
            commits = [k.removesuffix("/COMMIT.json") for k in store.list(keys.root) if k.endswith("/COMMIT.json")]
            for step in commits:
                commit = read_commit(store, step)
                for name, entry in commit["objects"].items():
                    if (cloud.name, entry.get("key")) in self.damaged:
                        continue
                    try:
                        read_object(store, commit, name)
                    except StoreError:
                        lost += entry["size"]
            if cloud.name not in gone or cloud.name == self.fed.local_cloud.name:
                lost += params_size * sum(1 for r in range(len(history) + 1) if keys.global_step(r) not in commits)
        return lost


def rounds_lost(history: list[dict], rounds: int) -> int:
    """Rounds of work that never reached the global model, from the committed history: a cloud lost or refused
    in them, or the round missing or repeated."""
    seen = [r["round"] for r in history]
    hit = sum(1 for r in history if r.get("lost") or r.get("refused"))
    return hit + len(set(range(rounds)) - set(seen)) + (len(seen) - len(set(seen)))


def kill(bench: Bench, run_id: str, args) -> Outcome:
    def inject():
        for pid in bench.worker_pids(run_id, bench.cloud):
            os.kill(pid, signal.SIGKILL)

    def detected(history: list[dict]) -> bool:  # started again (it resumes), or lost once its restarts are spent
        restarted = any(f"cloud {bench.cloud}: sub-task failed" in line and "starting it again" in line for line in bench.lines)
        return restarted or any(bench.cloud in r.get("lost", {}) for r in history)

    return bench.outcome(run_id, bench.run(run_id, inject), detected)


def corrupt(bench: Bench, run_id: str, args) -> Outcome:
    summary = bench.run(run_id, lambda: bench.damage_next_delta(run_id, bench.flip_bit))
    return bench.outcome(run_id, summary, lambda h: any("does not match its commit" in r.get("refused", {}).get(bench.cloud, "") for r in h))


def poison(bench: Bench, run_id: str, args) -> Outcome:
    summary = bench.run(run_id, lambda: bench.commit_poisoned_delta(run_id))
    return bench.outcome(run_id, summary, lambda h: any("norm" in r.get("refused", {}).get(bench.cloud, "") for r in h))


def drain(bench: Bench, run_id: str, args) -> Outcome:
    from crosscloud.pool.membership import activate
    from crosscloud.pool.membership import drain as set_draining

    try:
        summary = bench.run(run_id, lambda: set_draining(bench.fed, bench.cloud))
    finally:
        activate(bench.fed, bench.cloud)
    return bench.outcome(run_id, summary, lambda h: any(r["next_shares"].get(bench.cloud) == 0 for r in h))


def coordinator(bench: Bench, run_id: str, args) -> Outcome:
    """The coordinator in its own process, killed mid-run and started again, as Airflow retries the task."""
    from crosscloud.pipeline.stages import (
        admit_stage,
        aggregate_stage,
        dispatch_stage,
        preheat_stage,
        release_stage,
        sync_stage,
    )

    ref = admit_stage(bench.spec, run_id, bench.fed_path)
    resumed, first = [], None
    try:
        preheat_stage(ref)
        _, plan = ref.load()
        handles = [dispatch_stage(ref, c.name) for c in plan.clouds]
        first = subprocess.Popen([sys.executable, "-c", COORDINATOR, ref.federation_path, ref.tenant, ref.run_id],
                                 stdout=subprocess.DEVNULL)
        done = threading.Event()
        watcher = bench.at(run_id, lambda: os.kill(first.pid, signal.SIGKILL), done)
        first.wait()
        done.set()
        watcher.join()
        sync_stage(ref, handles, log=lambda m: resumed.append(m) if m.startswith("resuming") else None)
        summary = aggregate_stage(ref, handles, compare_baseline=False)
    except Exception as exc:
        print(f"  run {run_id} failed: {exc!r}", flush=True)
        summary = None
    finally:
        release_stage(ref)
    return bench.outcome(run_id, summary, lambda h: bool(resumed) and first is not None and first.returncode == -signal.SIGKILL)


def outage(bench: Bench, run_id: str, args) -> Outcome:
    """shanghai's store on an S3 server behind a gate (the tests' servers), cut off for ``--outage-s``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3servers import S3Server

    server = S3Server("shanghai-gated", Path(os.environ["CROSSCLOUD_STATE_DIR"]), restartable=True)
    server.start()
    try:
        server.make_bucket("crosscloud")
        raw = yaml.safe_load(Path(bench.fed_path).read_text())
        for cloud in raw["clouds"]:
            if cloud["name"] == "shanghai":
                cloud["store"] = {"url": "s3://crosscloud/shanghai", "endpoint_url": server.endpoint, "addressing_style": "path",
                                  "retry_deadline_s": args.outage_s + 120, "retry_backoff_max_s": 2.0}
        fed_path = Path(os.environ["CROSSCLOUD_STATE_DIR"]) / "federation-s3.yaml"
        fed_path.write_text(yaml.safe_dump(raw))
        os.environ.update({"CROSSCLOUD_SHANGHAI_ACCESS_KEY_ID": "testing", "CROSSCLOUD_SHANGHAI_SECRET_ACCESS_KEY": "testing"})
        on_s3 = Bench(bench.spec, str(fed_path), "shanghai", bench.at_round)
        summary = on_s3.run(run_id, lambda: server.outage(args.outage_s))
        return on_s3.outcome(run_id, summary, lambda h: server.refused > 0)  # read while the server holds the objects
    finally:
        server.stop()


INJECT = {"kill": kill, "outage": outage, "corrupt": corrupt, "poison": poison, "drain": drain, "coordinator": coordinator}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {','.join(FAULTS)}")
    ap.add_argument("--cloud", default="singapore", help="the collaboration cloud the faults hit (the outage: shanghai's store)")
    ap.add_argument("--at-round", type=int, default=2, help="inject once this many rounds are committed")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--model-size", default="tiny")
    ap.add_argument("--global-batch", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outage-s", type=float, default=5.0, help="how long the store refuses connections (the issue's: 30)")
    ap.add_argument("--state-dir", default=None, help="the federation's state folder, kept afterwards (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    if set(faults) - set(FAULTS):
        ap.error(f"--faults: unknown {sorted(set(faults) - set(FAULTS))}; choose from {list(FAULTS)}")
    if args.cloud not in ("shanghai", "singapore"):
        ap.error("--cloud: a collaboration cloud, shanghai or singapore (beijing coordinates and holds the coordinator back)")
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="crosscloud-bench-faults-"))
    os.environ["CROSSCLOUD_STATE_DIR"] = str(state)  # stores, ledger and sub-tasks of this benchmark only
    os.environ.pop("CROSSCLOUD_LEDGER", None)
    try:
        return schedule(args, faults, state)
    finally:
        if not args.state_dir:  # a folder it made itself; one given is kept for inspection
            shutil.rmtree(state, ignore_errors=True)


def schedule(args, faults: list[str], state: Path) -> int:
    """The fault-free run, then one run per fault; prints the table and the last line."""
    from crosscloud.core.federation import DEFAULT_FEDERATION
    from crosscloud.core.job import JobSpec

    spec = JobSpec(rounds=args.rounds, inner_steps=args.inner_steps, model_size=args.model_size,
                   global_batch=args.global_batch, seed=args.seed)
    bench = Bench(spec, str(DEFAULT_FEDERATION), args.cloud, args.at_round)
    print(f"state {state}: {spec.rounds} rounds x {spec.inner_steps} steps, model {spec.model_size}, seed {spec.seed}; "
          f"each fault injected after round {args.at_round - 1}", flush=True)
    clean = bench.run("faults-clean")
    bytes_lost = bench.committed_bytes_lost("faults-clean")
    if clean is None:
        print(f"faults_injected=0 runs_completed=0 rounds_lost=0 committed_bytes_lost={bytes_lost}")
        return 1
    clean_loss = clean["metrics"]["final_eval_loss"]
    print(f"fault-free run: final eval loss {clean_loss:.4f}", flush=True)
    print(f"{'fault':<12}{'detected':>9}{'recovered':>10}{'rounds_lost':>12}{'final_loss':>11}{'vs_clean':>10}", flush=True)
    completed = lost_rounds = failed = 0
    for fault in faults:
        run_id = f"faults-{fault}"
        summary, detect, lost_bytes = INJECT[fault](bench, run_id, args)
        history = bench.history(run_id)  # the coordinator's store is a folder in every variant of the federation
        recovered = summary is not None and len(history) == spec.rounds
        lost = rounds_lost(history, spec.rounds)
        completed, lost_rounds, bytes_lost = completed + recovered, lost_rounds + lost, bytes_lost + lost_bytes
        loss = summary["metrics"]["final_eval_loss"] if summary else float("nan")
        detected = detect(history)
        failed += not (detected and recovered and lost <= 1)  # the bar: at most one round lost per fault
        print(f"{fault:<12}{str(detected):>9}{str(recovered):>10}{lost:>12}{loss:>11.4f}"
              f"{(loss / clean_loss - 1) * 100:>+9.1f}%", flush=True)
    print(f"faults_injected={len(faults)} runs_completed={completed} rounds_lost={lost_rounds} committed_bytes_lost={bytes_lost}")
    return 0 if not failed and bytes_lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
