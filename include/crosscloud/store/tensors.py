"""Tensors cross clouds only as safetensors: never pickle, never code.

``from_bytes`` is the one way bytes from another cloud become tensors; the
safetensors format is a JSON header and raw buffers, so reading it runs nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _load
from safetensors.torch import save as _save


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


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


def header(layout: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> tuple[bytes, dict[str, int], int]:
    """The safetensors header of tensors laid out in sorted name order (8-byte length, JSON, padded to 8), each
    tensor's byte offset after it, and the bytes of them all: deterministic, so the same tensors make the same
    bytes everywhere."""
    entries, offsets, offset = {}, {}, 0
    for name in sorted(layout):
        dtype, shape = layout[name]
        nbytes = math.prod(shape) * dtype.itemsize
        entries[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offsets[name] = offset
        offset += nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw, offsets, offset


class TensorsReader(io.RawIOBase):
    """CPU tensors as a safetensors file, read (and sought) from their own buffers: no copy of the whole is made.

    ``size`` and ``sha256`` are the file's; the tensors must not change while it is read.
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        head, _, _ = header({n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()})
        self._parts = [memoryview(head)] + [memoryview(_raw(tensors[n])) for n in sorted(tensors)]
        self.size, self._at = sum(len(p) for p in self._parts), 0
        digest = hashlib.sha256()
        for part in self._parts:
            digest.update(part)
        self.sha256 = digest.hexdigest()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self.size}[whence] + offset
        return self._at

    def readinto(self, buffer) -> int:
        out, done, at = memoryview(buffer).cast("B"), 0, 0
        for part in self._parts:
            if done == len(out):
                break
            if self._at < at + len(part):
                start = max(self._at - at, 0)
                n = min(len(part) - start, len(out) - done)
                out[done:done + n] = part[start:start + n]
                done += n
                self._at += n
            at += len(part)
        return done


def _raw(t: torch.Tensor):
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
