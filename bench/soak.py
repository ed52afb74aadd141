"""Soak benchmark: the whole deployment under random faults for a bounded time, then a checker over the history.

The deployment is the multi-host one of ``tests/multihost`` on this machine:
Airflow with the CeleryExecutor (Redis, the scheduler, the triggerer, the
dag-processor, the api-server and two workers standing for two hosts) on a
PostgreSQL database; the ledger on a PostgreSQL server of its own; three clouds
reached over ssh (a real sshd), each with its store on an S3-compatible server
on 127.0.0.1 behind a gate that can refuse, drop or throttle connections.

A fault-free run of the job first gives the loss a run must come close to.
Then, for ``--minutes``, runs of ``cross_cloud_training`` are kept in flight
(some with a deadline, some deferrable), and faults are injected from a
schedule drawn from ``--seed``: exponential gaps at ``--fault-rate`` a minute,
each fault in its own thread, so they overlap. After the soak the runs are
waited for, the leases let lapse, and ``soak_record.Recorder`` adds what the
stores, the ledger and the processes show. ``crosscloud.soak.checker`` judges
the history (``--out``/history.jsonl, kept) and the last line holds its figures.

The same seed draws the same schedule of faults (kind, target, moment,
length); the moments the runs reach depend on this machine, so a violation a
seed finds is reproduced by running that seed again, not replayed exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the real servers the multi-host tests start
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402

from crosscloud.soak.checker import check, goodput, history_end  # noqa: E402
from crosscloud.soak.history import (  # noqa: E402
    BaselineLoss,
    CloudCapacity,
    FaultInjected,
    History,
    HistoryEnded,
    RunEnded,
    RunSubmitted,
)

DAG_ID = "cross_cloud_training"
TENANT = "team-a"
JOB = "diloco-tiny"


@dataclass
class Deployment:
    """Every server of the soak, started in ``root``; ``stop`` ends them all."""

    root: Path
    data: Path
    lease_s: float
    grace_s: float
    servers: list = field(default_factory=list)

    def start(self) -> None:
        from celerydeployment import CeleryDeployment

        from crosscloud.core.federation import load_federation
        from federations import multi_host_file
        from pgserver import PostgresServer
        from redisserver import RedisServer
        from s3servers import S3Server
        from sshserver import SSHServer

        os.environ["CROSSCLOUD_DATA_DIR"] = str(self.data)  # what the clouds' sub-tasks read too
        self.airflow_pg, self.ledger_pg = PostgresServer().start(), PostgresServer().start()
        self.redis = RedisServer(self.root / "redis")
        self.redis.start()
        self.stores = {n: S3Server(n, self.root, restartable=True) for n in ("beijing", "shanghai", "singapore")}
        self.servers = [self.airflow_pg, self.ledger_pg, self.redis, *self.stores.values()]
        for server in self.stores.values():
            server.start()
            server.make_bucket("crosscloud")
        self.sshd = SSHServer(self.root / "sshd")
        self.sshd.start()
        self.servers.append(self.sshd)
        self.fed_path, conns = multi_host_file(self.root / "federation.yaml", self.root / "hosts", self.stores, self.sshd)
        self.ledger_url = self.ledger_pg.create_database("ledger")
        env = {"CROSSCLOUD_LEDGER_URL": self.ledger_url, "MLFLOW_TRACKING_URI": self.airflow_pg.create_database("mlflow"),
               "CROSSCLOUD_MLFLOW_ARTIFACTS": (self.root / "mlartifacts").as_uri(),
               "CROSSCLOUD_FEDERATION": str(self.fed_path), "CROSSCLOUD_QUEUE_POLL_S": "2",
               "CROSSCLOUD_LEASE_S": str(self.lease_s), "CROSSCLOUD_LEASE_GRACE_S": str(self.grace_s), **conns}
        os.environ.update(conns)
        for cloud in self.stores:  # the recorder reads the stores as an operator's shell would, without Airflow
            prefix = f"CROSSCLOUD_{cloud.upper()}_{TENANT.upper().replace('-', '_')}"
            os.environ.update({f"{prefix}_ACCESS_KEY_ID": f"key-{cloud}", f"{prefix}_SECRET_ACCESS_KEY": f"secret-{cloud}"})
        self.fed = load_federation(self.fed_path)
        self.cluster = CeleryDeployment(self.root / "airflow", self.airflow_pg.create_database("airflow"),
                                        self.redis.url, env)
        self.servers.insert(0, self.cluster)
        self.cluster.start()
        for host in ("host-a", "host-b"):
            self.cluster.start_worker(host)

    def stop(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001 - the others still stop
                print(f"stopping {type(server).__name__}: {exc!r}", file=sys.stderr)

    def operator(self, *args: str) -> subprocess.CompletedProcess:
        """The command line on an operator's host (its own state folder), with the Connections."""
        return subprocess.run([sys.executable, "-m", "crosscloud_airflow.cli", *args],
                              env=self.cluster.host_env("operator"), capture_output=True, text=True, timeout=120)


