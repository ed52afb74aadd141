"""A safetensors file's header alone: its tensors' names, shapes and dtypes, read without torch or the data.

A model's architecture, as the registry compares it, is exactly that: two
models can continue each other only when every tensor has the same name,
shape and dtype. Its fingerprint reads the first bytes of a file, so it can be
taken of a store object or a registered version without loading the weights.
"""

from __future__ import annotations

import hashlib
import json
import struct

MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


class HeaderError(ValueError):
    """Bytes that do not start with a safetensors header."""


def header_size(prefix: bytes) -> int:
    """How many bytes from the start of the file hold its header (the 8-byte length included)."""
    if len(prefix) < 8:
        raise HeaderError(f"{len(prefix)} bytes: too short for a safetensors header")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER:
        raise HeaderError(f"a safetensors header of {n} bytes is over the format's limit: not a safetensors file")
    return 8 + n


def file_prefix(path) -> bytes:
    """The first bytes of a safetensors file on disk that hold its header: all ``architecture`` needs."""
    with open(path, "rb") as f:
        head = f.read(8)
        return head + f.read(header_size(head) - 8)


def read_header(prefix: bytes) -> dict[str, dict]:
    """Each tensor's ``dtype`` and ``shape`` from the first ``header_size`` bytes (or more) of a safetensors file."""
    end = header_size(prefix)
    if len(prefix) < end:
        raise HeaderError(f"{len(prefix)} bytes hold only part of a {end}-byte safetensors header")
    try:
        header = json.loads(prefix[8:end])
    except ValueError as exc:
        raise HeaderError(f"not a safetensors header: {exc}") from None
    return {k: v for k, v in header.items() if k != "__metadata__"}


Layout = list[tuple[str, str, list[int]]]  # (tensor name, safetensors dtype, shape) of every tensor


def layout(prefix: bytes) -> Layout:
    """The tensors a safetensors file holds, from its header."""
    return [(name, t["dtype"], list(t["shape"])) for name, t in read_header(prefix).items()]


def fingerprint(tensors: Layout) -> str:
    """An architecture as 16 hex digits: the same for any two models with the same tensor names, shapes and
    dtypes, whatever their values (a file's header, or a model built on the meta device)."""
    ordered = sorted((name, dtype, [int(d) for d in shape]) for name, dtype, shape in tensors)
    return hashlib.sha256(json.dumps(ordered).encode()).hexdigest()[:16]


def count(tensors: Layout) -> int:
    """How many numbers the tensors hold."""
    total = 0
    for _, _, shape in tensors:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total


def architecture(prefix: bytes) -> str:
    """The architecture of the model in a safetensors file (``fingerprint``), from its first bytes."""
    return fingerprint(layout(prefix))


def parameters(prefix: bytes) -> int:
    """How many numbers the file's tensors hold."""
    return count(layout(prefix))
