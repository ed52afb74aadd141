"""The run's watcher: follows the rounds the clouds commit, keeps the run's history, restarts sub-tasks that died.

The clouds exchange and reduce without it; it computes nothing and loads no
tensor. ``peek`` only reads (the round records in the home store, the
sub-tasks' states) and says whether there is anything to do: Airflow's
deferred ``sync_checkpoints`` calls it from the triggerer. ``act`` does it: it
starts a dead sub-task again (it resumes from its state) or, its restarts
spent, tells the clouds it is lost; it notes draining clouds for the clouds'
next round decisions; and it turns each decided round into its record
(history.json, MLflow). A watcher killed or restarted leaves training alone: it
picks the history up where history.json ends.

It is also the run's side of the federation's queue (``queue``, a
``crosscloud.scheduler.service.Queue``): it reports the run's work left,
measured from its rounds, and when a pass decides to pause the run, it asks
the clouds (its notes) to stop after their next committed round. Once every
sub-task has stopped there, it gives the devices back (``Queue.pause``); when
the queue starts the run again, ``resume`` starts every sub-task again, and
each goes on from its saved state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from crosscloud.backends import Backend, Handle, get_backend
from crosscloud.backends.base import PROGRAM_FAILED, STOPPED
from crosscloud.ledger import Ledger
from crosscloud.ledger.queue import WAITING
from crosscloud.run import heartbeat
from crosscloud.run.history import load_history, save_history
from crosscloud.run.lease import Lease
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectNotFound, ObjectStore, StoreError
from crosscloud.store.commit import read_commit
from crosscloud.training.exchange.members import Members, global_report, read_members, read_watch
from crosscloud.training.program import ProgramError

POLL_S = 2.0  # a look reads a few objects of the home store: at most about 2 requests a second
QUEUE_LOOK_S = 10.0  # how often a watch asks the queue whether the run is to pause
Restart = Callable[[str], Handle]


class SubTaskLost(RuntimeError):
    """Every cloud of the run is lost: nothing trains any more."""


class Watcher:
    """The watch over one run; ``stores`` are the run's stores (``Plan.store_clouds``) as the watcher's host reaches
    them."""

    def __init__(self, plan: Plan, stores: dict[str, ObjectStore], handles: list[Handle], log: Callable[[str], None] = print,
                 restart: Restart | None = None, ledger: Ledger | None = None, since: float | None = None,
                 queue=None):
        self.plan, self.stores, self.log, self.restart, self.queue = plan, stores, log, restart, queue
        self._looked_at = float("-inf")
        self.home = stores[plan.coordinator_cloud]
        self.ledger = ledger
        self.lease = Lease(plan.tenant, plan.run_id, ledger, log, beat=self._beat) if ledger is not None else None
        self.notes = read_watch(self.home, plan)  # what a watcher before this one knew
        self.notes.setdefault("handles", {h["cloud"]: h for h in handles})
        for key in ("lost", "restarted_at", "ended", "log_offsets"):
            self.notes.setdefault(key, {})
        self.notes.setdefault("draining", [])
        self.notes.setdefault("resumed", [])  # the pauses the run has resumed from
        self.history = load_history(self.home, plan)
        self.since = since or time.time()  # the last progress seen: this watch's start (or an earlier one's), each round

    def _beat(self, expires_at: float) -> None:
        """The renewed lease, told to every cloud still in the run: their sub-tasks stop once it lapses."""
        stores = [s for c, s in self.stores.items() if c not in self.notes["lost"]]
        if failed := heartbeat.write(stores, self.plan.keys, expires_at):
            self.log(f"run {self.plan.run_id}: the lease's heartbeat could not be written to {failed} now")

    @property
    def done(self) -> bool:
        return len(self.history) >= self.plan.spec.rounds

    @property
    def paused(self) -> bool:
        """Every sub-task still in the run stopped for the pause asked, after a committed round."""
        if not self.notes.get("pause"):
            return False
        stopped = {c for c, why in self.notes["ended"].items() if why.startswith("paused")}
        return bool(stopped) and stopped >= {c.name for c in self.plan.clouds} - set(self.notes["lost"])

    def remaining_s(self) -> float:
        """The run's work left: its rounds left at the wall time of its last rounds."""
        walls = [r["wall_s"] for r in self.history[-3:]]
        return (self.plan.spec.rounds - len(self.history)) * (sum(walls) / len(walls) if walls else 0.0)

    def _backend(self, handle: Handle) -> Backend:
        return get_backend(handle["backend"])

    def _ended(self) -> dict[str, str]:
        """Sub-tasks that ended and have not been seen to: {cloud: state}."""
        found = {}
        for cloud, handle in self.notes["handles"].items():
            if cloud in self.notes["lost"] or cloud in self.notes["ended"]:
                continue
            state = self._backend(handle).state(handle)
            if state != "running" and not (state == "succeeded" and self.done):
                found[cloud] = state
        return found

    def peek(self) -> str | None:
        """Why ``act`` should run now (a round decided, a sub-task ended, a cloud draining), or None.

        It reads the run only; it renews the run's lease, since a watch polling is a run alive.
        """
        if self.lease is not None:
            self.lease.renew()
        if self.done:
            return "done"
        if self.paused:
            return "paused" if self.notes["pause"].get("released") else "paused: its devices to give back"
        if self._record(len(self.history)) is not None:  # decided, its global made, evaluated where due
            return f"round {len(self.history)} to record"
        if ended := self._ended():
            return f"sub-task ended: {ended}"
        if (asked := self._pause_asked()) is not None:
            return f"the queue pauses the run: {asked.reason}"
        if self.ledger is not None and sorted(self._draining()) != sorted(self.notes["draining"]):
            return "draining changed"
        if time.time() - self.since > self.plan.spec.round_timeout_s:
            return "stalled"
        return None

    def act(self, on_round: Callable[[dict], None] | None = None) -> list[dict]:
        """Restart or give up dead sub-tasks, note draining clouds, record every decided round; the new records."""
        if self.lease is not None:
            self.lease.renew()
        changed = self._see_to_ended() | self._ask_pause()
        if self.ledger is not None and sorted(draining := self._draining()) != sorted(self.notes["draining"]):
            self.notes["draining"], changed = sorted(draining), True
        self.relay_logs()
        if changed or self.notes.get("offsets_dirty"):
            self.notes.pop("offsets_dirty", None)
            self._save_notes()
        records = []
        while not self.done and (record := self._record(len(self.history))) is not None:
            self.history.append(record)
            save_history(self.home, self.plan, self.history)
            records.append(record)
            loss = "" if record["eval_loss"] is None else f"eval loss {record['eval_loss']:.4f}, "
            self.log(f"round {record['round']}: {loss}wall {record['wall_s']:.2f} s, members {sorted(record['clouds'])}")
            if on_round:
                on_round(record)
        if records:
            self.since = time.time()
            if self.queue is not None and not self.done:
                self.queue.progress(self.plan.tenant, self.plan.run_id, self.remaining_s())
        if self.paused:
            self._give_back()
        elif not self.done and time.time() - self.since > self.plan.spec.round_timeout_s:
            raise SubTaskLost(f"round {len(self.history)}: no round decided within {self.plan.spec.round_timeout_s:.0f} s"
                              f"{self._silent()}")
        return records

    def _silent(self) -> str:
        """What a stalled run's error adds when the program never called the SDK on some clouds."""
        keys = self.plan.keys
        silent = sorted(c.name for c in self.plan.clouds if not self.stores[c.name].exists(keys.sdk_started(c.name)))
        if not silent:
            return ""
        name = self.plan.program.name if self.plan.program else "the program"
        return (f"; {name} never called crosscloud.sdk.init() on {silent}: a program trains through the SDK "
                "(cc.init(), cc.DiLoCo and diloco.step()), see docs/programs.md")

    def run(self, on_round: Callable[[dict], None] | None = None, poll_s: float = POLL_S) -> list[dict]:
        """Watch until every round is recorded: ``act`` whenever ``peek`` finds something (in this process); a paused
        run waits here in the queue, then resumes."""
        while not self.done:
            if self.peek() is not None:
                self.act(on_round)
            if self.paused:
                self._wait_in_queue(poll_s)
                self.resume()
            elif not self.done:
                time.sleep(poll_s)
        self.relay_logs()
        return self.history

    def _save_notes(self) -> None:
        """The notes in the home store: where the clouds and a later watcher read them."""
        self.home.put(self.plan.keys.watch, json.dumps(self.notes).encode())

    # -- the queue's side: a pause and the resume -----------------------------------------
    def _pause_asked(self, fresh: bool = False):
        """The queue's pause decision for the run, looked up at most every ``QUEUE_LOOK_S`` (``fresh``: now); None
        when none is asked, or it was asked already."""
        if self.queue is None or self.notes.get("pause"):
            return None
        if not fresh and time.monotonic() - self._looked_at < QUEUE_LOOK_S:
            return None
        self._looked_at = time.monotonic()
        return self.queue.pause_asked(self.plan.tenant, self.plan.run_id)

    def _ask_pause(self) -> bool:
        """Ask the clouds to stop after their next committed round, if the queue pauses the run; whether it did."""
        asked = self._pause_asked(fresh=True)
        if asked is None or self.done:
            return False
        self.notes["pause"] = {"id": f"pause-{len(self.notes['resumed']) + 1}", "reason": asked.reason,
                               "asked_at": time.time()}
        self.log(f"the queue pauses the run after its next committed round: {asked.reason}")
        return True

    def paused_after(self, cloud: str) -> int | None:
        """The round after which ``cloud``'s sub-task stopped for the pause asked; None when it did not."""
        try:
            marker = json.loads(self.home.get(self.plan.keys.paused(cloud)))
        except ObjectNotFound:
            return None
        return marker["round"] if marker.get("pause") == self.notes["pause"]["id"] else None

    def _give_back(self) -> None:
        """Every sub-task stopped for the pause: the devices go back to the queue, where the run waits again."""
        if self.notes["pause"].get("released"):
            return
        freed = self.queue.pause(self.plan.tenant, self.plan.run_id, self.remaining_s()) if self.queue else 0
        self.notes["pause"]["released"] = True
        self._save_notes()
        self.log(f"paused after round {len(self.history) - 1}: {freed} device(s) given back; the run waits in the "
                 "queue for them and resumes from its clouds' saved states")

    def _wait_in_queue(self, poll_s: float) -> None:
        """Wait (in this process) until a pass starts the paused run again."""
        while True:
            self.queue.touch(self.plan.tenant, self.plan.run_id)
            self.queue.run_pass()
            status = self.queue.status(self.plan.tenant, self.plan.run_id)
            if status.state == "running":
                return
            if status.state not in WAITING:
                raise SubTaskLost(f"run {self.plan.run_id} left the queue while paused: {status.state} "
                                  f"({status.row.end_reason})")
            time.sleep(poll_s)

    def resume(self) -> None:
        """The queue started the paused run again: every paused sub-task starts again and resumes from its state."""
        pause = self.notes.pop("pause")
        self.notes["resumed"].append(pause["id"])  # before the restarts: a sub-task passes a pause it resumed from
        self._save_notes()
        if self.lease is not None:  # the heartbeat of the devices the queue gave back, not the lapsed one of the pause
            self.lease.renew(force=True)
        for cloud, why in sorted(self.notes["ended"].items()):
            if why.startswith("paused"):
                del self.notes["ended"][cloud]
                self.notes["handles"][cloud] = self.restart(cloud)
                self.notes["restarted_at"][cloud] = time.time()
        self._save_notes()
        self.since = time.time()
        self.log(f"resumed after {pause['id']}: every cloud's sub-task started again from its saved state")

    def _draining(self) -> set[str]:
        members = self.ledger.memberships()
        return {c.name for c in self.plan.clouds if members.get(c.name) and members[c.name].state == "draining"}

    def _see_to_ended(self) -> bool:
        """Each newly ended sub-task: the run stops on a failed program; a dead one starts again or is lost."""
        ended = self._ended()
        for cloud, state in ended.items():
            handle = self.notes["handles"][cloud]
            self.relay_logs()
            if self.notes.get("pause") and (after := self.paused_after(cloud)) is not None:
                self.notes["ended"][cloud] = f"paused after round {after}"
                continue
            code = self._backend(handle).exit_code(handle)
            if code == PROGRAM_FAILED:
                name = self.plan.program.name if self.plan.program else "?"
                raise ProgramError(f"program {name} failed on cloud {cloud} (its traceback is in the log above); "
                                   "the run stops")
            left = self.notes.setdefault("restarts_left", {}).setdefault(
                cloud, self.plan.spec.subtask_retries if self.restart and not self._backend(handle).restarts_itself else 0)
            if code == STOPPED or state == "succeeded":
                self.notes["ended"][cloud] = f"sub-task {state} (exit code {code})"
            elif left > 0:
                self.notes["restarts_left"][cloud] = left - 1
                self.log(f"cloud {cloud}: sub-task {state} (exit code {code}); starting it again, it resumes from its "
                         f"last round ({left - 1} restart(s) left)")
                self.notes["handles"][cloud] = self.restart(cloud)  # its log goes on in the same file: the offset stays
                self.notes["restarted_at"][cloud] = time.time()
            else:
                self.notes["lost"][cloud] = f"sub-task is {state} (exit code {code}) with no restart left"
                self.log(f"cloud {cloud}: lost: {self.notes['lost'][cloud]}; the run goes on with the other clouds")
        gone = set(self.notes["lost"]) | set(self.notes["ended"])
        # a sub-task that succeeded committed and folded in every round: they are all decided, the records follow
        finished = any(why.startswith("sub-task succeeded") for why in self.notes["ended"].values())
        if ended and not self.done and not finished and not self.paused and gone >= {c.name for c in self.plan.clouds}:
            raise SubTaskLost(f"every cloud of run {self.plan.run_id} is lost: "
                              f"{ {**self.notes['ended'], **self.notes['lost']} }")
        return bool(ended)

    def relay_logs(self) -> None:
        """Copy new sub-task output into the watcher's log, so it reaches the task log."""
        offsets = self.notes["log_offsets"]
        for cloud, handle in self.notes["handles"].items():
            try:
                text, offset = self._backend(handle).logs(handle, offsets.get(cloud, 0))
            except (OSError, RuntimeError) as exc:
                self.log(f"[{cloud}] logs unavailable: {exc}")
                continue
            if offset != offsets.get(cloud, 0):
                offsets[cloud], self.notes["offsets_dirty"] = offset, True
            for line in text.splitlines():
                self.log(f"[{cloud}] {line}")

    def _record(self, r: int) -> dict | None:
        """Round ``r``'s record once it is decided, its global made by every member still in the run, and
        evaluated where due; else None.

        A cloud reports the digest of each global it made in its next round's commit, so the
        next round's record holds them all; until it exists (and for the last round) they are
        read from the clouds' own commits of the global.
        """
        members = read_members(self.home, self.plan, r)
        if members is None:
            return None
        self.since = max(self.since, members.decided_at)  # a round decided is progress, recorded or not yet
        later = read_members(self.home, self.plan, r + 1)
        made = ({c: v["meta"].get("exchange") or {} for c, v in later.contributions.items()} if later
                else self._globals(r, members))
        if later and set(members.contributions) - set(later.contributions):  # members lost in round r + 1
            made = {**self._globals(r, members), **made}  # their own commits of global r + 1, where they made one
        gone = set(self.notes["lost"]) | set(self.notes["ended"]) | set(later.gone if later else ())
        due = self.plan.spec.evaluates_after(r)
        evaluation = self._evaluation(r + 1) if due else None
        waited = time.time() - members.decided_at > self.plan.spec.round_timeout_s
        if not waited and (set(members.contributions) - gone - set(made)  # a member still making its global
                           or (due and evaluation is None and members.evaluator not in gone)):
            return None
        return round_record(members, made, evaluation, self._started(r, members))

    def _globals(self, r: int, members: Members) -> dict[str, dict]:
        """What the members' commits of global ``r + 1`` say of the exchange that made it, for those found so far."""
        found = {}
        for cloud in sorted(members.contributions):
            try:
                commit = read_commit(self.stores[cloud], self.plan.keys.global_step(r + 1))
            except StoreError as exc:
                self.log(f"round {r}: cloud {cloud}'s global unreadable for now: {exc}")
                continue
            if commit is not None:
                found[cloud] = global_report(commit["meta"])
        return found

    def _evaluation(self, global_: int) -> float | None:
        try:
            return json.loads(self.home.get(self.plan.keys.evaluation(global_)))["eval_loss"]
        except ObjectNotFound:
            return None

    def _started(self, r: int, members: Members) -> float:
        if r > 0 and self.history:
            return self.history[-1]["published_at"]
        starts = [c["meta"].get("started_at") for c in members.contributions.values() if c["meta"].get("started_at")]
        return min(starts, default=members.decided_at)


