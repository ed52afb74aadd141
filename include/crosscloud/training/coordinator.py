"""The sync coordinator: one outer step per round, state kept in object storage.

For each round it waits for every cloud's committed pseudo-gradient, verifies
it, averages by the samples the plan gave each cloud, applies the outer
Nesterov step and publishes the new global checkpoint to every cloud's store
(the coordinator's own store first: that commit is what marks a round done).
A restarted coordinator resumes after the last round committed there, so no
round is applied twice, and first re-publishes that round to any cloud a crash
left without it.

Faults do not stop a run while one cloud still trains: a cloud whose sub-task
ended, or that has not committed a round long after the others (``PATIENCE`` x
the measured round time), is lost for the rest of the run; a refused
contribution (``screening``) is dropped from its round only. Either way the
round is averaged over the others by their samples, a lost or draining cloud's
share of the global batch goes to the others, and the record says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from crosscloud.backends import Backend, Handle, get_backend
from crosscloud.backends.base import PROGRAM_FAILED
from crosscloud.grid.demand_response import read_directives
from crosscloud.pool.ledger import Ledger
from crosscloud.pool.partition import apportion, rebalance_shares
from crosscloud.run.history import load_history, save_history
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectStore, StoreError
from crosscloud.store.commit import read_commit, read_object, write_step
from crosscloud.store.digest import IntegrityError
from crosscloud.store.tensors import from_bytes, to_bytes
from crosscloud.training.checkpoint import MOMENTUM, PARAMS, RESIDUAL, UPDATE, for_others, quantized_global
from crosscloud.training.compression import ErrorFeedback
from crosscloud.training.evaluation import Evaluator
from crosscloud.training.program import ProgramError
from crosscloud.training.outer import SYNCHRONOUS, OuterConfig, outer_step, round_config, weighted_mean
from crosscloud.training.screening import screen

POLL_S = 0.05
# a cloud is lost when it has not committed a round PATIENCE x the slowest of the last rounds after the
# round began while others have (never sooner than PATIENCE_FLOOR_S: a loaded machine's noise is not a loss)
PATIENCE, PATIENCE_FLOOR_S = 4.0, 5.0
# a sub-task started again after it died needs its start-up (interpreter, torch, program, resume) on top of that
RESTART_GRACE_S = 60.0


class SubTaskLost(RuntimeError):
    """A cloud's sub-task ended or went silent before committing its round."""


Restart = Callable[[str], Handle]


def outer_config(plan: Plan, round_: int) -> OuterConfig:
    """The outer step of a round: a single cluster's rounds adopt the average, as does a run's last round."""
    spec = plan.spec
    return SYNCHRONOUS if spec.mode == "single_cluster" else round_config(plan.outer, round_, spec.rounds)


def latest_global_round(store: ObjectStore, plan: Plan) -> int:
    """The newest round whose global checkpoint is committed in ``store`` (-1: none)."""
    rounds = {
        int(key.split("/")[-2])
        for key in store.list(f"{plan.keys.root}/global")
        if key.endswith("/COMMIT.json")
    }
    return max(rounds, default=-1)


def load_global(store: ObjectStore, plan: Plan, round_: int) -> tuple[dict, dict | None, dict]:
    """Params, outer momentum (None at round 0) and commit meta of a committed round."""
    commit = _global_commit(store, plan, round_)
    momentum = from_bytes(read_object(store, commit, MOMENTUM)) if MOMENTUM in commit["objects"] else None
    return from_bytes(read_object(store, commit, PARAMS)), momentum, commit["meta"]


def load_residual(store: ObjectStore, plan: Plan, round_: int) -> dict | None:
    """What int8 had dropped from the global updates up to a committed round (None: nothing yet)."""
    commit = _global_commit(store, plan, round_)
    return from_bytes(read_object(store, commit, RESIDUAL)) if RESIDUAL in commit["objects"] else None


def _global_commit(store: ObjectStore, plan: Plan, round_: int) -> dict:
    commit = read_commit(store, plan.keys.global_step(round_))
    if commit is None:
        raise IntegrityError(f"cloud {store.cloud}: global round {round_} of run {plan.run_id} is not committed")
    return commit


