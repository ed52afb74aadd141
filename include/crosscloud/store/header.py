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


def architecture(prefix: bytes) -> str:
    """The model's architecture as 16 hex digits: the same for any two files with the same tensor names, shapes
    and dtypes, whatever their values."""
    header = read_header(prefix)
    layout = sorted((name, t["dtype"], list(t["shape"])) for name, t in header.items())
    return hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]


def parameters(prefix: bytes) -> int:
    """How many numbers the file's tensors hold."""
    count = 0
    for t in read_header(prefix).values():
        n = 1
        for d in t["shape"]:
            n *= d
        count += n
    return count