def round_record(members: Members, made: dict[str, dict], eval_loss: float | None, started: float) -> dict:
    """A round's record in the run's history: who took part, what each cloud did, the digests of its global.

    ``made``: per cloud that made the round's global, its exchange's figures, digest and refusals.
    """
    digests = {c: m.get("digest") for c, m in made.items() if m.get("digest")}
    refused = next((m.get("refused", {}) for m in made.values() if "refused" in m), {})
    exchange = made
    return {
        "round": members.round,
        "wall_s": members.decided_at - started,
        "published_at": members.decided_at,
        "shares": members.shares,
        "clouds": {c: v["meta"] for c, v in sorted(members.contributions.items())},
        "lost": members.lost,  # clouds lost in this round, for the rest of the run
        "refused": refused,  # clouds whose contribution this round was refused
        "next_shares": members.next_shares,
        "caps": members.caps,
        "evaluator": members.evaluator,
        "eval_loss": eval_loss,
        "digests": digests,
        "digests_agree": len(set(digests.values())) <= 1,
        "sync_s": max((e.get("reduce_s", 0.0) + e.get("fetch_s", 0.0) for e in exchange.values()), default=0.0),
        "wan_bytes": sum(e.get("read_bytes", 0) for e in exchange.values()),
        "exchange": {c: {k: v for k, v in e.items() if k.endswith("_s") or k.endswith("_bytes")} for c, e in made.items()},
    }
