"""Tensors cross clouds only as safetensors: never pickle, never code.

``from_bytes`` is the one way bytes from another cloud become tensors; the
safetensors format is a JSON header and raw buffers, so reading it runs nothing.
"""

from __future__ import annotations

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _load
from safetensors.torch import save as _save


class PayloadError(ValueError):
    """Bytes that are not a safetensors file (a pickle, a ``torch.save`` archive...): refused unread."""


def to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    return _save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})


def from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    try:
        return _load(bytes(data))
    except SafetensorError as exc:
        raise PayloadError(
            f"refused a {len(data)}-byte payload that is not safetensors (starts {bytes(data[:8])!r}): "
            f"tensors cross clouds only as safetensors, never pickle: {exc}"
        ) from None
