"""DiLoCo over a team's own model and inner optimizer: ``crosscloud.sdk.DiLoCo``.

The program keeps its loop; it calls ``diloco.step(loss=...)`` after each inner
optimizer step. Every ``inner_steps`` steps the cloud's pseudo-gradient
(global - local, from fp32 parameters on any device) is committed to its own
store, int8 with error feedback where the plan says so, and the cloud's own
exchange (``exchange.cloud``) makes the next global from every cloud's, on
rank 0 beside training. The new global is folded in the moment it is ready
when rounds overlap, before the next round when they do not; the other ranks
receive it from rank 0. The record of each round sets the shares and power
caps that take effect at a later round's start; a round whose share is 0 is
committed empty without the loop's help.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import threading
import time
import traceback
from concurrent.futures import Future

import torch
import torch.distributed as dist

from crosscloud.core.federation import load_federation
from crosscloud.core.job import local_lr
from crosscloud.run import heartbeat
from crosscloud.store.commit import put_object, read_commit, write_step
from crosscloud.store.network import store_seen_from
from crosscloud.store.tensors import to_bytes
from crosscloud.training.checkpoint import PARAMS, global_params
from crosscloud.training.compression import ErrorFeedback
from crosscloud.training.devices import peak_memory_gb
from crosscloud.training.exchange.cloud import CloudExchange, RoundResult, spool_folder, write_evaluation
from crosscloud.training.exchange.members import read_watch
from crosscloud.training.exchange.tensorfile import TensorFile
from crosscloud.training.global0 import publish_global0
from crosscloud.training.program import ProgramError, load_program, local_file
from crosscloud.training.resume import CloudState, Snapshot, StateWriter, snapshot
from crosscloud.training.rounds import DelayedGlobal, RoundWork, round_line, throttle, wait_for_commit
from crosscloud.training.session import Run, load_params, parameters, rank_batch
from crosscloud.training.stopped import Paused, Stopped
from crosscloud.training.time_limit import Overrun, time_limit

LEASE_READ_S = 5.0  # a round boundary reads the run's lease heartbeat at most this often (one small GET)


def _fp32(params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in params.items()}


def _beside(fn, *args) -> Future:
    """Run ``fn`` in a daemon thread: a sub-task that stops (or fails) mid-exchange exits without waiting for it."""
    future: Future = Future()

    def target() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the training thread, which raises it where it waits
                future.set_exception(exc)

    threading.Thread(target=target, name="exchange", daemon=True).start()
    return future


def exchange_for(run: Run) -> CloudExchange:
    """Rank 0's exchange: every run cloud's store as this cloud reaches it, and its spool folder."""
    fed = load_federation(os.environ.get("CROSSCLOUD_FEDERATION") or run.plan.federation_path)
    stores = {name: run.store if name == run.cloud else store_seen_from(fed, name, run.cloud, run.tenant)
              for name in run.plan.store_clouds}
    return CloudExchange(run.plan, run.cloud, stores, spool_folder(run.plan, run.cloud), run.device)


class DiLoCo:
    """Rounds of ``inner_steps`` steps of the user's optimizer, exchanged through the clouds' stores.

    Use as a context manager around the training loop; ``done`` turns true once the
    run's last round is committed and its global folded in, and the loop stops there.
    """

    def __init__(self, run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.run, self.model, self.opt = run, model, optimizer
        self.params = parameters(model)  # the tensors rounds exchange, looked up once
        self.plan, self.spec, self.keys = run.plan, run.plan.spec, run.plan.keys
        self.feedback = ErrorFeedback() if self.plan.compression == "int8" else None
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.round, self.steps, self.done = 0, 0, False
        self.share = self.plan.cloud(run.cloud).share
        self.cap = {"cap": 1.0, "throughput": 1.0}
        self.known: DelayedGlobal
        self.base: dict[str, torch.Tensor] = {}
        self.ready = {"wait_s": 0.0, "download_s": 0.0}
        self.exchange = exchange_for(run) if run.rank == 0 else None
        self.states = StateWriter(run.store, self.keys, run.cloud) if run.rank == 0 else None
        self.inflight: Future | None = None
        self.made: RoundResult | None = None  # the last exchange's result, reported with the next round's commit
        self.restored: dict = {}  # after a restart: what the cloud's commit of its last global says of it
        self._evaluate = None
        self.eval_s = self.eval_cpu_s = 0.0  # the program's evaluate since the last commit: reported apart
        self._cpu = 0.0  # the process's CPU time at the last commit: what the rounds cost, whatever else ran
        self._lease_read_at = float("-inf")  # the run's lease heartbeat is read at most every LEASE_READ_S
        self.committed: threading.Event | None = None  # set once the last round handed over is committed here

    # -- the program's side --------------------------------------------------------
    def __enter__(self) -> DiLoCo:
        if not self.run.resumed:  # a program that does not resume still gets its model and optimizer back
            self.run.resume(self.model, self.opt)
        if self.run.state is None:
            self._start()
        else:
            self._restore(self.run.state)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """After each inner optimizer step: record it, fold in a global that is ready, end the round after H steps."""
        if self.done:
            return
        self.work.train_cpu_s += time.thread_time() - self._train_cpu  # the program's own step, on this thread
        seconds = time.perf_counter() - self._last
        throttle(seconds, self.cap["throughput"])
        self.work.step_s.append(time.perf_counter() - self._last)
        self.work.losses.append(loss.detach() if torch.is_tensor(loss) else (math.nan if loss is None else float(loss)))
        self.steps += 1
        if self.plan.overlap and self.known.pending() and self._ready():  # fold the global in the moment it is made
            tf = time.perf_counter()
            self._fold_in()
            self.work.folded_at = len(self.work.losses)
            self.work.fold_s += time.perf_counter() - tf
        if len(self.work.losses) == self.spec.inner_steps:
            self._end_round()
            self._skip_idle()
        self._last, self._train_cpu = time.perf_counter(), time.thread_time()

    # -- rounds ----------------------------------------------------------------------
    def _start(self) -> None:
        """Wait for global 0 (built by the builder cloud when the run has no given weights) and load it: every
        cloud starts from the same model (the home cloud evaluates it)."""
        t0 = time.perf_counter()
        if self.plan.init is None and self.exchange is not None:  # no given weights: the builder cloud builds them
            publish_global0(self.run, self.model, self.exchange.stores[self.plan.builder])
        commit = wait_for_commit(self.run.store, self.keys.global_step(0), self.keys.stop, self.spec.round_timeout_s)
        params = global_params(self.run.store, commit)
        load_params(self.model, params)
        self.known = DelayedGlobal(params, {}, mix=self.spec.fold_mix if self.plan.overlap else 0.0)
        if self.run.cloud == self.plan.builder:  # the home cloud, or the first cloud when the home trains no part
            self._evaluate_global(0)
        self.ready = {"wait_s": time.perf_counter() - t0, "download_s": 0.0}
        self._cpu = time.process_time()
        self._begin_round(0)
        self._skip_idle()

    def _restore(self, state: CloudState) -> None:
        """Go on after the saved round: commit it if the commit is missing, exchange it, then start the next one."""
        self.known = DelayedGlobal(state.known_params, {}, mix=self.spec.fold_mix if self.plan.overlap else 0.0)
        self.known.round, self.known.own, self.known.drift, self.known.metas = (
            state.known_round, state.own, state.drift, state.metas)
        self.round, self.steps, self.share = state.round, state.steps, state.share
        if self.feedback:
            self.feedback.residual = state.residual
        self.base = _fp32(self.params)
        self._cpu = time.process_time()
        if self.exchange:
            self.restored = self.exchange.restore(state.known_round)  # reported with the next commit, as if just made
        self._commit(state.round, state.own[state.round], RoundWork(started_at=time.time()), restored=True)
        self._after_round(state.round)
        self._skip_idle()

    def _skip_idle(self) -> None:
        """Commit the rounds whose share is 0 (the work moved away; the devices idle) without the loop."""
        while not self.done and self.share == 0:
            self._end_round()

    def _begin_round(self, r: int) -> None:
        """Round ``r`` starts: its base, this rank's batch and lr, and an empty record; idle rounds pass at once."""
        self.round = r
        self.base = _fp32(self.params)
        self.run.batch_size = rank_batch(self.share, self.run.rank, self.run.world_size)
        if self.spec.local_lr_scaling != "none":  # the lr follows this cloud's part of the global batch
            factor = local_lr(self.spec, self.share) / self.spec.inner_lr
            for group, lr in zip(self.opt.param_groups, self.base_lrs):
                group["lr"] = lr * factor
        self.work = RoundWork(started_at=time.time())
        self._t_round = self._last = time.perf_counter()
        self._train_cpu = time.thread_time()

    def _end_round(self) -> None:
        """Commit round ``self.round``'s pseudo-gradient (after saving the state a restart goes on from), start its exchange.

        Round r's exchange reduces from global r, so global r is folded in first
        (when rounds overlap it usually was, a few steps into the round).
        """
        work, r = self.work, self.round
        work.compute_s = time.perf_counter() - self._t_round - work.fold_s
        tw = time.perf_counter()
        while self.known.round < r:
            self._fold_in()
        self.ready["wait_s"] += time.perf_counter() - tw
        self.ready["download_s"] += work.fold_s
        params = {n: p.detach().float() for n, p in self.params.items()}  # no copy: the snapshot makes the state's
        progress = {n: (p - self.base[n]).cpu() for n, p in params.items()}
        self.known.record(r, progress)
        ts = time.perf_counter()
        snap = snapshot(self._state(r, params)) if self.run.rank == 0 else None  # written beside training
        work.state_s = time.perf_counter() - ts
        self._commit(r, progress, work, snap)
        self._after_round(r)

    def _known_object(self, global_: int) -> dict | None:
        """Global ``global_`` as this cloud's store holds it: the state names it instead of a copy."""
        commit = read_commit(self.run.store, self.keys.global_step(global_))
        return commit["objects"].get(PARAMS) if commit else None

    def _state(self, r: int, params: dict[str, torch.Tensor]) -> CloudState:
        return CloudState(
            round=r, steps=self.steps, params={n: t.cpu() for n, t in params.items()},
            optimizer=self.opt.state_dict(), known_round=self.known.round, known_params=self.known.params,
            own=dict(self.known.own), drift=self.known.drift, metas=self.known.metas,
            residual=dict(self.feedback.residual) if self.feedback else {}, share=self.share)

    def _commit(self, r: int, progress: dict[str, torch.Tensor], work: RoundWork, snap: Snapshot | None = None,
                restored: bool = False) -> None:
        """Rank 0 hands round ``r`` to its thread beside training: the state ``snap``, then the commit, then the exchange."""
        self.run.rounds_committed = r + 1  # every rank counts it: the program's end is checked on each
        if self.run.rank != 0:
            return
        delta = {n: -p for n, p in progress.items()}
        losses = [float(x) for x in (torch.stack(work.losses).tolist() if work.losses and torch.is_tensor(work.losses[0])
                                     else work.losses)]
        meta = {"round": r, "cloud": self.run.cloud, "samples": self.share * self.spec.inner_steps,
                "losses": losses, "step_s": work.step_s, "compute_s": work.compute_s, "folded_at_step": work.folded_at,
                "cap": self.cap["cap"], "started_at": work.started_at, "exchange": self._made(), **self.ready,
                "eval_s": self.eval_s, "eval_cpu_s": self.eval_cpu_s,  # inside the round's figures: the evaluations
                "cpu_s": time.process_time() - self._cpu,  # the process's, every thread, since the last round's end
                "train_cpu_s": work.train_cpu_s,  # of which the program's steps (between diloco.step calls)
                "peak_memory_gb": peak_memory_gb(self.run.device), "batch": self.run.batch_size,
                "upload_s": work.state_s}  # training's part of the round's writes: the state's snapshot
        self.eval_s = self.eval_cpu_s = 0.0
        self._cpu = time.process_time()
        held = [snap, delta]  # handed over: the thread lets go of each as soon as it is written
        self.committed = threading.Event()
        self.inflight = _beside(self._round_beside, r, held, meta, self.known.params, self.known.round, self.committed)
        line = (f"round {r}: trained before the restart, committed" if restored and self.share > 0 else
                round_line(r, losses, work, self.cap, self.ready, self.spec.inner_steps))
        print(line, flush=True)

    def _round_beside(self, r: int, held: list, meta: dict, known: dict[str, torch.Tensor],
                      known_round: int, committed: threading.Event) -> RoundResult:
        """Round ``r`` beside training: the state a restart goes on from, the round's commit, then its exchange.

        The state comes first, so a commit always has a state that goes on after it; it names
        global ``known_round``, whose copy (and momentum) the last exchange committed.
        """
        t = time.perf_counter()
        self.exchange.published()
        snap: Snapshot | None = held.pop(0)  # [snapshot, delta]: not held through the exchange
        if snap is not None:
            self.states.write(snap, self._known_object(known_round))
        del snap
        step, delta = self.keys.cloud_step(self.run.cloud, r), held.pop(0)
        name, payload = (("delta.int8.safetensors", self.feedback.compress(delta)) if self.feedback
                         else ("delta.safetensors", delta))
        data = to_bytes(payload) if read_commit(self.run.store, step) is None else None
        del delta, payload
        if data is not None:
            entry = put_object(self.run.store, f"{step}/{name}", data)
            self.exchange.hand_in(entry, data)  # the round reads this cloud's delta from here, not its store
            del data  # the exchange holds it until the round writes it to its spool
            write_step(self.run.store, step, {}, refs={name: entry},
                       meta={**meta, "commit_s": time.perf_counter() - t})  # writing state and delta, beside training
        committed.set()
        result = self.exchange.round(r, known)
        self.exchange.publish(result, wait=False)
        return result

    def _made(self) -> dict:
        """The figures of the last exchange, its digest and refusals: the watcher records them with its round."""
        made = self.made
        return self.restored if made is None else {**made.stats, "digest": made.digest, "refused": made.refused}

    def _after_round(self, r: int) -> None:
        if r >= self.spec.rounds - 1:  # the last global is folded in: the model the program ends with is the run's
            while self.known.round < r + 1:
                self._fold_in()
            if self.exchange:
                self.exchange.close()  # committed in the cloud's store before the sub-task may end
                self.run.store.put(self.keys.sdk_finished(self.run.cloud), json.dumps({  # the last round's tail
                    "cpu_s": time.process_time() - self._cpu, "eval_s": self.eval_s, "eval_cpu_s": self.eval_cpu_s,
                    "at": time.time()}).encode())
            self.done = True
            return
        self._next_round(r)

    def _next_round(self, r: int) -> None:
        """Take up the share and power cap round ``r + 1`` starts with; without overlap, fold global ``r + 1`` in first.

        overlap: round r + 1 needs no more than global r (this round's exchange runs while it
        computes and is folded in when it is ready); blocking: it starts from global r + 1.
        """
        t3 = time.perf_counter()
        if why := self._lease_lapsed():
            self._stop_lapsed(r, why)
        need = r if self.plan.overlap else r + 1
        while self.known.round < need:
            self._fold_in()
        meta = self.known.metas.get(need, {})
        if meta.get("pause") and (pause := self._pause_asked(meta["pause"])):
            self._pause(r, pause)
        self.share = meta.get("next_shares", {}).get(self.run.cloud, self.share)  # moved shares
        self.cap = meta.get("caps", {}).get(self.run.cloud, {"cap": 1.0, "throughput": 1.0})  # a grid request's cap
        self.ready = {"wait_s": time.perf_counter() - t3, "download_s": 0.0}
        self._begin_round(r + 1)

    def _pause_asked(self, pause: str) -> str:
        """``pause`` unless the run resumed from it already (a sub-task started again after it passes it); rank 0
        reads the watcher's notes, the other ranks take its answer."""
        if self.run.rank == 0:
            pause = "" if pause in read_watch(self.exchange.decider.home, self.plan).get("resumed", []) else pause
        if self.run.world_size > 1:
            box = [pause]
            dist.broadcast_object_list(box, 0)
            pause = box[0]
        return pause

    def _lease_lapsed(self) -> str:
        """Why this sub-task must stop, its run's lease lapsed past the grace (``run.heartbeat``), or ""; rank 0
        reads its cloud's heartbeat, the other ranks take its answer."""
        why = ""
        if self.run.rank == 0 and time.monotonic() - self._lease_read_at >= LEASE_READ_S:
            self._lease_read_at = time.monotonic()
            why = heartbeat.lapsed(self.run.store, self.keys)
        if self.run.world_size > 1:
            box = [why]
            dist.broadcast_object_list(box, 0)
            why = box[0]
        return why

    def _stop_lapsed(self, r: int, why: str) -> None:
        """The run's lease lapsed: stop once this cloud's commit of round ``r`` is written, without waiting for the
        round's global, which needs peers that stop too (or died with the runner); a sub-task started again goes on
        from the state saved with the round."""
        if self.committed is not None and not self.committed.wait(self.spec.round_timeout_s):
            why += f"; round {r}'s commit was not written within {self.spec.round_timeout_s:.0f} s"
        print(f"round {r}: committed; the sub-task stops here: {why}", flush=True)
        raise Stopped(f"run {self.plan.run_id}: {why}")

    def _pause(self, r: int, pause: str) -> None:
        """Stop after round ``r``: its global made and committed here first, so no committed round is lost; the
        state saved with round ``r`` is where a sub-task started again goes on."""
        while self.known.round < r + 1:
            self._fold_in()
        if self.exchange:
            self.exchange.close()
            home = self.exchange.decider.home
            home.put(self.keys.paused(self.run.cloud), json.dumps({"pause": pause, "round": r, "at": time.time()}).encode())
        print(f"round {r}: committed; the run pauses here ({pause}) and resumes from this round", flush=True)
        raise Paused(f"run {self.plan.run_id} paused after round {r}")

    def _ready(self) -> bool:
        """Whether the exchange in flight has made its global (rank 0 looks; every rank learns the answer)."""
        done = self.inflight is not None and self.inflight.done()
        if self.run.world_size > 1:
            flag = torch.tensor([done], dtype=torch.int32, device=self.run.device)
            dist.broadcast(flag, 0)
            done = bool(flag.item())
        return done

    def _exchanged(self) -> RoundResult:
        """The exchange in flight's result. One rank alone reads the lease while it waits: a round whose peers
        stopped for a lapsed lease never completes, and this cloud must stop within the grace too, not at the
        round's timeout (the soak's CI run found it training on for minutes)."""
        if self.run.world_size > 1:  # every rank reads the lease together, at round boundaries only
            return self.inflight.result()
        while True:
            try:
                return self.inflight.result(timeout=LEASE_READ_S)
            except concurrent.futures.TimeoutError:
                if why := self._lease_lapsed():
                    self._stop_lapsed(self.round, why)

    def _fold_in(self) -> None:
        """Wait for the exchange in flight and fold its global in, tensor by tensor: model and round base move by the correction.

        Rank 0 reads the new global from its file; the other ranks of the cloud receive each tensor from it.
        """
        result: RoundResult | None = self._exchanged() if self.inflight is not None else None
        meta = ({"next_shares": result.members.next_shares, "caps": result.members.caps, "pause": result.members.pause}
                if result else {})
        if self.run.world_size > 1:
            box = [meta]
            dist.broadcast_object_list(box, 0)
            meta = box[0]
        self.known.begin()
        file = TensorFile(result.params) if result else None
        try:
            with torch.no_grad():
                for name, p in sorted(self.params.items()):
                    new = file.read(name).view(p.shape) if file else torch.empty(p.shape, dtype=torch.float32)
                    if self.run.world_size > 1:
                        moved = new.to(self.run.device)
                        dist.broadcast(moved, 0)
                        new = moved.cpu()
                    fix = self.known.correct(name, new)
                    p.add_(fix.to(device=p.device, dtype=p.dtype))
                    self.base[name] += fix.to(self.base[name].device)
        finally:
            if file:
                file.close()
        self.known.end(meta)
        if result:
            self.inflight, self.made = None, result  # reported with the next round's commit, where the watcher reads it
            if result.members.evaluator == self.run.cloud and self.spec.evaluates_after(result.members.round):
                self._evaluate_global(self.known.round)

    def _evaluate_global(self, global_: int) -> None:
        """The program's ``evaluate`` on the global just folded in, here, on the model's device, within the job's
        ``eval_timeout_s``: the model holds the global for the call. An evaluation that raises or overruns is
        recorded as failed (its loss NaN, with why) and training goes on."""
        if self.run.rank != 0:
            return
        if self._evaluate is None:
            program = self.plan.program
            module = load_program(local_file(self.run.store, self.run.tenant, program.code, program.file), program.name)
            self._evaluate, self.run.eval_batches = module.evaluate, getattr(module, "EVAL_BATCHES", None)
        saved = {n: p.detach().clone() for n, p in self.params.items()}
        load_params(self.model, self.known.params)
        loss, error, t0, c0 = math.nan, "", time.perf_counter(), time.process_time()
        try:
            with torch.no_grad(), time_limit(self.spec.eval_timeout_s, f"evaluate of global {global_}"):
                loss = float(self._evaluate(self.model, self.run))
        except Overrun as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed evaluation is recorded; the run goes on
            error = f"evaluate of global {global_} raised {type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            self.eval_s += time.perf_counter() - t0
            self.eval_cpu_s += time.process_time() - c0
            load_params(self.model, saved)
        write_evaluation(self.exchange.decider.home, self.plan, global_, self.run.cloud, loss, error)
        print(f"global {global_}: " + (f"evaluation failed: {error}" if error else f"eval loss {loss:.4f}"), flush=True)


def check_finished(run: Run | None, program: str) -> None:
    """After the program returned: it must have committed every round of the run."""
    rounds = run.plan.spec.rounds if run else 0
    if run is None:
        raise ProgramError(f"program {program} returned without calling crosscloud.sdk.init()")
    if run.rounds_committed < rounds:
        raise ProgramError(f"program {program} returned after committing {run.rounds_committed} of {rounds} rounds "
                           f"on cloud {run.cloud}: its loop must call diloco.step() after every optimizer step and "
                           "stop only when diloco.done")