def _signal_all(procs, sig: int) -> None:
    """``sig`` to each (pid, start time) still the same process: a pid reused since the sample is left alone."""
    for pid, created in procs:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.send_signal(sig)
        except psutil.Error:
            pass


class Faults:
    """The kinds of fault, each a function of a seeded draw; returns what it hit, or "" when it found nothing to hit."""

    def __init__(self, dep: Deployment, history: History):
        self.dep, self.history = dep, history
        self.kinds: dict[str, Callable[[random.Random], str]] = {
            "subtask_kill": self.subtask_kill, "subtask_freeze": self.subtask_freeze,
            "store_outage": self.store_outage, "store_slowdown": self.store_slowdown,
            "worker_kill": self.worker_kill, "scheduler_restart": lambda rng: self.restart("scheduler"),
            "triggerer_restart": lambda rng: self.restart("triggerer"), "ledger_restart": self.ledger_restart,
            "drain": self.drain,
        }
        self._busy: set[str] = set()  # one fault at a time on one target (a store down twice at once is one outage)
        self._lock = threading.Lock()

    def inject(self, kind: str, at: float, seed: int) -> threading.Thread:
        """``kind`` injected in its own thread at ``at`` (epoch s), its draws from ``seed``; recorded once over."""

        def run() -> None:
            time.sleep(max(0.0, at - time.time()))
            start = time.time()
            try:
                target = self.kinds[kind](random.Random(seed))
            except Exception as exc:  # noqa: BLE001 - an injection that failed is reported, the soak goes on
                print(f"  fault {kind}: the injection failed: {exc!r}", flush=True)
                return
            if target:  # "": nothing to hit then (no sub-task running, the target already under a fault)
                self.history.append(FaultInjected(time.time(), kind, target, start, time.time()))
                print(f"  fault {kind} on {target} ({time.time() - start:.0f} s)", flush=True)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def _hold(self, target: str) -> bool:
        with self._lock:
            if target in self._busy:
                return False
            self._busy.add(target)
            return True

    def _release(self, target: str) -> None:
        with self._lock:
            self._busy.discard(target)

    def _one_subtask(self, rng: random.Random) -> tuple[str, set] | None:
        """A live training sub-task (run@cloud) and its processes, drawn by ``rng``; None when none runs."""
        from soak_record import find_subtasks, subtask_roots

        live = {k: v for k, v in find_subtasks(subtask_roots(self.dep.fed), TENANT).items() if not v.serving}
        if not live:
            return None
        run, cloud = rng.choice(sorted(live))
        return f"{run}@{cloud}", live[(run, cloud)].procs

    def subtask_kill(self, rng: random.Random) -> str:
        """A cloud's sub-task SIGKILLed: the watcher starts it again and it resumes from its cloud's state."""
        found = self._one_subtask(rng)
        if found is None:
            return ""
        _signal_all(found[1], signal.SIGKILL)
        return found[0]

    def subtask_freeze(self, rng: random.Random) -> str:
        """A cloud's sub-task stopped (SIGSTOP) past the run's lease and grace, then continued."""
        found = self._one_subtask(rng)
        if found is None or not self._hold(found[0]):
            return ""
        try:
            _signal_all(found[1], signal.SIGSTOP)
            time.sleep(self.dep.lease_s + self.dep.grace_s + 5)
        finally:
            _signal_all(found[1], signal.SIGCONT)
            self._release(found[0])
        return found[0]

    def _store(self, rng: random.Random, action: Callable[[object, float], None], seconds: float) -> str:
        cloud = rng.choice(sorted(self.dep.stores))
        if not self._hold(f"store:{cloud}"):
            return ""
        try:
            action(self.dep.stores[cloud], seconds)
        finally:
            self._release(f"store:{cloud}")
        return f"store:{cloud}"

    def store_outage(self, rng: random.Random) -> str:
        """A cloud's store unreachable for 5 to 20 s: connections refused, open ones dropped."""
        return self._store(rng, lambda s, t: s.outage(t), rng.uniform(5, 20))

    def store_slowdown(self, rng: random.Random) -> str:
        """A cloud's store answering every request 503 Slow Down for a minute."""
        return self._store(rng, lambda s, t: s.slow_down(t), 60.0)

    def worker_kill(self, rng: random.Random) -> str:
        """A Celery worker's host dies with every process it started; its supervisor starts it again 5 s later."""
        host = rng.choice(sorted(self.dep.cluster.workers))
        if not self._hold(host):
            return ""
        try:
            self.dep.cluster.restart(host, down_s=5.0)
        finally:
            self._release(host)
        return host

    def restart(self, name: str) -> str:
        """A control-plane process killed and started again 2 s later."""
        if not self._hold(name):
            return ""
        try:
            self.dep.cluster.restart(name, down_s=2.0)
        finally:
            self._release(name)
        return name

    def ledger_restart(self, rng: random.Random) -> str:
        """The ledger's PostgreSQL crashes (immediate stop: unflushed WAL lost) and starts again 0 to 5 s later."""
        if not self._hold("ledger"):
            return ""
        try:
            self.dep.ledger_pg.crash(down_s=rng.uniform(0.0, 5.0))
        finally:
            self._release("ledger")
        return "ledger"

    def drain(self, rng: random.Random) -> str:
        """An operator drains a cloud for 30 s, then makes it active again."""
        cloud = rng.choice(sorted(self.dep.stores))
        if not self._hold(f"drain:{cloud}"):
            return ""
        try:
            for action, wait in (("drain", 30.0), ("activate", 0.0)):
                done = self.dep.operator("cloud", action, cloud)
                if done.returncode:
                    raise RuntimeError(f"cloud {action} {cloud}: {done.stderr.strip()[-300:]}")
                time.sleep(wait)
        finally:
            self._release(f"drain:{cloud}")
        return cloud


