"""A global checkpoint's params: global 0 as the run's program built it, every later one as each cloud reduced it."""

from __future__ import annotations

import torch

from crosscloud.core.keys import PARAMS
from crosscloud.store.base import ObjectStore
from crosscloud.store.commit import read_object
from crosscloud.store.tensors import from_bytes

__all__ = ["PARAMS", "global_params"]


def global_params(store: ObjectStore, commit: dict) -> dict[str, torch.Tensor]:
    """The params of a committed global, whole: for global 0, which every cloud starts from."""
    return from_bytes(read_object(store, commit, PARAMS))
