"""safetensors files read and written one tensor fragment at a time, so no whole model is held in memory.

The format is an 8-byte header length, a JSON header (dtype, shape and byte
offsets of each tensor) and the raw buffers. Reading goes through ``os.pread``
rather than a memory map: mapped pages would count as the process's memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from crosscloud.store.tensors import DTYPES, header

HASH_QUEUE = 2  # fragments written but not yet hashed, at most
HASH_INLINE = 256 * 1024  # bytes: a fragment this small is hashed at once (handing it over costs more than hashing it)


class TensorFileError(ValueError):
    """A file that is not a well-formed safetensors file."""


class TensorFile:
    """Read access to the tensors of a local safetensors file, by element range."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        try:
            (n,) = struct.unpack("<Q", os.pread(self.fd, 8, 0))
            if n > min(size - 8, 100 << 20):
                raise TensorFileError(f"{self.path.name}: header of {n} bytes in a file of {size}")
            header = json.loads(os.pread(self.fd, n, 8))
        except (struct.error, ValueError) as exc:
            os.close(self.fd)
            raise TensorFileError(f"{self.path.name}: not safetensors: {exc}") from None
        header.pop("__metadata__", None)
        self.base, self.entries = 8 + n, {}
        for name, e in header.items():
            try:
                dtype, shape, (start, end) = DTYPES[e["dtype"]], tuple(int(d) for d in e["shape"]), e["data_offsets"]
            except (KeyError, TypeError, ValueError):
                os.close(self.fd)
                raise TensorFileError(f"{self.path.name}: malformed entry for {name!r}") from None
            numel = 1
            for d in shape:
                numel *= d
            if end - start != numel * dtype.itemsize or self.base + end > size or start < 0:
                os.close(self.fd)
                raise TensorFileError(f"{self.path.name}: {name!r} does not fit its byte range")
            self.entries[name] = (dtype, shape, start)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def dtype(self, name: str) -> torch.dtype:
        return self.entries[name][0]

    def end(self, name: str, stop: int) -> int:
        """The file offset just past element ``stop - 1`` of tensor ``name``: what a read up to ``stop`` needs."""
        dtype, _, offset = self.entries[name]
        return self.base + offset + stop * dtype.itemsize

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Elements ``start:stop`` of tensor ``name``, flattened (row-major)."""
        dtype, shape, offset = self.entries[name]
        numel = 1
        for d in shape:
            numel *= d
        stop = numel if stop is None else min(stop, numel)
        nbytes = max(stop - start, 0) * dtype.itemsize
        raw = torch.empty(nbytes, dtype=torch.uint8)  # read straight into the tensor: no bytes object to copy from
        view, at, got = memoryview(raw.numpy()), self.base + offset + start * dtype.itemsize, 0
        while got < nbytes:
            n = os.preadv(self.fd, [view[got:]], at + got)
            if n <= 0:
                raise TensorFileError(f"{self.path.name}: {name!r} is truncated")
            got += n
        return raw.view(dtype)


class TensorFileWriter:
    """Writes a safetensors file whose tensors (names, dtypes, shapes) are known up front, fragment by fragment.

    Tensors are laid out in sorted name order with a deterministic header, so two
    clouds writing the same values write the same bytes: the file's sha256 is the digest.
    Written in order (as the reduce writes), it is hashed on the way (``digest``),
    by a thread of its own, so the hashing overlaps the writer's next fragment
    (small fragments, a model's biases and norms, are hashed at once).
    ``reuse``: an existing file of the same layout is written over in place,
    not truncated: its pages are already the process's to write (on a machine
    where memory first touched is slow, a new file per round costs more than
    the reduce), and every byte of it is written again.
    """

    def __init__(self, path: str | os.PathLike, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                 reuse: bool = False):
        self.path = Path(path)
        head, offsets, size = header(layout)
        self.base, end = len(head), len(head) + size
        self.offsets = {n: (offsets[n], layout[n][0]) for n in offsets}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep = reuse and self.path.exists() and self.path.stat().st_size == end
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | (0 if keep else os.O_TRUNC), 0o600)
        os.pwrite(self.fd, head, 0)
        if not keep:
            os.ftruncate(self.fd, end)
        self._hash, self._hashed = hashlib.sha256(head), self.base  # bytes hashed so far, while writes come in order
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="sha256")  # in order: one worker, FIFO
        self._queued: list[Future] = []
        self.digest: str | None = None

    def write(self, name: str, start: int, values: torch.Tensor) -> None:
        """Write ``values`` (flat, the tensor's dtype) as elements ``start:`` of tensor ``name``."""
        offset, dtype = self.offsets[name]
        flat = values.detach().to(device="cpu", dtype=dtype).contiguous().view(torch.uint8)
        at, data = self.base + offset + start * dtype.itemsize, memoryview(flat.numpy())
        os.pwrite(self.fd, data, at)
        if self._hash is not None and at == self._hashed:
            while self._queued and self._queued[0].done():
                self._queued.pop(0).result()
            if len(data) <= HASH_INLINE and not self._queued:
                self._hash.update(data)
            else:
                self._queued.append(self._hashing.submit(self._hash.update, data))  # ``data`` keeps ``flat`` alive
            self._hashed += len(data)
            while len(self._queued) > HASH_QUEUE:  # a bounded few fragments wait for the hasher
                self._queued.pop(0).result()
        else:  # out of order: the digest is read back from the file by whoever needs it
            self._hash = None

    def close(self) -> Path:
        """Close the file; ``digest`` is its sha256 if it was written whole and in order."""
        self._hashing.shutdown(wait=True)
        for future in self._queued:
            future.result()
        end = os.fstat(self.fd).st_size
        os.close(self.fd)
        if self._hash is not None and self._hashed == end:
            self.digest = self._hash.hexdigest()
        return self.path


def fragments(numel: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` element ranges of at most ``size`` covering ``numel`` elements."""
    return [(s, min(s + size, numel)) for s in range(0, numel, size)] or [(0, 0)]