class Workload:
    """Keeps ``in_flight`` runs of the job going; each run's submission and end go into the history."""

    def __init__(self, dep: Deployment, history: History, conf: dict, args, rng: random.Random):
        self.dep, self.history, self.conf, self.args, self.rng = dep, history, conf, args, rng
        self.live: list[str] = []
        self.ended: dict[str, str] = {}  # run -> succeeded | failed

    def submit(self) -> str:
        """One run: plain, with a deadline (and a higher priority), or deferrable before a deadline."""
        conf, draw = dict(self.conf), self.rng.random()
        if draw < self.args.deferrable_share:
            conf.update(deferrable=True, deadline=str(self.args.deferrable_deadline_h))
        elif draw < self.args.deferrable_share + self.args.deadline_share:
            conf.update(deadline="2", priority=1)
        run_id = self.dep.cluster.trigger(DAG_ID, conf)
        self.history.append(RunSubmitted(time.time(), run_id, TENANT, JOB))
        self.live.append(run_id)
        return run_id

    def reason(self, run_id: str) -> str:
        """Why a run failed, as Airflow says: its failed tasks and their tries."""
        try:
            tasks = self.dep.cluster.task_instances(DAG_ID, run_id)
        except Exception as exc:  # noqa: BLE001 - the API answers again on the next poll
            return f"failed (its tasks could not be read: {exc!r})"
        failed = [f"{t['task_id']} (try {t['try_number']})" for t in tasks if t["state"] == "failed"]
        after = sum(t["state"] == "upstream_failed" for t in tasks)
        return (f"failed: {', '.join(failed)}; {after} task(s) not run after it" if failed
                else "the run failed without a failed task")

    def poll(self) -> None:
        """Record every live run that ended since the last poll."""
        for run_id in list(self.live):
            try:
                state = self.dep.cluster.run_state(DAG_ID, run_id)
            except Exception:  # noqa: BLE001 - the api-server is looked at again on the next poll
                continue
            if state in ("success", "failed"):
                ended = "succeeded" if state == "success" else "failed"
                reason = "" if ended == "succeeded" else self.reason(run_id)
                self.history.append(RunEnded(time.time(), run_id, ended, reason))
                self.live.remove(run_id)
                self.ended[run_id] = ended
                print(f"  run {run_id}: {ended} {reason}".rstrip(), flush=True)

    def keep_going(self) -> None:
        self.poll()
        while len(self.live) < self.args.in_flight:
            try:
                self.submit()
            except Exception as exc:  # noqa: BLE001 - the next poll tries again
                print(f"  submitting a run failed: {exc!r}", flush=True)
                return


