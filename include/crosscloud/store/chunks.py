"""Artifacts as manifests of content-addressed chunks, packed into larger objects per cloud.

An artifact (a model, a dataset shard, an image layer) is named by the sha256
of its whole content (``BlobRef``) and stored in a cloud as a manifest listing
its chunks. Chunk boundaries are content-defined (FastCDC, about 64 KiB, the
``fastcdc`` package), so an edit moves only the chunks around it; a
safetensors file is first cut at its tensors, so a tensor a fine-tune left
unchanged is recognised whole. Chunks a cloud lacks are appended to pack
objects, each with an index object written after it, so a cloud's index of
what it holds is the union of its pack indexes, and a chunk is stored once
per cloud whatever the number of artifacts sharing it.

Keys, per tenant: ``<tenant>/artifacts/<sha256>.json`` (manifest),
``<tenant>/packs/<sha256>`` and ``<tenant>/packs/<sha256>.idx``.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fastcdc import fastcdc
from pydantic import BaseModel, ConfigDict

from crosscloud.core.keys import manifest_key
from crosscloud.store.base import ObjectNotFound, ObjectStore

BLOB_TEXT = re.compile(r"[0-9a-f]{64}:[0-9]+")  # an artifact named by content, as ``BlobRef.text`` writes it
from crosscloud.store.digest import IntegrityError, sha256

MIN_CHUNK, AVG_CHUNK, MAX_CHUNK = 16 << 10, 64 << 10, 256 << 10
TENSOR_WHOLE = 4 << 20  # a tensor up to this size is one chunk; larger ones are cut inside
PACK_BYTES = 16 << 20
RANGE_BYTES = 4 << 20  # adjacent chunks of one pack are read together up to this size


class BlobRef(BaseModel):
    """An artifact by content: its sha256 and size, all a plan needs to name it anywhere."""

    model_config = ConfigDict(extra="forbid")
    sha256: str
    size: int

    @classmethod
    def of(cls, data: bytes) -> BlobRef:
        return cls(sha256=sha256(data), size=len(data))

    @property
    def text(self) -> str:
        """``sha256:size``: how a command line or a spec names the artifact."""
        return f"{self.sha256}:{self.size}"

    @classmethod
    def parse(cls, text: str) -> BlobRef:
        """The ref ``text`` (``sha256:size``) names."""
        sha, _, size = text.partition(":")
        return cls(sha256=sha, size=int(size))


@dataclass(frozen=True)
class Chunk:
    sha256: str
    size: int
    label: str = ""  # the tensor it belongs to, for safetensors


@dataclass
class Manifest:
    sha256: str
    size: int
    kind: str
    format: str
    chunks: list[Chunk]
    residency: str | None = None  # jurisdiction raw data may not leave: no transfer copies it out (preheat.fetch)

    @property
    def ref(self) -> BlobRef:
        return BlobRef(sha256=self.sha256, size=self.size)

    def to_json(self) -> bytes:
        residency = {"residency": self.residency} if self.residency else {}
        return json.dumps({"sha256": self.sha256, "size": self.size, "kind": self.kind, "format": self.format,
                           "chunks": [[c.sha256, c.size, c.label] for c in self.chunks], **residency}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        raw = json.loads(data)
        return cls(raw["sha256"], raw["size"], raw["kind"], raw["format"], [Chunk(*c) for c in raw["chunks"]],
                   raw.get("residency"))

    def unique(self) -> dict[str, int]:
        """Each distinct chunk once, with its size."""
        return {c.sha256: c.size for c in self.chunks}


def _cdc(data: memoryview, label: str = "") -> list[tuple[int, int, str]]:
    return [(c.offset, c.length, label) for c in fastcdc(data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)]


def _safetensors_spans(data: bytes) -> list[tuple[int, int, str]] | None:
    """(start, length, tensor) spans covering a safetensors file, or None if it is not one."""
    if len(data) < 8:
        return None
    (n,) = struct.unpack("<Q", data[:8])
    if not 2 <= n <= len(data) - 8 or data[8:9] != b"{":
        return None
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError:
        return None
    base, spans = 8 + n, [(0, 8 + n, "__header__")]
    tensors = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__")
    at = base
    for begin, end, name in tensors:
        if base + begin > at:  # padding between tensors
            spans.append((at, base + begin - at, ""))
        spans.append((base + begin, end - begin, name))
        at = base + end
    if at < len(data):
        spans.append((at, len(data) - at, ""))
    return spans


def chunk_spans(data: bytes) -> tuple[str, list[tuple[int, int, str]]]:
    """The format and (offset, length, label) of every chunk of ``data``."""
    view = memoryview(data)
    tensors = _safetensors_spans(data)
    if tensors is None:
        return "raw", _cdc(view) if data else []
    spans = []
    for start, length, label in tensors:
        if length <= TENSOR_WHOLE:
            spans.append((start, length, label))
        else:
            spans += [(start + off, n, label) for off, n, _ in _cdc(view[start : start + length])]
    return "safetensors", [s for s in spans if s[1] > 0]


class ChunkIndex:
    """What one cloud holds for one tenant: chunk digest -> (pack key, offset, size)."""

    def __init__(self, store: ObjectStore, tenant: str):
        self.store, self.tenant = store, tenant
        self.where: dict[str, tuple[str, int, int]] = {}
        for key in store.list(f"{tenant}/packs"):
            if key.endswith(".idx"):
                pack = key.removesuffix(".idx")
                for digest, (offset, size) in json.loads(store.get(key)).items():
                    self.where[digest] = (pack, offset, size)

    def __contains__(self, digest: str) -> bool:
        return digest in self.where

    def missing(self, chunks: dict[str, int]) -> dict[str, int]:
        return {d: n for d, n in chunks.items() if d not in self.where}


@dataclass
class PackWriter:
    """Collects chunks and writes them as packs: the pack first, its index after (the commit point)."""

    store: ObjectStore
    tenant: str
    index: ChunkIndex
    written: int = 0
    _buf: list[bytes | memoryview] = field(default_factory=list)
    _entries: dict[str, tuple[int, int]] = field(default_factory=dict)
    _size: int = 0

    def add(self, digest: str, data: bytes | memoryview) -> None:
        if digest in self.index or digest in self._entries:
            return
        self._entries[digest] = (self._size, len(data))
        self._buf.append(data)
        self._size += len(data)
        if self._size >= PACK_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._entries:
            return
        body = b"".join(self._buf)
        key = f"{self.tenant}/packs/{sha256(body)}"
        self.store.put(key, body)
        self.store.put(f"{key}.idx", json.dumps(self._entries).encode())
        for digest, (offset, size) in self._entries.items():
            self.index.where[digest] = (key, offset, size)
        self.written += len(body)
        self._buf, self._entries, self._size = [], {}, 0


def put_blob(store: ObjectStore, tenant: str, data: bytes, kind: str = "blob",
             index: ChunkIndex | None = None, residency: str | None = None) -> tuple[BlobRef, int]:
    """Store ``data`` as an artifact; returns its ref and the chunk bytes this cloud did not hold yet.

    Pass the cloud's ``index`` when storing several artifacts, so it is read once;
    ``residency`` labels raw data that may not leave that jurisdiction.
    """
    ref = BlobRef.of(data)
    if store.exists(manifest_key(tenant, ref.sha256)):
        return ref, 0
    fmt, spans = chunk_spans(data)
    view = memoryview(data)
    chunks = [Chunk(hashlib.sha256(view[o : o + n]).hexdigest(), n, label) for o, n, label in spans]
    writer = PackWriter(store, tenant, index if index is not None else ChunkIndex(store, tenant))
    for (o, n, _), c in zip(spans, chunks):
        writer.add(c.sha256, view[o : o + n])
    writer.flush()
    store.put(manifest_key(tenant, ref.sha256), Manifest(ref.sha256, ref.size, kind, fmt, chunks, residency).to_json())
    return ref, writer.written


WINDOW = max(64 << 10, MAX_CHUNK)  # what fastcdc reads to place one cut: a chunk whose window is whole is final


def cdc_stream(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Content-defined chunks of a stream, the same cuts as ``chunk_spans`` gives raw data read whole, holding at
    most a block and a window of it."""
    buffer = bytearray()
    for block in blocks:
        buffer += block
        taken = 0
        for c in fastcdc(memoryview(buffer), MIN_CHUNK, AVG_CHUNK, MAX_CHUNK):
            if c.offset + WINDOW > len(buffer):
                break
            yield bytes(buffer[c.offset : c.offset + c.length])
            taken = c.offset + c.length
        del buffer[:taken]
    if buffer:
        for c in fastcdc(memoryview(buffer), MIN_CHUNK, AVG_CHUNK, MAX_CHUNK):
            yield bytes(buffer[c.offset : c.offset + c.length])


