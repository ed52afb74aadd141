"""A cloud's own training state, written every round, so that a restarted sub-task loses nothing.

After training round r, rank 0 stores, before it commits the round's
pseudo-gradient: the model, the inner optimizer, the data position (inner steps
trained), the globals folded in so far and the round progress not yet folded,
and the error-feedback residual as it was before the round's delta was
compressed. A sub-task started again loads it, commits round r itself if the
commit is missing (compressing again from that residual gives the same bytes),
and goes on with round r + 1. Older states are deleted; only the last is kept.

Everything is safetensors and JSON, like every other object of the exchange:
the optimizer's state is flattened into both, never pickled. The newest
global folded in is not written again: the cloud's own store holds it already
(its commit of that global), and the state's commit names that object (a
``ref``, verified by its sha256 when read back). Retention keeps at least the
last two globals, so the global the newest state names outlives it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from crosscloud.core.keys import RunKeys
from crosscloud.store.base import ObjectStore
from crosscloud.store.commit import read_commit, read_object, write_step
from crosscloud.store.tensors import from_bytes, to_bytes

TENSORS, META, KNOWN = "state.safetensors", "state.json", "known.safetensors"


@dataclass
class CloudState:
    """Everything a cloud's sub-task needs to go on after round ``round``, as rank 0 held it."""

    round: int
    steps: int  # inner steps this rank trained: its data position
    params: dict[str, torch.Tensor]
    optimizer: dict  # the inner optimizer's state_dict
    known_round: int  # the newest global folded into the model
    known_params: dict[str, torch.Tensor]
    own: dict[int, dict[str, torch.Tensor]]  # rounds committed but not yet folded in
    drift: dict[str, torch.Tensor]
    metas: dict[int, dict]  # commit metas of the globals still needed (shares, caps)
    residual: dict[str, torch.Tensor] = field(default_factory=dict)  # error feedback before this round's delta
    share: int = 0


def _flatten_optimizer(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, plain = {}, {}
    for index, slots in state_dict["state"].items():
        for key, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"opt/{index}/{key}"] = value
            else:
                plain[f"{index}/{key}"] = value
    return tensors, {"scalars": plain, "param_groups": state_dict["param_groups"]}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("opt/"):
            _, index, key = name.split("/", 2)
            state.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split("/", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}/{n}": t for n, t in tensors.items()}


def _part(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {n[len(prefix) + 1:]: t for n, t in tensors.items() if n.startswith(prefix + "/")}


def _listed(store: ObjectStore, folder: str) -> list[str]:
    """Keys under ``folder`` (which ends in /): stores are listed by a prefix without the slash."""
    return [k for k in store.list(folder.rstrip("/")) if k.startswith(folder)]


def save_state(store: ObjectStore, keys: RunKeys, cloud: str, state: CloudState, known: dict | None = None) -> None:
    """Commit ``state`` as the cloud's newest, then delete the ones before it.

    ``known``: the committed object (key, size, sha256) in ``store`` that holds
    ``state.known_params`` byte for byte, named instead of written again.
    """
    opt_tensors, opt_meta = _flatten_optimizer(state.optimizer)
    tensors = {**_prefixed("params", state.params), **({} if known else _prefixed("known", state.known_params)),
               **_prefixed("drift", state.drift), **_prefixed("residual", state.residual), **opt_tensors,
               **{k: v for r, own in state.own.items() for k, v in _prefixed(f"own{r}", own).items()}}
    meta = {"round": state.round, "steps": state.steps, "known_round": state.known_round, "own": sorted(state.own),
            "metas": {str(r): m for r, m in state.metas.items()}, "share": state.share, "optimizer": opt_meta}
    step = keys.cloud_state(cloud, state.round)
    write_step(store, step, {TENSORS: to_bytes(tensors), META: json.dumps(meta, sort_keys=True).encode()},
               refs={KNOWN: known} if known else None)
    for key in _listed(store, f"{keys.root}/state/{cloud}/"):
        parts = key[len(f"{keys.root}/state/{cloud}/"):].split("/")
        if parts[0].isdigit() and int(parts[0]) < state.round:
            store.delete(key)


def latest_state(store: ObjectStore, keys: RunKeys, cloud: str) -> CloudState | None:
    """The cloud's newest committed state, or None when it has trained no round yet."""
    prefix = f"{keys.root}/state/{cloud}/"
    rounds = sorted({int(k[len(prefix):].split("/")[0]) for k in _listed(store, prefix)
                     if k.endswith("/COMMIT.json") and k[len(prefix):].split("/")[0].isdigit()}, reverse=True)
    for r in rounds:
        commit = read_commit(store, keys.cloud_state(cloud, r))
        if commit is None:
            continue
        tensors = from_bytes(read_object(store, commit, TENSORS))
        meta = json.loads(read_object(store, commit, META))
        return CloudState(
            round=meta["round"], steps=meta["steps"], params=_part(tensors, "params"),
            optimizer=_unflatten_optimizer(tensors, meta["optimizer"]), known_round=meta["known_round"],
            known_params=(from_bytes(read_object(store, commit, KNOWN)) if KNOWN in commit["objects"]
                          else _part(tensors, "known")), own={r: _part(tensors, f"own{r}") for r in meta["own"]},
            drift=_part(tensors, "drift"), metas={int(r): m for r, m in meta["metas"].items()},
            residual=_part(tensors, "residual"), share=meta["share"],
        )
    return None
