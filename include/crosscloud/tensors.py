"""Tensors cross clouds only as safetensors: never pickle, never code."""

from __future__ import annotations

import torch
from safetensors.torch import load as _load
from safetensors.torch import save as _save


def to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    return _save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})


def from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    return _load(data)