def publish_global(stores: dict[str, ObjectStore], home: str, plan: Plan, round_: int, objects: dict, meta: dict) -> dict[str, str]:
    """Write a global checkpoint to every cloud's store, the coordinator's own first; returns the clouds it could not reach.

    Own first: the worker in the coordinator's cloud folds the global in without
    waiting for the WAN copies, and a crash in between leaves a round that the
    restarted coordinator completes (``run`` re-publishes it where it is missing).
    Only the coordinator's store keeps the outer optimizer state: no other cloud
    needs it, so it never crosses a link; where the global has an int8 update,
    the other clouds get only that (``checkpoint.for_others``). A collaboration
    store still failing past its retry deadline loses that cloud, not the run;
    the own store's failure stops the run (nothing is committed without it).
    """
    unreachable = {}
    for name in sorted(stores, key=lambda n: n != home):
        shared = objects if name == home else for_others(objects)
        try:
            write_step(stores[name], plan.keys.global_step(round_), shared, meta=meta)
        except StoreError as exc:
            if name == home or isinstance(exc, IntegrityError):
                raise
            unreachable[name] = f"global round {round_} could not be published to its store: {exc}"
    return unreachable


def patience_s(history: list[dict], round_timeout_s: float) -> float:
    """How long a cloud may stay behind the others in a round before it counts as lost, from measured rounds."""
    walls = [r["wall_s"] for r in history[-3:]]
    if not walls:  # nothing measured yet: only the job's own limit
        return round_timeout_s
    return min(round_timeout_s, max(PATIENCE_FLOOR_S, PATIENCE * max(walls)))


