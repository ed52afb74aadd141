"""Fault benchmark: a fixed schedule of injected faults against real runs; each must be detected, survived and lose nothing.

Real cross-cloud training runs (the engine's stages, ``pipeline.stages.run_job``) on a
temporary federation of local clouds (a fresh state folder: stores, ledger,
sub-tasks and spool of their own), small model, few rounds. The clouds do the
round exchange themselves (``training.exchange``: each decides the round's
members, downloads and screens their deltas, reduces and commits its own copy
of the global); the run's watcher (``sync_stage``) only records rounds and
restarts sub-tasks. First a fault-free run of the seed, then one run per
fault, each injected for real once ``--at-round`` rounds are decided (their
MEMBERS records written):

- ``kill``: the ``--cloud``'s worker process is killed (SIGKILL); the watcher starts it
  again and it resumes from its cloud's own state (or, with ``subtask_retries`` 0, is lost);
- ``outage``: shanghai's store (an S3 server behind a gate) refuses every
  connection for ``--outage-s`` seconds; transfers retry with backoff;
- ``corrupt``: one bit of the cloud's committed delta flipped at rest, before any
  cloud read it: every cloud reads it 3 times and refuses it by its sha256;
- ``poison``: the cloud commits a well-formed delta 1000x the norm of its last
  one, with a commit that vouches for it (a cloud lying about its work): every
  cloud refuses it by its norm;
- ``drain``: the cloud set to draining in the ledger; the watcher notes it
  (rounds/watch.json) and the clouds' next round decision gives it share 0;
- ``watcher``: the watcher, in its own process as the ``sync_checkpoints`` task,
  killed (SIGKILL) mid-run; rounds go on without it; started again (once
  retention has deleted the globals of the first round it has not recorded),
  it records every round exactly once;
- ``reduce``: the cloud's sub-task killed halfway through its reduce of round
  ``--at-round`` (failpoint ``<cloud>:reduce:<round>``); started again, it
  reduces the same bytes and commits the global every other cloud committed;
- ``publish``: the same, killed between uploading its global and committing it
  (failpoint ``<cloud>:publish:<round>``).

Each injection is deterministic: it waits for a state of the run, not for a
time. A flipped bit is damage at rest after the commit: beijing's worker is
paused (SIGSTOP) before it commits the round, so no cloud can decide that
round's members (nor read the cloud's delta) until the cloud's delta is
committed and damaged and beijing resumed. A poisoned delta is written under
a fresh key and committed in the cloud's name for the round after the one its
paused worker is in: a round it cannot be committing, and that it finds
committed when it gets there (a committed step is never written again). The
drained cloud: beijing's worker is paused until the watcher has noted the
drain, so the next round's decision sees it. The watcher is killed while
beijing's worker is paused (once the watcher has recorded a round), so the
rounds beijing has not committed yet are decided with no watcher. The
failpoints are armed through ``CROSSCLOUD_FAILPOINTS`` in the environment the
sub-tasks inherit; they fire once per spool folder, and every invocation gets
a fresh one (``CROSSCLOUD_SPOOL``).

Per fault: ``detected`` (the run's record names the fault), ``recovered`` (the
run completed all its rounds), ``rounds_lost`` (rounds of work that never
reached the global model: rounds in which a cloud was lost or a contribution
refused, plus rounds missing from or repeated in the recorded history) and the
final eval loss against the fault-free run. ``committed_bytes_lost``: bytes of
committed objects (deltas, the clouds' global copies, saved states, the final
model) in any store whose COMMIT.json is there but that are missing or fail
their sha256 at the end, the objects the benchmark damaged itself excepted
(``Bench.committed_bytes_lost``); what retention deleted (commit first) is not
lost.

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

FAULTS = ("kill", "outage", "corrupt", "poison", "drain", "watcher", "reduce", "publish")
WATCHER = ("import sys; from crosscloud.pipeline.stages import RunRef, sync_stage; "
           "from crosscloud.pipeline.subtasks import run_handles; "
           "ref = RunRef(*sys.argv[1:4]); sync_stage(ref, run_handles(ref), log=print)")
HOLD_S = 60.0  # the longest a paused worker waits for what the injection waits for
HOLD_WATCHER_S = 4.0  # beijing held for the watcher's first record: under the clouds' patience (5 s at least)
Detect = Callable[[list[dict]], bool]
Outcome = tuple[dict | None, Detect, int]  # the summary (None: the run failed), detection, committed bytes lost


class Bench:
    """The runs of one schedule on the federation at ``fed_path``; ``cloud`` is the one the faults hit."""

    def __init__(self, spec, fed_path: str, cloud: str, at_round: int):
        from crosscloud.core.federation import load_federation

        self.spec, self.fed_path, self.cloud, self.at_round = spec, fed_path, cloud, at_round
        self.fed = load_federation(fed_path)
        self.damaged: set[tuple[str, str]] = set()  # (cloud, key) of the objects the benchmark damaged itself
        self.lines: list[str] = []  # the watcher's log of the runs
        self.notes: list[str] = []  # what the injections saw, for the report

    def store(self, cloud: str):
        from crosscloud.store.open_store import open_store

        return open_store(self.fed.cloud(cloud), self.spec.tenant)

    def keys(self, run_id: str):
        from crosscloud.core.keys import RunKeys

        return RunKeys(self.spec.tenant, run_id)

    @property
    def home(self):
        return self.store(self.fed.local_cloud.name)

    def history(self, run_id: str) -> list[dict]:
        key, home = self.keys(run_id).history, self.home
        return json.loads(home.get(key)) if home.exists(key) else []

    def members(self, run_id: str, r: int) -> dict | None:
        """Round ``r``'s MEMBERS record (written once by the clouds in the home store), or None while undecided."""
        from crosscloud.store.base import ObjectNotFound

        try:
            return json.loads(self.home.get(self.keys(run_id).members(r)))
        except ObjectNotFound:
            return None

    def watch_notes(self, run_id: str) -> dict:
        """What the watcher wrote for the clouds (rounds/watch.json: lost, draining, restarted sub-tasks)."""
        key = self.keys(run_id).watch
        return json.loads(self.home.get(key)) if self.home.exists(key) else {}

    def decided(self, run_id: str) -> int:
        """How many rounds the clouds have decided (MEMBERS records 0, 1, ...), watched or not."""
        n = 0
        while self.home.exists(self.keys(run_id).members(n)):
            n += 1
        return n

    def at(self, run_id: str, action: Callable[[], None], done: threading.Event,
           ready: Callable[[], bool] | None = None) -> threading.Thread:
        """Run ``action`` once ``ready()`` (default: ``at_round`` rounds decided); never, if the run ends first."""
        ready = ready or (lambda: self.decided(run_id) >= self.at_round)

        def watch():
            while not done.is_set() and not ready():
                time.sleep(0.02)
            if not done.is_set():
                try:
                    action()
                except Exception as exc:  # an injection that failed is reported, and the fault goes undetected
                    self.notes.append(f"{run_id}: the injection failed: {exc!r}")
                    print(f"  {run_id}: the injection failed: {exc!r}", flush=True)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread

    def run(self, run_id: str, action: Callable[[], None] | None = None, spec=None) -> dict | None:
        """A run of the engine's stages with ``action`` injected; its summary, or None when it failed."""
        from crosscloud.pipeline.stages import run_job

        done = threading.Event()
        self.lines = []  # this run's log only
        injector = self.at(run_id, action, done) if action else None
        try:
            return run_job(spec or self.spec, run_id, self.fed_path, log=self.lines.append, compare_baseline=False)
        except Exception as exc:  # reported as not recovered; the schedule goes on
            print(f"  run {run_id} failed: {exc!r}", flush=True)
            return None
        finally:
            done.set()
            if injector:
                injector.join()

    def worker_pids(self, run_id: str, cloud: str) -> list[int]:
        """The worker processes of a cloud's sub-task, under the wrapper shell the local backend starts."""
        import psutil
        from crosscloud.backends import get_backend

        handle = get_backend("local").find(self.spec.tenant, run_id, cloud)
        return [p.pid for p in psutil.Process(handle["pid"]).children(recursive=True)]

    def paused(self, run_id: str, cloud: str, then: Callable[[], None]) -> None:
        """``then()`` while every worker process of ``cloud`` is stopped (SIGSTOP), resumed afterwards whatever happens."""
        held = self.worker_pids(run_id, cloud)
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        try:
            then()
        finally:
            for pid in held:
                os.kill(pid, signal.SIGCONT)

    def first_uncommitted(self, run_id: str, cloud: str) -> int | None:
        from crosscloud.store.commit import read_commit

        store, keys = self.store(cloud), self.keys(run_id)
        return next((r for r in range(self.spec.rounds) if read_commit(store, keys.cloud_step(cloud, r)) is None), None)

    def damage_next_delta(self, run_id: str) -> None:
        """Flip a bit of the cloud's next delta once committed, before any cloud reads it.

        beijing's worker is paused first: no round beijing has not committed can
        be decided (nor its deltas read), so the cloud's delta of that round is
        damaged as soon as it is committed, and beijing resumed.
        """
        from crosscloud.store.commit import read_commit

        store, keys = self.store(self.cloud), self.keys(run_id)

        def damage():
            r = self.first_uncommitted(run_id, "beijing")
            if r is None:
                self.notes.append(f"{run_id}: beijing had committed every round; nothing left to damage (raise --rounds)")
                return
            deadline = time.monotonic() + HOLD_S
            while (commit := read_commit(store, keys.cloud_step(self.cloud, r))) is None:
                if time.monotonic() > deadline:
                    self.notes.append(f"{run_id}: {self.cloud} did not commit round {r} within {HOLD_S:.0f} s")
                    return
                time.sleep(0.02)
            entry = next(iter(commit["objects"].values()))
            data = bytearray(store.get(entry["key"]))
            data[len(data) // 2] ^= 0x10
            store.put(entry["key"], bytes(data))
            self.damaged.add((self.cloud, entry["key"]))
            self.notes.append(f"{run_id}: a bit of {self.cloud}'s delta of round {r} flipped ({entry['key']})")

        self.paused(run_id, "beijing", damage)

    def commit_poisoned_delta(self, run_id: str) -> None:
        """The cloud lies about its work: a round of its committed as 1000x its last delta, well-formed and
        sha256-consistent, under a fresh key no commit names. Its worker is paused in round r (which it may be
        committing right now), the lie committed in its name for round r + 1; resumed, it finds round r + 1
        committed when it gets there and, as a committed step is never written again, goes on without writing it."""
        from crosscloud.store.commit import (
            put_object,
            read_commit,
            read_object,
            write_step,
        )
        from crosscloud.store.tensors import from_bytes, to_bytes

        store, keys = self.store(self.cloud), self.keys(run_id)

        def forge():
            r = self.first_uncommitted(run_id, self.cloud)
            if r is None or r + 1 >= self.spec.rounds or r == 0:
                self.notes.append(f"{run_id}: {self.cloud} is in round {r}: no later round to forge (raise --rounds)")
                return
            last = read_commit(store, keys.cloud_step(self.cloud, r - 1))
            name = next(iter(last["objects"]))
            tensors = from_bytes(read_object(store, last, name))
            # int8 blocks: the scales carry the magnitude (1000x the decoded delta); float32: every value
            forged = {n: t if n.endswith(".q") else 1000.0 * t for n, t in tensors.items()}
            step = keys.cloud_step(self.cloud, r + 1)
            entry = put_object(store, f"{step}/forged-{name}", to_bytes(forged))
            write_step(store, step, {}, refs={name: entry}, meta={**last["meta"], "round": r + 1})
            self.notes.append(f"{run_id}: {self.cloud}'s round {r + 1} committed as 1000x its round {r - 1} "
                              f"while its worker was in round {r}")

        self.paused(run_id, self.cloud, forge)

    def outcome(self, run_id: str, summary: dict | None, detect: Detect) -> Outcome:
        return summary, detect, self.committed_bytes_lost(run_id)

    def committed_bytes_lost(self, run_id: str) -> int:
        """Bytes of the run's committed objects that are missing or fail their sha256, in every store.

        Every commit found (deltas, each cloud's copies of the globals, saved
        states, the final model) is verified object by object. What retention
        deleted is no loss: it deletes a step's COMMIT.json before its objects.
        """
        from crosscloud.store.base import StoreError
        from crosscloud.store.commit import read_commit, read_object

        keys, lost = self.keys(run_id), 0
        for cloud in self.fed.clouds:
            store = self.store(cloud.name)
            for step in [k.removesuffix("/COMMIT.json") for k in store.list(keys.root) if k.endswith("/COMMIT.json")]:
                commit = read_commit(store, step)
                for name, entry in commit["objects"].items():
                    if (cloud.name, entry.get("key")) in self.damaged:
                        continue
                    try:
                        read_object(store, commit, name)
                    except StoreError:
                        lost += entry["size"]
        return lost

    def outcomes(self, run_id: str, r: int) -> dict[str, dict]:
        """What each member of round ``r`` made of it (``digest`` of its global ``r + 1``, ``refused``): as it reported
        it with its next round's commit (kept in round ``r + 1``'s MEMBERS record), else as its own commit of global
        ``r + 1`` says (the last round, or a cloud that left the run; retention keeps the last globals)."""
        from crosscloud.store.commit import read_commit

        members = (self.members(run_id, r) or {}).get("contributions", {})
        later = (self.members(run_id, r + 1) or {}).get("contributions", {})
        found = {}
        for cloud in sorted(members):
            made = (later.get(cloud, {}).get("meta") or {}).get("exchange") or {}
            if made.get("digest"):
                found[cloud] = made
            elif (commit := read_commit(self.store(cloud), self.keys(run_id).global_step(r + 1))) is not None:
                found[cloud] = commit["meta"]
        return found

    def agreed(self, run_id: str, r: int) -> bool:
        """Every member of round ``r`` committed its copy of global ``r + 1``, all with the same digest."""
        members = (self.members(run_id, r) or {}).get("contributions", {})
        metas = self.outcomes(run_id, r)
        return bool(members) and set(metas) == set(members) and len({m["digest"] for m in metas.values()}) == 1

    def refused_everywhere(self, run_id: str, history: list[dict], why: str) -> bool:
        """A recorded round in which every member refused the cloud's contribution for ``why`` and made the same
        global without it."""
        for record in history:
            if why not in record.get("refused", {}).get(self.cloud, ""):
                continue
            metas = self.outcomes(run_id, record["round"])
            if self.agreed(run_id, record["round"]) and all(why in m.get("refused", {}).get(self.cloud, "") for m in metas.values()):
                self.notes.append(f"{run_id}: round {record['round']}: {self.cloud}'s delta refused by "
                                  f"{sorted(metas)}: {record['refused'][self.cloud]}")
                return True
        return False

    def restarted(self, cloud: str) -> bool:
        """Whether the watcher of the last run started the cloud's dead sub-task again."""
        return any(f"cloud {cloud}: sub-task " in line and "starting it again" in line for line in self.lines)


def rounds_lost(history: list[dict], rounds: int) -> int:
    """Rounds of work that never reached the global model, from the recorded history: a cloud lost or refused
    in them, or the round missing or repeated."""
    seen = [r["round"] for r in history]
    hit = sum(1 for r in history if r.get("lost") or r.get("refused"))
    return hit + len(set(range(rounds)) - set(seen)) + (len(seen) - len(set(seen)))


def kill(bench: Bench, run_id: str, args) -> Outcome:
    def inject():
        pids = bench.worker_pids(run_id, bench.cloud)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        bench.notes.append(f"{run_id}: {bench.cloud}'s worker killed ({len(pids)} process(es)) after "
                           f"{bench.decided(run_id)} rounds decided")

    def detected(history: list[dict]) -> bool:  # started again (it resumes), or lost once its restarts are spent
        return bench.restarted(bench.cloud) or any(bench.cloud in r.get("lost", {}) for r in history)

    return bench.outcome(run_id, bench.run(run_id, inject), detected)


def corrupt(bench: Bench, run_id: str, args) -> Outcome:
    summary = bench.run(run_id, lambda: bench.damage_next_delta(run_id))
    return bench.outcome(run_id, summary, lambda h: bench.refused_everywhere(run_id, h, "does not match its commit"))


def poison(bench: Bench, run_id: str, args) -> Outcome:
    summary = bench.run(run_id, lambda: bench.commit_poisoned_delta(run_id))
    return bench.outcome(run_id, summary, lambda h: bench.refused_everywhere(run_id, h, "norm"))


def drain(bench: Bench, run_id: str, args) -> Outcome:
    """The cloud set to draining while beijing's worker is held until the watcher has noted it (rounds/watch.json)."""
    from crosscloud.pool.membership import activate
    from crosscloud.pool.membership import drain as set_draining

    def inject():
        set_draining(bench.fed, bench.cloud)

        def noted():
            deadline = time.monotonic() + HOLD_S
            while bench.cloud not in bench.watch_notes(run_id).get("draining", []):
                if time.monotonic() > deadline:
                    bench.notes.append(f"{run_id}: the watcher did not note {bench.cloud} draining within {HOLD_S:.0f} s")
                    return
                time.sleep(0.02)
            bench.notes.append(f"{run_id}: {bench.cloud} draining, noted by the watcher after {bench.decided(run_id)} "
                               "rounds decided")

        bench.paused(run_id, "beijing", noted)

    try:
        summary = bench.run(run_id, inject)
    finally:
        activate(bench.fed, bench.cloud)

    def detected(history: list[dict]) -> bool:  # from one round on, its share is 0 to the end and the others cover it
        moved = [r["round"] for r in history if r["next_shares"].get(bench.cloud) == 0]
        return bool(moved) and moved == list(range(moved[0], len(history))) and all(
            sum(history[r]["next_shares"].values()) == bench.spec.global_batch for r in moved)

    return bench.outcome(run_id, summary, detected)


def watcher(bench: Bench, run_id: str, args) -> Outcome:
    """The watcher in its own process, killed mid-run; rounds go on; started again, as Airflow retries the task."""
    from crosscloud.pipeline.stages import (
        admit_stage,
        aggregate_stage,
        dispatch_stage,
        preheat_stage,
        release_stage,
        stop_run,
        sync_stage,
    )
    from crosscloud.pipeline.subtasks import run_handles

    ref = admit_stage(bench.spec, run_id, bench.fed_path)
    first, killed_at, restarted_at, summary = None, None, None, None
    bench.lines = []
    try:
        preheat_stage(ref)
        _, plan = ref.load()
        handles = [dispatch_stage(ref, c.name) for c in plan.clouds]
        first = subprocess.Popen([sys.executable, "-c", WATCHER, ref.federation_path, ref.tenant, ref.run_id],
                                 stdout=subprocess.DEVNULL)
        recorded = len(bench.history(run_id))

        def kill_watcher():
            def kill():  # beijing held: no round past its last commit is decided until the watcher is dead
                nonlocal killed_at, recorded
                deadline = time.monotonic() + HOLD_WATCHER_S
                while not bench.history(run_id) and time.monotonic() < deadline:  # it records: it watches for real
                    time.sleep(0.02)
                os.kill(first.pid, signal.SIGKILL)
                first.wait()
                killed_at, recorded = time.time(), len(bench.history(run_id))

            bench.paused(run_id, "beijing", kill)

        done = threading.Event()
        injector = bench.at(run_id, kill_watcher, done)
        first.wait()
        done.set()
        injector.join()
        # rounds go on without a watcher: it is started again once the clouds' retention has deleted the globals of the
        # first round it has not recorded (that round's exchange outcome is all it finds), before the run's last round
        deadline, enough = time.monotonic() + HOLD_S, min(recorded + bench.spec.keep_rounds + 1, bench.spec.rounds - 1)
        while killed_at and bench.decided(run_id) < enough and time.monotonic() < deadline:
            time.sleep(0.02)
        restarted_at = time.time()
        sync_stage(ref, handles, log=bench.lines.append)
        summary = aggregate_stage(ref, handles, compare_baseline=False)
    except Exception as exc:
        print(f"  run {run_id} failed: {exc!r}", flush=True)
        stop_run(ref, run_handles(ref))  # nothing watches them any more
    finally:
        release_stage(ref)

    def detected(history: list[dict]) -> bool:
        if first is None or first.returncode != -signal.SIGKILL or killed_at is None:
            return False
        unwatched = [r for r in range(bench.spec.rounds)
                     if (m := bench.members(run_id, r)) and killed_at < m["decided_at"] < restarted_at]
        bench.notes.append(f"{run_id}: watcher killed with {recorded} rounds recorded; rounds {unwatched} decided "
                           "while no watcher ran")
        return (bool(unwatched) and [r["round"] for r in history] == list(range(bench.spec.rounds))
                and all(bench.agreed(run_id, r) for r in range(bench.spec.rounds)))

    return bench.outcome(run_id, summary, detected)


def failpoint(point: str) -> Callable:
    """The cloud's sub-task killed by a failpoint at ``point`` (reduce or publish) of round ``--at-round``."""

    def inject(bench: Bench, run_id: str, args) -> Outcome:
        os.environ["CROSSCLOUD_FAILPOINTS"] = f"{bench.cloud}:{point}:{bench.at_round}"  # the sub-tasks inherit it
        try:
            summary = bench.run(run_id)
        finally:
            os.environ.pop("CROSSCLOUD_FAILPOINTS", None)
        fired = f"failpoint: cloud {bench.cloud} killed at {point} of round {bench.at_round}"

        def detected(history: list[dict]) -> bool:  # it died there, was started again, and every global agrees
            died, again = any(fired in line for line in bench.lines), bench.restarted(bench.cloud)
            agree = [r["round"] for r in history if r["digests_agree"] and bench.agreed(run_id, r["round"])]
            bench.notes.append(f"{run_id}: {fired if died else 'the failpoint did not fire'}; "
                               f"{'started again' if again else 'not started again'}; "
                               f"rounds whose globals agree on every member: {agree}")
            return died and again and len(history) == bench.spec.rounds and agree == list(range(bench.spec.rounds))

        return bench.outcome(run_id, summary, detected)

    return inject


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
        bench.notes += on_s3.notes
        return on_s3.outcome(run_id, summary, lambda h: server.refused > 0)  # read while the server holds the objects
    finally:
        server.stop()


INJECT = {"kill": kill, "outage": outage, "corrupt": corrupt, "poison": poison, "drain": drain, "watcher": watcher,
          "reduce": failpoint("reduce"), "publish": failpoint("publish")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {','.join(FAULTS)}")
    ap.add_argument("--cloud", default="singapore", help="the collaboration cloud the faults hit (the outage: shanghai's store)")
    ap.add_argument("--at-round", type=int, default=2, help="inject once this many rounds are decided (>= 1)")
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
        ap.error("--cloud: a collaboration cloud, shanghai or singapore (beijing is the run's home cloud, which the "
                 "benchmark holds back to inject some faults)")
    if not 1 <= args.at_round < args.rounds - 1:
        ap.error(f"--at-round: from 1 to --rounds - 2 ({args.rounds - 2}): a fault needs rounds before and after it")
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="crosscloud-bench-faults-"))
    state.mkdir(parents=True, exist_ok=True)
    os.environ["CROSSCLOUD_STATE_DIR"] = str(state)  # stores, ledger and sub-tasks of this benchmark only
    # the sub-tasks' spool, fresh for every invocation: a failpoint's marker of an earlier one never disarms it
    os.environ["CROSSCLOUD_SPOOL"] = tempfile.mkdtemp(prefix="spool-", dir=state)
    os.environ.pop("CROSSCLOUD_LEDGER", None)
    os.environ.pop("CROSSCLOUD_FAILPOINTS", None)  # armed by the reduce and publish faults only
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
          f"each fault injected once {args.at_round} rounds are decided", flush=True)
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
        bench.notes = []
        summary, detect, lost_bytes = INJECT[fault](bench, run_id, args)
        history = bench.history(run_id)  # the home cloud's store is a folder in every variant of the federation
        recovered = summary is not None and len(history) == spec.rounds
        lost = rounds_lost(history, spec.rounds)
        completed, lost_rounds, bytes_lost = completed + recovered, lost_rounds + lost, bytes_lost + lost_bytes
        loss = summary["metrics"]["final_eval_loss"] if summary else float("nan")
        detected = detect(history)
        failed += not (detected and recovered and lost <= 1)  # the bar: at most one round lost per fault
        print(f"{fault:<12}{detected!s:>9}{recovered!s:>10}{lost:>12}{loss:>11.4f}"
              f"{(loss / clean_loss - 1) * 100:>+9.1f}%", flush=True)
        for record in history:  # a cloud lost is the fault's cost too: said, whatever the fault
            for cloud, why in record.get("lost", {}).items():
                bench.notes.append(f"{run_id}: round {record['round']}: cloud {cloud} lost: {why}")
        for note in bench.notes:
            print(f"  {note}", flush=True)
    print(f"faults_injected={len(faults)} runs_completed={completed} rounds_lost={lost_rounds} committed_bytes_lost={bytes_lost}")
    return 0 if not failed and bytes_lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
