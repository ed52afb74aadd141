"""The sync coordinator: one outer step per round, state kept in object storage.

For each round it waits for every cloud's committed pseudo-gradient, verifies
it, averages by the samples the plan gave each cloud, applies the outer
Nesterov step and publishes the new global checkpoint to every cloud's store
(the coordinator's own store first: that commit is what marks a round done).
A restarted coordinator resumes after the last round committed there, so no
round is applied twice, and first re-publishes that round to any cloud a crash
left without it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

from crosscloud.backends import Backend, Handle, get_backend
from crosscloud.commit import IntegrityError, read_commit, read_object, write_step
from crosscloud.compression import decode
from crosscloud.model import build_model, evaluate
from crosscloud.outer import SYNCHRONOUS, OuterConfig, outer_step, weighted_mean
from crosscloud.demand_response import read_directives
from crosscloud.partition import apportion, rebalance_shares
from crosscloud.plan import Plan
from crosscloud.artifacts import read_blob
from crosscloud.presets import ModelConfig
from crosscloud.storage import ObjectStore
from crosscloud.tensors import from_bytes, to_bytes

POLL_S = 0.05


class SubTaskLost(RuntimeError):
    """A cloud's sub-task ended or went silent before committing its round."""


def outer_config(plan: Plan) -> OuterConfig:
    return SYNCHRONOUS if plan.spec.mode == "single_cluster" else OuterConfig(**plan.outer)


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
    commit = read_commit(store, plan.keys.global_step(round_))
    if commit is None:
        raise IntegrityError(f"cloud {store.cloud}: global round {round_} of run {plan.run_id} is not committed")
    params = from_bytes(read_object(store, commit, "params.safetensors"))
    momentum = from_bytes(read_object(store, commit, "outer_state.safetensors")) if "outer_state.safetensors" in commit["objects"] else None
    return params, momentum, commit["meta"]


def publish_global(stores: dict[str, ObjectStore], home: str, plan: Plan, round_: int, objects: dict, meta: dict) -> None:
    """Write a global checkpoint to every cloud's store, the coordinator's own first.

    Own first: the worker in the coordinator's cloud folds the global in without
    waiting for the WAN copies, and a crash in between leaves a round that the
    restarted coordinator completes (``run`` re-publishes it where it is missing).
    Only the coordinator's store keeps the outer optimizer state: no other cloud
    needs it, so it never crosses a link.
    """
    for name in sorted(stores, key=lambda n: n != home):
        shared = objects if name == home else {k: v for k, v in objects.items() if k != "outer_state.safetensors"}
        write_step(stores[name], plan.keys.global_step(round_), shared, meta=meta)