def put_blob_stream(store: ObjectStore, tenant: str, blocks: Iterable[bytes], kind: str = "blob",
                    index: ChunkIndex | None = None, residency: str | None = None) -> tuple[BlobRef, int]:
    """``put_blob`` of raw data read as a stream (a store object, a file), in bounded memory: a dataset's files
    never pass through a task whole."""
    writer = PackWriter(store, tenant, index if index is not None else ChunkIndex(store, tenant))
    whole, size, chunks = hashlib.sha256(), 0, []
    for piece in cdc_stream(blocks):
        digest = hashlib.sha256(piece).hexdigest()
        chunks.append(Chunk(digest, len(piece)))
        writer.add(digest, piece)
        whole.update(piece)
        size += len(piece)
    writer.flush()
    ref = BlobRef(sha256=whole.hexdigest(), size=size)
    store.put(manifest_key(tenant, ref.sha256), Manifest(ref.sha256, size, kind, "raw", chunks, residency).to_json())
    return ref, writer.written


def load_manifest(store: ObjectStore, tenant: str, ref: BlobRef) -> Manifest:
    manifest = Manifest.from_json(store.get(manifest_key(tenant, ref.sha256)))
    if manifest.sha256 != ref.sha256 or manifest.size != ref.size or sum(c.size for c in manifest.chunks) != ref.size:
        raise IntegrityError(f"cloud {store.cloud}: manifest of {ref.sha256[:12]} describes other content")
    return manifest


