"""A global checkpoint's objects, and the int8 form in which a new global crosses a WAN.

The coordinator's store holds every global in full (``PARAMS``), with its
int8 update from the global before (``UPDATE``) and the coordinator's own state.
Another cloud already holds the global before, so it gets only the update.
"""

from __future__ import annotations

import torch

from crosscloud.store.base import ObjectStore
from crosscloud.store.commit import read_object
from crosscloud.store.tensors import from_bytes
from crosscloud.training.compression import ErrorFeedback, decode

PARAMS, UPDATE = "params.safetensors", "update.int8.safetensors"
# the coordinator's own state, kept in its store only: the outer optimizer's momentum and what
# int8 dropped from the updates sent so far
MOMENTUM, RESIDUAL = "outer_state.safetensors", "update_residual.safetensors"


def for_others(objects: dict[str, bytes]) -> dict[str, bytes]:
    """What of a global's objects goes to the clouds other than the coordinator's."""
    if UPDATE in objects:
        return {UPDATE: objects[UPDATE]}
    return {k: v for k, v in objects.items() if k not in (MOMENTUM, RESIDUAL)}


def global_params(store: ObjectStore, commit: dict, previous: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The params of a committed global: in full, or as the int8 update of ``previous``, the global before it."""
    if PARAMS in commit["objects"]:
        return from_bytes(read_object(store, commit, PARAMS))
    update = decode(from_bytes(read_object(store, commit, UPDATE)), previous)
    return {n: previous[n] + update[n] for n in previous}


def quantized_global(params: dict[str, torch.Tensor], new: dict[str, torch.Tensor],
                     feedback: ErrorFeedback) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The next global as every cloud will hold it, and its int8 update from ``params`` (the one they hold).

    The other clouds already hold the previous global, so only what changed crosses the
    WAN, at a quarter of float32's bytes: the overlapped rounds fold the new global in
    sooner. Every cloud adds the same decoded update, so all hold the same global; what
    int8 dropped goes with the next round's update (error feedback).
    """
    update = feedback.compress({n: new[n] - params[n] for n in new})
    return {n: params[n] + d for n, d in decode(update, params).items()}, update