def schedule(seed: int, minutes: float, rate: float, kinds: list[str]) -> list[tuple[float, str, int]]:
    """(seconds into the soak, kind, the fault's own seed), drawn from ``seed`` alone: exponential gaps."""
    rng, at, out = random.Random(seed), 0.0, []
    while rate > 0:
        at += rng.expovariate(rate / 60.0)
        if at >= minutes * 60:
            return out
        out.append((at, rng.choice(kinds), rng.randrange(2**31)))
    return out


def final_loss(dep: Deployment, run_id: str) -> float:
    """The run's final eval loss, from its summary in the home store."""
    from crosscloud.core.keys import RunKeys
    from crosscloud.store.open_store import open_store

    home = open_store(dep.fed.local_cloud, TENANT)
    return float(json.loads(home.get(RunKeys(TENANT, run_id).summary))["metrics"]["final_eval_loss"])


def baseline(dep: Deployment, history: History, conf: dict) -> str:
    """A fault-free run of the job: the loss each completed run must come within the tolerance of."""
    run_id = dep.cluster.trigger(DAG_ID, conf)
    history.append(RunSubmitted(time.time(), run_id, TENANT, JOB))
    state = dep.cluster.wait(DAG_ID, run_id, timeout_s=1800)["state"]
    history.append(RunEnded(time.time(), run_id, "succeeded" if state == "success" else "failed",
                            "" if state == "success" else "the fault-free run failed"))
    if state != "success":
        raise SystemExit(f"the fault-free run {run_id} failed: the deployment does not work; see {dep.root}")
    loss = final_loss(dep, run_id)
    history.append(BaselineLoss(time.time(), JOB, loss))
    print(f"fault-free run {run_id}: final eval loss {loss:.4f}", flush=True)
    return run_id