def read_ranges(store: ObjectStore, index: ChunkIndex, digests: Iterable[str]) -> list[tuple[str, list[str]]]:
    """Group chunks into ranged reads: (pack key, digests in pack order), adjacent ones together."""
    located = sorted((index.where[d][0], index.where[d][1], index.where[d][2], d) for d in digests)
    groups: list[tuple[str, list[str]]] = []
    end = size = None
    for pack, offset, n, digest in located:
        if groups and groups[-1][0] == pack and offset == end and size + n <= RANGE_BYTES:
            groups[-1][1].append(digest)
            size += n
        else:
            groups.append((pack, [digest]))
            size = n
        end = offset + n
    return groups


def read_chunks(store: ObjectStore, index: ChunkIndex, pack: str, digests: list[str]) -> dict[str, memoryview]:
    """One ranged read of adjacent chunks, each verified by its digest (views into the one buffer read)."""
    start = index.where[digests[0]][1]
    length = sum(index.where[d][2] for d in digests)
    data = memoryview(store.get_range(pack, start, length))
    out, at = {}, 0
    for digest in digests:
        n = index.where[digest][2]
        piece = data[at : at + n]
        if len(piece) != n or hashlib.sha256(piece).hexdigest() != digest:
            raise IntegrityError(f"cloud {store.cloud}: chunk {digest[:12]} in {pack} is corrupted")
        out[digest] = piece
        at += n
    return out


def read_blob(store: ObjectStore, tenant: str, ref: BlobRef) -> bytes:
    """The artifact's bytes from this cloud's packs, every chunk and the whole checked against their digests."""
    manifest = load_manifest(store, tenant, ref)
    index = ChunkIndex(store, tenant)
    lacking = index.missing(manifest.unique())
    if lacking:
        raise ObjectNotFound(f"cloud {store.cloud}: {len(lacking)} chunk(s) of {ref.sha256[:12]} are not here")
    pieces: dict[str, memoryview] = {}
    for pack, digests in read_ranges(store, index, manifest.unique()):
        pieces.update(read_chunks(store, index, pack, digests))
    data = b"".join(pieces[c.sha256] for c in manifest.chunks)
    if len(data) != ref.size or sha256(data) != ref.sha256:
        raise IntegrityError(f"cloud {store.cloud}: artifact {ref.sha256[:12]} is corrupted (size {len(data)} of {ref.size})")
    return data


def iter_blob(store: ObjectStore, tenant: str, ref: BlobRef) -> Iterator[bytes]:
    """The artifact's bytes chunk by chunk, in bounded memory, each chunk checked as it is read and the whole at
    the end: a consumer keeps nothing of a stream that raises."""
    manifest = load_manifest(store, tenant, ref)
    index = ChunkIndex(store, tenant)
    if lacking := index.missing(manifest.unique()):
        raise ObjectNotFound(f"cloud {store.cloud}: {len(lacking)} chunk(s) of {ref.sha256[:12]} are not here")
    whole, size = hashlib.sha256(), 0
    for chunk in manifest.chunks:
        piece = read_chunks(store, index, index.where[chunk.sha256][0], [chunk.sha256])[chunk.sha256]
        whole.update(piece)
        size += len(piece)
        yield bytes(piece)
    if size != ref.size or whole.hexdigest() != ref.sha256:
        raise IntegrityError(f"cloud {store.cloud}: artifact {ref.sha256[:12]} is corrupted (size {size} of {ref.size})")


@dataclass(frozen=True)
class Warmth:
    """Is an artifact really there: what a task would read, present and (when verified) intact."""

    cloud: str
    sha256: str
    size: int
    missing_bytes: int
    corrupt_chunks: int = 0
    manifest: bool = True

    @property
    def warm(self) -> bool:
        return self.manifest and self.missing_bytes == 0 and self.corrupt_chunks == 0


def warmth(store: ObjectStore, tenant: str, ref: BlobRef, verify: bool = False, index: ChunkIndex | None = None) -> Warmth:
    """Check one artifact on one cloud; ``verify`` also reads and hashes every chunk."""
    try:
        manifest = load_manifest(store, tenant, ref)
    except (ObjectNotFound, IntegrityError):
        return Warmth(store.cloud, ref.sha256, ref.size, ref.size, manifest=False)
    index = index or ChunkIndex(store, tenant)
    chunks = manifest.unique()
    missing = index.missing(chunks)
    corrupt = 0
    if verify:
        for pack, digests in read_ranges(store, index, [d for d in chunks if d not in missing]):
            try:
                read_chunks(store, index, pack, digests)
            except (IntegrityError, ObjectNotFound):
                corrupt += sum(1 for d in digests if _chunk_bad(store, index, pack, d))
    return Warmth(store.cloud, ref.sha256, ref.size, sum(missing.values()), corrupt)


def _chunk_bad(store: ObjectStore, index: ChunkIndex, pack: str, digest: str) -> bool:
    try:
        read_chunks(store, index, pack, [digest])
        return False
    except (IntegrityError, ObjectNotFound):
        return True