class Coordinator:
    def __init__(
        self,
        plan: Plan,
        stores: dict[str, ObjectStore],
        handles: list[Handle],
        log: Callable[[str], None] = print,
        on_round: Callable[[dict], None] | None = None,
        restart: Restart | None = None,
    ):
        self.plan = plan
        self.stores = stores
        self.home = plan.coordinator_cloud
        self.handles = {h["cloud"]: h for h in handles}
        self.backends: dict[str, Backend] = {h["cloud"]: get_backend(h["backend"]) for h in handles}
        self.log_offsets = {c: 0 for c in self.handles}
        self.log = log
        self.on_round = on_round or (lambda record: None)
        self.ledger = Ledger()  # where a cloud is set to draining while the run trains
        # a sub-task that died is started again (by the caller's dispatch) this many times before its cloud is lost;
        # a backend that restarts its own (Kubernetes' backoffLimit) reports it running meanwhile
        self.restart = restart
        self.restarts_left = {c: plan.spec.subtask_retries if restart and not self.backends[c].restarts_itself else 0
                              for c in self.handles}
        self.restarted_at: dict[str, float] = {}

    def relay_logs(self) -> None:
        """Copy new sub-task output into the coordinator's log, so it reaches the task log."""
        for cloud, handle in self.handles.items():
            text, self.log_offsets[cloud] = self.backends[cloud].logs(handle, self.log_offsets[cloud])
            for line in text.splitlines():
                self.log(f"[{cloud}] {line}")

    def _ended(self, cloud: str) -> str | None:
        """Why the cloud's sub-task can no longer commit (it ended), or None while it runs or is not ours to watch.

        A program that failed stops the run (every cloud runs the same code); a sub-task that
        died otherwise is started again while it has restarts left, and resumes from its state.
        """
        handle = self.handles.get(cloud)
        if handle is None:
            return None
        backend = self.backends[cloud]
        state = backend.state(handle)
        if state == "running":
            return None
        self.relay_logs()
        code = backend.exit_code(handle)
        if code == PROGRAM_FAILED:
            raise ProgramError(f"program {self.plan.program.name if self.plan.program else '?'} failed on cloud {cloud} "
                               "(its traceback is in the log above); the run stops")
        if state != "succeeded" and self.restarts_left.get(cloud, 0) > 0:
            self.restarts_left[cloud] -= 1
            self.log(f"cloud {cloud}: sub-task {state} (exit code {code}); starting it again, it resumes from its last "
                     f"round ({self.restarts_left[cloud]} restart(s) left)")
            self.handles[cloud] = self.restart(cloud)  # its log goes on in the same file: the offset stays
            self.backends[cloud] = get_backend(self.handles[cloud]["backend"])  # nothing remembered of the dead one
            self.restarted_at[cloud] = time.monotonic()
            return None
        return f"sub-task is {state} before committing its round (see its log above)"

    def lose(self, clouds: dict[str, str], round_: int) -> None:
        """Stop each lost cloud's sub-task (a late commit would no longer be read) and say why."""
        for cloud, why in clouds.items():
            self.log(f"round {round_}: cloud {cloud} lost: {why}; the round goes on with the other clouds")
            if cloud in self.handles:
                self.backends[cloud].stop(self.handles[cloud])

    def wait_for_deltas(self, round_: int, clouds: list[str], patience: float) -> tuple[dict[str, dict], dict[str, str]]:
        """Commits of ``clouds`` for ``round_``, and the clouds lost on the way with why.

        A cloud is lost when its sub-task ends, or when others have committed and
        it has not within ``patience`` seconds; with no commit at all the round
        fails after the job's ``round_timeout_s``. A store that fails past its
        retry deadline is a slow cloud, not a crash.
        """
        keys, pending, commits, lost, failing = self.plan.keys, set(clouds), {}, {}, set()
        timeout, started = self.plan.spec.round_timeout_s, time.monotonic()
        while pending:
            for cloud in sorted(pending):
                try:
                    commit = read_commit(self.stores[cloud], keys.cloud_step(cloud, round_))
                except StoreError as exc:
                    if cloud not in failing:  # said once; the poll goes on
                        self.log(f"round {round_}: cloud {cloud}: {exc}; polling on")
                    failing.add(cloud)
                    commit = None
                if commit is not None:
                    commits[cloud] = commit
                elif (why := self._ended(cloud)) is not None:
                    lost[cloud] = why
                else:
                    continue
                pending.discard(cloud)
            waited = time.monotonic() - started
            late = {c for c in pending if self._late(c, started, patience)}
            if late and commits:
                lost.update({c: f"no pseudo-gradient for round {round_} {waited:.1f} s after the round began, "
                                f"while {sorted(commits)} committed (patience {patience:.1f} s from measured rounds)"
                             for c in late})
                pending -= late
            if not commits and not pending:
                raise SubTaskLost(f"round {round_}: every cloud is lost: {lost}")
            if pending:
                if waited > timeout:
                    raise SubTaskLost(f"round {round_}: no pseudo-gradient from {sorted(pending)} within {timeout:.0f} s"
                                      f"{self._silent(pending)}")
                self.relay_logs()
                time.sleep(POLL_S)
        return commits, lost

    def _late(self, cloud: str, started: float, patience: float) -> bool:
        """Whether a cloud is past its patience; one started again gets its start-up on top, from its restart."""
        since = max(started, self.restarted_at.get(cloud, started))
        grace = RESTART_GRACE_S if cloud in self.restarted_at and since > started else 0.0
        return time.monotonic() - since > patience + grace

    def _silent(self, clouds: set[str]) -> str:
        """What a stalled round's error adds when the program never called the SDK there."""
        keys = self.plan.keys
        silent = sorted(c for c in clouds if not self.stores[c].exists(keys.sdk_started(c)))
        if not silent:
            return ""
        name = self.plan.program.name if self.plan.program else "the program"
        return (f"; {name} never called crosscloud.sdk.init() on {silent}: a program trains through the SDK "
                "(cc.init(), cc.DiLoCo and diloco.step()), see docs/programs.md")

    def shares_of_round(self, round_: int, home: ObjectStore) -> dict[str, int]:
        """The shares of the global batch the clouds trained with in ``round_``.

        A worker takes new shares from the global checkpoint it continues from:
        global ``round_ - 1`` when rounds overlap, global ``round_`` when they do not.
        """
        source = round_ - 1 if self.plan.overlap else round_
        planned = {c.name: c.share for c in self.plan.clouds}
        if source < 0:
            return planned
        commit = read_commit(home, self.plan.keys.global_step(source))
        return (commit or {}).get("meta", {}).get("next_shares") or planned

    def draining(self) -> set[str]:
        """The run's clouds set to draining in the ledger (``crosscloud cloud drain``): they leave the run."""
        members = self.ledger.memberships()
        return {c.name for c in self.plan.clouds if members.get(c.name) and members[c.name].state == "draining"}

    def next_round(self, shares: dict[str, int], clouds: dict[str, dict], home: ObjectStore,
                   lost: frozenset[str] = frozenset()) -> dict:
        """Shares and power caps for the next round: measured speeds (``adapt_shares``), grid directives, departures.

        A cloud told to shift, draining or lost trains nothing (share 0: its
        devices idle) and its share goes to the run's other clouds by
        throughput; a throttled cloud runs under the cap, at the throughput the
        DVFS curve keeps. With no directive left, a cloud gets its planned share back.
        """
        spec, planned = self.plan.spec, {c.name: c.share for c in self.plan.clouds}
        directives = read_directives(home, self.plan.keys.root)
        away = {c for c, d in directives.items() if d["kind"] == "shift" and c in planned} | self.draining()
        if away and not set(planned) - away - lost:  # work cannot leave every cloud: the run keeps training
            self.log(f"grid directives and draining would move the work away from every cloud of the run; ignoring {sorted(away)}")
            away = set()
        away |= lost
        if away:
            keep = [c.name for c in self.plan.clouds if c.name not in away]
            nxt = {**dict(zip(keep, apportion(spec.global_batch, [self.plan.cloud(c).throughput for c in keep]))),
                   **{c: 0 for c in away}}
        elif spec.adapt_shares and all(n > 0 for n in shares.values()):
            nxt = rebalance_shares(shares, {c: clouds[c]["mean_step_s"] for c in shares}, spec.global_batch)
        else:
            nxt = planned
        caps = {c: {"cap": d["cap"], "throughput": d["throughput"]} for c, d in directives.items() if d["kind"] == "throttle"}
        # always explicit: a worker keeps the last shares it was given, so a restore must be said too
        return {"caps": caps, "next_shares": nxt}

    def run(self) -> list[dict]:
        plan, spec, home = self.plan, self.plan.spec, self.stores[self.home]
        torch.set_num_threads(1)  # the cores belong to the sub-tasks; one thread keeps the coordinator prompt
        start = latest_global_round(home, plan)
        if start < 0:
            raise IntegrityError(f"run {plan.run_id}: no global checkpoint 0; preheat must run before the coordinator")
        if start > 0:
            self.log(f"resuming run {plan.run_id} after committed round {start - 1}")
        params, momentum, meta = load_global(home, plan, start)
        feedback = ErrorFeedback() if plan.compression == "int8" else None
        if feedback:  # a restarted coordinator sends on what int8 had dropped before
            feedback.residual = load_residual(home, plan, start) or {}
        evaluate = Evaluator(plan, home, self.home)
        history = recover_history(home, plan, start, evaluate)
        lost = {c: why for record in history for c, why in record.get("lost", {}).items()}
        missing = {c: s for c, s in self.stores.items() if c not in lost and read_commit(s, plan.keys.global_step(start)) is None}
        if missing:  # re-publish a round a crash left half-published
            commit = _global_commit(home, plan, start)
            objects = {name: read_object(home, commit, name) for name in commit["objects"]}
            unreachable = publish_global(missing, self.home, plan, start, objects, meta)
            self.lose(unreachable, start)
            lost.update(unreachable)
        published_at = meta["published_at"]
        for r in range(start, spec.rounds):
            active = [c.name for c in plan.clouds if c.name not in lost]
            commits, gone = self.wait_for_deltas(r, active, patience_s(history, spec.round_timeout_s))
            self.lose(gone, r)
            t_sync = time.perf_counter()
            shares = self.shares_of_round(r, home)
            deltas, refused = screen(self.stores, commits, params, shares)
            for cloud, why in refused.items():
                self.log(f"round {r}: refused the contribution of cloud {cloud}: {why}; the round goes on without it")
            if not deltas:
                raise IntegrityError(f"round {r}: every contribution was refused: {refused}")
            new, momentum = outer_step(params, weighted_mean(deltas, {c: float(n) for c, n in shares.items()}), momentum, outer_config(plan, r))
            update = None
            if feedback:
                new, update = quantized_global(params, new, feedback)
            params = new
            lost.update(gone)
            now = time.time()
            record = {
                "round": r,
                "wall_s": now - published_at,
                "published_at": now,
                "shares": shares,
                "clouds": {c: _cloud_record(commits[c]["meta"]) for c in sorted(commits)},
                "lost": gone,  # clouds lost in this round, for the rest of the run
                "refused": refused,  # clouds whose contribution this round was refused
            }
            record.update(self.next_round(shares, record["clouds"], home, frozenset(lost)))
            unreachable = publish_global(self.stores, self.home, plan, r + 1, _global_objects(params, momentum, feedback, update),
                                         meta=record)
            self.lose(unreachable, r)
            record["lost"] = {**gone, **unreachable}
            lost.update(unreachable)
            record["sync_s"] = time.perf_counter() - t_sync
            published_at = now
            record["eval_loss"] = evaluate(params) if spec.evaluates_after(r) else None
            self.on_round(record)
            history.append(record)
            save_history(home, plan, history)
            self.relay_logs()
            loss = "" if record["eval_loss"] is None else f"eval loss {record['eval_loss']:.4f}, "
            self.log(f"round {r}: {loss}wall {record['wall_s']:.2f} s")
        self.relay_last_logs()
        return history

    def relay_last_logs(self, wait_s: float = 10.0) -> None:
        """Relay the sub-tasks' last output: they exit right after their last commit, and a remote
        host is asked for new output only every so often, so the last lines would otherwise be missed."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(self.backends[c].state(h) == "running" for c, h in self.handles.items()):
            time.sleep(POLL_S)
        self.relay_logs()


def _global_objects(params: dict, momentum: dict | None, feedback: ErrorFeedback | None, update: dict | None) -> dict[str, bytes]:
    objects = {PARAMS: to_bytes(params)}
    if update is not None:
        objects[UPDATE] = to_bytes(update)
    if momentum is not None:
        objects[MOMENTUM] = to_bytes(momentum)
    if feedback and feedback.residual:
        objects[RESIDUAL] = to_bytes(feedback.residual)
    return objects


def _cloud_record(meta: dict) -> dict:
    steps = meta["step_s"] or [0.0]  # a cloud whose work was shifted away trains no step
    return {
        "wait_s": meta["wait_s"],
        "download_s": meta["download_s"],
        "compute_s": meta["compute_s"],
        "upload_s": meta["upload_s"],
        "mean_step_s": sum(steps) / len(steps),
        "losses": meta["losses"],
        "step_s": meta["step_s"],
        "cap": meta.get("cap", 1.0),
        "started_at": meta.get("started_at"),
        "folded_at_step": meta.get("folded_at_step"),  # overlap: how many steps into the round the last global came
    }


def recover_history(home: ObjectStore, plan: Plan, start: int, evaluate: Callable[[dict], float]) -> list[dict]:
    """The records of rounds before ``start``, each exactly once.

    history.json is written after a round's global is committed, so a crash in
    between leaves the last record out of it; the record is in that global's
    commit (its meta), and its eval loss, where one is due, is measured again from its params.
    """
    history = load_history(home, plan)[:start]
    for r in range(len(history), start):
        params, _, record = load_global(home, plan, r + 1)
        history.append({**record, "sync_s": 0.0, "eval_loss": evaluate(params) if plan.spec.evaluates_after(r) else None})
    return history