def soak(dep: Deployment, history: History, args) -> tuple[Workload, str]:
    """The soak itself: runs kept in flight while the schedule's faults are injected; then the runs waited for."""
    conf = {"rounds": args.rounds, "inner_steps": args.inner_steps, "model_size": "tiny", "global_batch": 12,
            "seed": args.seed, "subtask_retries": 3}
    first = baseline(dep, history, conf)
    work, faults = Workload(dep, history, conf, args, random.Random(args.seed + 1)), Faults(dep, history)
    work.ended[first] = "succeeded"
    kinds = args.faults.split(",") if args.faults else sorted(faults.kinds)
    unknown = sorted(set(kinds) - set(faults.kinds))
    if unknown:
        raise SystemExit(f"--faults: unknown {unknown}; known: {sorted(faults.kinds)}")
    began = time.time()
    plan = schedule(args.seed, args.minutes, args.fault_rate, kinds)
    print(f"soak: {args.minutes:g} min, {len(plan)} faults drawn from seed {args.seed}", flush=True)
    threads = [faults.inject(kind, began + at, seed) for at, kind, seed in plan]
    while time.time() < began + args.minutes * 60:
        work.keep_going()
        time.sleep(5)
    for thread in threads:  # the last faults end (a frozen sub-task continues, a store comes back)
        thread.join(timeout=max(0.0, began + args.minutes * 60 + 600 - time.time()))
    deadline = time.time() + args.drain_minutes * 60
    while work.live and time.time() < deadline:
        work.poll()
        time.sleep(5)
    return work, first


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=30.0, help="how long faults are injected and runs submitted")
    p.add_argument("--fault-rate", type=float, default=8.0, help="faults a minute (exponential gaps)")
    p.add_argument("--faults", default="", help="comma-separated kinds (default: every kind)")
    p.add_argument("--in-flight", type=int, default=2, help="training runs kept going at once")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--inner-steps", type=int, default=8)
    p.add_argument("--deferrable-share", type=float, default=0.25)
    p.add_argument("--deferrable-deadline-h", type=float, default=0.25, help="a deferrable run's deadline, hours")
    p.add_argument("--deadline-share", type=float, default=0.25)
    p.add_argument("--lease-s", type=float, default=60.0, help="the runs' lease (CROSSCLOUD_LEASE_S)")
    p.add_argument("--grace-s", type=float, default=30.0, help="sub-tasks' grace past it (CROSSCLOUD_LEASE_GRACE_S)")
    p.add_argument("--drain-minutes", type=float, default=20.0, help="longest wait for the runs after the soak")
    p.add_argument("--loss-tolerance", type=float, default=0.05)
    p.add_argument("--data", default=os.environ.get("CROSSCLOUD_DATA_DIR") or str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default="", help="folder of the history and the deployment's logs (default: a new one)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from soak_record import Recorder

    from crosscloud.soak.history import read_history

    args = parse(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="crosscloud-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    dep = Deployment(root, Path(args.data), args.lease_s, args.grace_s)
    path = root / "history.jsonl"
    print(f"soak in {root}; history {path}", flush=True)
    with History(path) as history:
        try:
            dep.start()
            fed = dep.fed
            for cloud in fed.clouds:
                history.append(CloudCapacity(time.time(), cloud.name, sum(p.count for p in cloud.pools)))
            recorder = Recorder(history, fed, TENANT, dep.ledger_url, args.lease_s)
            recorder.start()
            work, first = soak(dep, history, args)
            time.sleep(args.lease_s + args.grace_s)  # what a dead runner held lapses; its sub-tasks stop
            recorder.stop()
            for problem in recorder.finish({run: JOB for run in [*work.ended, *work.live]}):
                print(f"  not recorded: {problem}", flush=True)
            history.append(HistoryEnded(time.time()))
        finally:
            dep.stop()
    events = read_history(path)
    report = check(events, grace_s=args.grace_s, loss_tolerance=args.loss_tolerance)
    for violation in report.violations:
        print(f"VIOLATION {violation}", flush=True)
    # the same figure for the fault-free run (and its baseline calibration): what starting, evaluating and
    # stopping sub-tasks cost without any fault, against which the soak's goodput is read
    alone = [e for e in events if getattr(e, "run", None) in (first, f"{first}.baseline")]
    print(f"history: {path}")
    print(f"{report.line()} fault_free_goodput={goodput(alone, history_end(events)):.3f}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