def read_delta(store: ObjectStore, cloud: str, commit: dict, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A cloud's verified pseudo-gradient, decompressed; anything malformed is refused."""
    if "delta.int8.safetensors" in commit["objects"]:
        try:
            delta = decode(from_bytes(read_object(store, commit, "delta.int8.safetensors")), params)
        except ValueError as exc:
            raise IntegrityError(f"cloud {cloud}: {exc}") from None
    else:
        delta = from_bytes(read_object(store, commit, "delta.safetensors"))
    check_delta(cloud, delta, params)
    return delta


def check_delta(cloud: str, delta: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
    """A contribution must match the model exactly and be finite; anything else is refused."""
    if set(delta) != set(params):
        raise IntegrityError(f"cloud {cloud}: pseudo-gradient tensors {sorted(set(delta) ^ set(params))} do not match the model")
    for name, t in delta.items():
        if t.shape != params[name].shape or t.dtype != params[name].dtype:
            raise IntegrityError(f"cloud {cloud}: {name} is {tuple(t.shape)}/{t.dtype}, expected {tuple(params[name].shape)}/{params[name].dtype}")
        if not torch.isfinite(t).all():
            raise IntegrityError(f"cloud {cloud}: {name} holds NaN or Inf")


class Coordinator:
    def __init__(
        self,
        plan: Plan,
        stores: dict[str, ObjectStore],
        handles: list[Handle],
        log: Callable[[str], None] = print,
        on_round: Callable[[dict], None] | None = None,
    ):
        self.plan = plan
        self.stores = stores
        self.home = plan.coordinator_cloud
        self.handles = {h["cloud"]: h for h in handles}
        self.backends: dict[str, Backend] = {h["cloud"]: get_backend(h["backend"]) for h in handles}
        self.log_offsets = {c: 0 for c in self.handles}
        self.log = log
        self.on_round = on_round or (lambda record: None)

    def relay_logs(self) -> None:
        """Copy new sub-task output into the coordinator's log, so it reaches the task log."""
        for cloud, handle in self.handles.items():
            text, self.log_offsets[cloud] = self.backends[cloud].logs(handle, self.log_offsets[cloud])
            for line in text.splitlines():
                self.log(f"[{cloud}] {line}")

    def _check_alive(self, cloud: str) -> None:
        handle = self.handles.get(cloud)
        if handle is None:
            return
        state = self.backends[cloud].state(handle)
        if state != "running":
            self.relay_logs()
            raise SubTaskLost(f"cloud {cloud}: sub-task is {state} before committing its round (see its log above)")

    def wait_for_deltas(self, round_: int) -> dict[str, dict]:
        """Commits of every planned cloud for ``round_``."""
        keys, pending, commits = self.plan.keys, {c.name for c in self.plan.clouds}, {}
        deadline = time.monotonic() + self.plan.spec.round_timeout_s
        while pending:
            for cloud in sorted(pending):
                commit = read_commit(self.stores[cloud], keys.cloud_step(cloud, round_))
                if commit is not None:
                    commits[cloud] = commit
                    pending.discard(cloud)
                    continue
                self._check_alive(cloud)
            if pending:
                if time.monotonic() > deadline:
                    raise SubTaskLost(f"round {round_}: no pseudo-gradient from {sorted(pending)} within {self.plan.spec.round_timeout_s:.0f} s")
                self.relay_logs()
                time.sleep(POLL_S)
        return commits

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

    def next_round(self, shares: dict[str, int], clouds: dict[str, dict], home: ObjectStore) -> dict:
        """Shares and power caps for the next round: measured speeds (``adapt_shares``) and grid directives.

        A cloud told to shift trains nothing (share 0: its devices idle) and its
        share goes to the run's other clouds by throughput; a throttled cloud
        runs under the cap, at the throughput the DVFS curve keeps. With no
        directive left, a cloud gets its planned share back.
        """
        spec, planned = self.plan.spec, {c.name: c.share for c in self.plan.clouds}
        directives = read_directives(home, self.plan.keys.root)
        shifted = {c for c, d in directives.items() if d["kind"] == "shift" and c in planned}
        if shifted and len(shifted) == len(planned):  # work cannot leave every cloud: the run keeps training
            self.log(f"grid directives would shift the work away from every cloud of the run; ignoring {sorted(shifted)}")
            shifted = set()
        if shifted:
            keep = [c.name for c in self.plan.clouds if c.name not in shifted]
            nxt = {**dict(zip(keep, apportion(spec.global_batch, [self.plan.cloud(c).throughput for c in keep]))),
                   **{c: 0 for c in shifted}}
        elif spec.adapt_shares and all(n > 0 for n in shares.values()):
            nxt = rebalance_shares(shares, {c: clouds[c]["mean_step_s"] for c in shares}, spec.global_batch)
        else:
            nxt = planned
        caps = {c: {"cap": d["cap"], "throughput": d["throughput"]} for c, d in directives.items() if d["kind"] == "throttle"}
        # always explicit: a worker keeps the last shares it was given, so a restore must be said too
        return {"caps": caps, "next_shares": nxt}

    def run(self) -> list[dict]:
        plan, spec, home = self.plan, self.plan.spec, self.stores[self.home]
        cfg = outer_config(plan)
        torch.set_num_threads(1)  # the cores belong to the sub-tasks; one thread keeps the coordinator prompt
        start = latest_global_round(home, plan)
        if start < 0:
            raise IntegrityError(f"run {plan.run_id}: no global checkpoint 0; preheat must run before the coordinator")
        if start > 0:
            self.log(f"resuming run {plan.run_id} after committed round {start - 1}")
        params, momentum, meta = load_global(home, plan, start)
        missing = {c: s for c, s in self.stores.items() if read_commit(s, plan.keys.global_step(start)) is None}
        if missing:  # re-publish a round a crash left half-published
            publish_global(missing, self.home, plan, start, _global_objects(params, momentum), meta)
        published_at = meta["published_at"]
        model = build_model(ModelConfig(**plan.model), spec.seed)
        held_out = torch.frombuffer(bytearray(read_blob(home, plan.tenant, plan.held_out)), dtype=torch.uint8)
        history = load_history(home, plan)[:start]
        for r in range(start, spec.rounds):
            commits = self.wait_for_deltas(r)
            t_sync = time.perf_counter()
            deltas = {cloud: read_delta(self.stores[cloud], cloud, commit, params) for cloud, commit in commits.items()}
            shares = self.shares_of_round(r, home)
            params, momentum = outer_step(params, weighted_mean(deltas, {c: float(n) for c, n in shares.items()}), momentum, cfg)
            now = time.time()
            record = {
                "round": r,
                "wall_s": now - published_at,
                "published_at": now,
                "shares": shares,
                "clouds": {c: _cloud_record(commits[c]["meta"]) for c in sorted(commits)},
            }
            record.update(self.next_round(shares, record["clouds"], home))
            publish_global(self.stores, self.home, plan, r + 1, _global_objects(params, momentum), meta=record)
            record["sync_s"] = time.perf_counter() - t_sync
            published_at = now
            model.load_state_dict(params)
            record["eval_loss"] = evaluate(model, held_out)
            self.on_round(record)
            history.append(record)
            home.put(f"{plan.keys.root}/history.json", json.dumps(history).encode())
            self.relay_logs()
            self.log(f"round {r}: eval loss {record['eval_loss']:.4f}, wall {record['wall_s']:.2f} s")
        return history


def _global_objects(params: dict, momentum: dict | None) -> dict[str, bytes]:
    objects = {"params.safetensors": to_bytes(params)}
    if momentum is not None:
        objects["outer_state.safetensors"] = to_bytes(momentum)
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
    }


def load_history(store: ObjectStore, plan: Plan) -> list[dict]:
    key = f"{plan.keys.root}/history.json"
    return json.loads(store.get(key)) if store.exists(key) else []
