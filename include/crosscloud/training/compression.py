"""Pseudo-gradient compression: int8 per row-block with error feedback.

Each tensor is cut into blocks of ``BLOCK`` values; each block is scaled to
int8 by its own max magnitude. What quantization drops is kept by the sender
(error feedback) and added to the next round's pseudo-gradient, so that over
rounds nothing is lost, only delayed.
"""

from __future__ import annotations

import torch

BLOCK = 256


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and one float32 scale per block of ``BLOCK`` values."""
    flat = t.detach().float().reshape(-1)
    pad = (-len(flat)) % BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, BLOCK)
    scale = blocks.abs().amax(dim=1) / 127.0
    q = torch.round(blocks / torch.where(scale > 0, scale, 1.0)[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, like: torch.Size, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n = 1
    for d in like:
        n *= d
    return (q.float() * scale[:, None]).reshape(-1)[:n].reshape(like).to(dtype)


def encode(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A safetensors-ready dict: ``<name>.q`` (int8) and ``<name>.scale`` per tensor."""
    out = {}
    for name, t in tensors.items():
        out[f"{name}.q"], out[f"{name}.scale"] = quantize(t)
    return out


def decode(encoded: dict[str, torch.Tensor], shapes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Back to float tensors shaped like ``shapes``; a missing or malformed entry raises ValueError."""
    out = {}
    for name, ref in shapes.items():
        q, scale = encoded.get(f"{name}.q"), encoded.get(f"{name}.scale")
        if q is None or scale is None or q.dtype != torch.int8 or q.dim() != 2 or q.shape[1] != BLOCK:
            raise ValueError(f"{name}: missing or malformed int8 encoding")
        if q.shape[0] * BLOCK < ref.numel() or scale.shape != (q.shape[0],):
            raise ValueError(f"{name}: encoding holds {q.numel()} values for a tensor of {ref.numel()}")
        out[name] = dequantize(q, scale, ref.shape, ref.dtype)
    return out


class ErrorFeedback:
    """The sender's memory of what quantization dropped, re-sent with the next update."""

    def __init__(self):
        self.residual: dict[str, torch.Tensor] = {}

    def compress(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        corrected = {n: t.float() + self.residual.get(n, 0.0) for n, t in tensors.items()}
        encoded = encode(corrected)
        sent = decode(encoded, corrected)
        self.residual = {n: corrected[n] - sent[n] for n in corrected}
        return encoded
