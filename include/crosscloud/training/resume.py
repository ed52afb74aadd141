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

The state's tensors are packed, one flat tensor per dtype, so a model of
thousands of small tensors costs a few copies and one header, and the pack is
the snapshot: training goes on while it is written (``StateWriter``, in the
round's exchange thread, before the round's commit).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch

from crosscloud.core.keys import RunKeys
from crosscloud.store.base import ObjectStore
from crosscloud.store.commit import put_tensors, read_commit, read_object, write_step
from crosscloud.store.tensors import from_bytes

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


def pack(tensors: dict[str, torch.Tensor], tag: str = "pack") -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    """``tensors`` copied into one flat CPU tensor per dtype (``<tag>/<dtype>``), and where each lies:
    ``{name: [pack, shape, offset]}``."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        groups.setdefault(f"{tag}/{str(t.dtype).removeprefix('torch.')}", []).append((name, t))
    packed, layout = {}, {}
    for key, items in groups.items():
        flats = [t.detach().reshape(-1).cpu() for _, t in items]
        packed[key] = torch.cat(flats) if len(flats) > 1 else flats[0].clone()
        offset = 0
        for (name, t), flat in zip(items, flats):
            layout[name] = [key, list(t.shape), offset]
            offset += flat.numel()
    return packed, layout


def unpack(packed: dict[str, torch.Tensor], layout: dict[str, list]) -> dict[str, torch.Tensor]:
    """The tensors ``pack`` packed, as views of its flat tensors."""
    out = {}
    for name, (key, shape, offset) in layout.items():
        n = math.prod(shape)
        out[name] = packed[key][offset:offset + n].view(shape)
    return out


@dataclass
class Snapshot:
    """A state packed for writing: a copy of everything, so training can change the model while it is written."""

    round: int
    packed: dict[str, torch.Tensor]
    meta: dict
    known: dict[str, torch.Tensor]  # the known global, not copied: a global's tensors are never changed in place


def snapshot(state: CloudState) -> Snapshot:
    """``state`` copied and packed, but for its known global, which the write names (or packs, where it cannot)."""
    opt_tensors, opt_meta = _flatten_optimizer(state.optimizer)
    tensors = {**_prefixed("params", state.params), **_prefixed("drift", state.drift),
               **_prefixed("residual", state.residual), **opt_tensors,
               **{k: v for r, own in state.own.items() for k, v in _prefixed(f"own{r}", own).items()}}
    packed, layout = pack(tensors)
    meta = {"round": state.round, "steps": state.steps, "known_round": state.known_round, "own": sorted(state.own),
            "metas": {str(r): m for r, m in state.metas.items()}, "share": state.share, "optimizer": opt_meta,
            "layout": layout}
    return Snapshot(state.round, packed, meta, state.known_params)


class StateWriter:
    """Writes a cloud's states, each the newest, and deletes the one before it.

    The first write lists what earlier sub-tasks left; later ones delete the
    previous state by its keys, so a round costs no listing of the store.
    """

    def __init__(self, store: ObjectStore, keys: RunKeys, cloud: str):
        self.store, self.keys, self.cloud = store, keys, cloud
        self.folder = f"{keys.root}/state/{cloud}/"
        self.before: list[str] | None = None  # the keys of the last state written, once one is

    def write(self, snap: Snapshot, known: dict | None) -> None:
        """Commit ``snap``, naming ``known`` (the committed object in the store that holds its known global byte for
        byte; None: none does, the global is written too), then delete the states before it."""
        step = self.keys.cloud_state(self.cloud, snap.round)
        commit = read_commit(self.store, step)
        if commit is None:  # a state is written once: a committed one is never overwritten, not even its objects
            packed, meta = snap.packed, snap.meta
            if known is None:
                more, layout = pack(_prefixed("known", snap.known), tag="known")
                packed, meta = {**packed, **more}, {**meta, "layout": {**meta["layout"], **layout}}
            refs = {TENSORS: put_tensors(self.store, f"{step}/{TENSORS}", packed), **({KNOWN: known} if known else {})}
            commit = write_step(self.store, step, {META: json.dumps(meta, sort_keys=True).encode()}, refs=refs)
        older = self.before if self.before is not None else _listed(self.store, self.folder)
        for key in sorted(older, key=lambda k: not k.endswith("/COMMIT.json")):  # the commit first
            if 0 <= _round_of(key[len(self.folder):]) < snap.round:  # states only (sdk-started.json lies beside)
                self.store.delete(key)
        self.before = [e["key"] for n, e in commit["objects"].items() if n != KNOWN] + [f"{step}/COMMIT.json"]


def _round_of(rest: str) -> int:
    """The round of a key under a cloud's state folder; -1 for what is not a state's."""
    head = rest.split("/")[0]
    return int(head) if head.isdigit() else -1


def save_state(store: ObjectStore, keys: RunKeys, cloud: str, state: CloudState, known: dict | None = None) -> None:
    """Commit ``state`` as the cloud's newest at once (``StateWriter`` for a sub-task's rounds)."""
    StateWriter(store, keys, cloud).write(snapshot(state), known)


def latest_state(store: ObjectStore, keys: RunKeys, cloud: str) -> CloudState | None:
    """The cloud's newest committed state, or None when it has trained no round yet."""
    prefix = f"{keys.root}/state/{cloud}/"
    rounds = sorted({_round_of(k[len(prefix):]) for k in _listed(store, prefix) if k.endswith("/COMMIT.json")} - {-1},
                    reverse=True)
    for r in rounds:
        commit = read_commit(store, keys.cloud_state(cloud, r))
        if commit is None:
            continue
        tensors = from_bytes(read_object(store, commit, TENSORS))
        meta = json.loads(read_object(store, commit, META))
        tensors = unpack(tensors, meta["layout"])
        return CloudState(
            round=meta["round"], steps=meta["steps"], params=_part(tensors, "params"),
            optimizer=_unflatten_optimizer(tensors, meta["optimizer"]), known_round=meta["known_round"],
            known_params=(from_bytes(read_object(store, commit, KNOWN)) if KNOWN in commit["objects"]
                          else _part(tensors, "known")),
            own={r: _part(tensors, f"own{r}") for r in meta["own"]},
            drift=_part(tensors, "drift"), metas={int(r): m for r, m in meta["metas"].items()},
            residual=_part(tensors, "residual"), share=meta["share"],
        )
    return None
