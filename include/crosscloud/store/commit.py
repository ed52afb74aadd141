"""The commit protocol: a step's objects are trusted only through its COMMIT.json.

Writers put every object of a step first and COMMIT.json last; the commit names
each object with its key, size and sha256. Readers verify all of them, so an
uncommitted, truncated or corrupted object is never used. A commit is written
once (a conditional write): repeating the same step with the same content is
harmless, which keeps task retries safe, and a committed step never changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from crosscloud.store.base import ObjectNotFound, ObjectStore
from crosscloud.store.chunks import BlobRef, iter_blob, read_blob
from crosscloud.store.digest import IntegrityError, sha256

if TYPE_CHECKING:  # torch only where tensors are written: the tasks that read commits never load it
    import torch

COMMIT = "COMMIT.json"
# reads of an object that does not match its commit, in all: bits flipped in transit come right on a
# second read, damage at rest does not, and either way a mismatching object is never returned
READS = 3


def put_object(store: ObjectStore, key: str, data: bytes) -> dict:
    """Write one object and return its commit entry."""
    store.put(key, data)
    return {"key": key, "size": len(data), "sha256": sha256(data)}


def put_tensors(store: ObjectStore, key: str, tensors: dict[str, torch.Tensor]) -> dict:
    """Write ``tensors`` as one safetensors object, streamed from their own buffers (never a copy of the whole);
    returns its commit entry."""
    from crosscloud.store.tensors import TensorsReader

    reader = TensorsReader(tensors)
    store.put_stream(key, reader)
    return {"key": key, "size": reader.size, "sha256": reader.sha256}


def write_step(
    store: ObjectStore,
    step: str,
    objects: dict[str, bytes],
    refs: dict[str, dict] | None = None,
    meta: dict | None = None,
) -> dict:
    """Write ``objects`` under ``step`` and then the commit that vouches for them.

    ``refs`` names objects already stored elsewhere in this store as
    ``{name: {"key", "size", "sha256"}}``, or a chunked artifact as
    ``{name: {"artifact": <manifest key>, "size", "sha256"}}``.
    """
    if (done := read_commit(store, step)) is not None:  # a committed step is never written again, not even its objects
        if done != _commit_of(step, objects, refs, meta):
            raise IntegrityError(f"cloud {store.cloud}: {step} is already committed with other content")
        return done
    entries = dict(refs or {})
    for name, data in objects.items():
        entries[name] = put_object(store, f"{step}/{name}", data)
    commit = {"objects": entries, "meta": meta or {}}
    raw = json.dumps(commit, sort_keys=True).encode()
    if not store.put_if_absent(f"{step}/{COMMIT}", raw) and store.get(f"{step}/{COMMIT}") != raw:
        # a commit is written once: a retry may repeat it, nothing may change it
        raise IntegrityError(f"cloud {store.cloud}: {step} is already committed with other content")
    return commit


def _commit_of(step: str, objects: dict[str, bytes], refs: dict[str, dict] | None, meta: dict | None) -> dict:
    """The commit ``write_step`` would write for these objects, computed without writing them."""
    entries = {**(refs or {}), **{n: {"key": f"{step}/{n}", "size": len(d), "sha256": sha256(d)} for n, d in objects.items()}}
    return json.loads(json.dumps({"objects": entries, "meta": meta or {}}, sort_keys=True))


def read_commit(store: ObjectStore, step: str) -> dict | None:
    """The step's commit, or None while it is not committed."""
    try:
        raw = store.get(f"{step}/{COMMIT}")
    except ObjectNotFound:
        return None
    try:
        commit = json.loads(raw)
        commit["objects"]
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"cloud {store.cloud}: unreadable commit {step}/{COMMIT}: {exc}") from None
    return commit


def read_object(store: ObjectStore, commit: dict, name: str, reads: int = READS) -> bytes:
    """Read one committed object and verify its size and sha256, reading it again (``reads`` in all) on a mismatch."""
    try:
        entry = commit["objects"][name]
    except KeyError:
        raise IntegrityError(f"cloud {store.cloud}: commit does not list {name!r}") from None
    for attempt in range(reads):
        try:
            return _read_verified(store, entry)
        except IntegrityError as exc:
            if attempt == reads - 1:
                raise IntegrityError(f"{exc} (read {reads} times)") from None


class ChunkReader:
    """An iterator of byte chunks read as a file (for ``put_stream``): a copy between stores in bounded memory."""

    def __init__(self, chunks: Iterable[bytes]):
        self.chunks, self.buffer = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buffer) < n:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buffer += chunk
        out, self.buffer = (self.buffer, b"") if n < 0 else (self.buffer[:n], self.buffer[n:])
        return out


def copy_object(source: ObjectStore, entry: dict, target: ObjectStore, key: str) -> dict:
    """Stream a committed object (checked on the way) from one store to another under ``key``; its new entry."""
    target.put_stream(key, ChunkReader(iter_object(source, entry)))
    return {"key": key, "size": entry["size"], "sha256": entry["sha256"]}


def iter_object(store: ObjectStore, entry: dict) -> Iterator[bytes]:
    """A committed object (an entry of a commit's ``objects``) as a stream of chunks, in bounded memory, checked
    against its size and sha256 at the end: a consumer keeps nothing of a stream that raises."""
    if "artifact" in entry:
        yield from iter_blob(store, entry["artifact"].split("/")[0], BlobRef(sha256=entry["sha256"], size=entry["size"]))
        return
    whole, size = hashlib.sha256(), 0
    for chunk in store.iter_chunks(entry["key"]):
        whole.update(chunk)
        size += len(chunk)
        yield chunk
    if size != entry["size"] or whole.hexdigest() != entry["sha256"]:
        raise IntegrityError(f"cloud {store.cloud}: {entry['key']} does not match its commit (size {size} vs "
                             f"{entry['size']}, sha256 {whole.hexdigest()[:12]} vs {entry['sha256'][:12]})")


def _read_verified(store: ObjectStore, entry: dict) -> bytes:
    if "artifact" in entry:  # read from the cloud's packs, every chunk verified on the way
        return read_blob(store, entry["artifact"].split("/")[0], BlobRef(sha256=entry["sha256"], size=entry["size"]))
    data = store.get(entry["key"])
    if len(data) != entry["size"] or sha256(data) != entry["sha256"]:
        raise IntegrityError(
            f"cloud {store.cloud}: {entry['key']} does not match its commit "
            f"(size {len(data)} vs {entry['size']}, sha256 {sha256(data)[:12]} vs {entry['sha256'][:12]})"
        )
    return data


def read_step(store: ObjectStore, step: str) -> tuple[dict, dict[str, bytes]] | None:
    """All objects of a committed step, verified; None while it is not committed."""
    commit = read_commit(store, step)
    if commit is None:
        return None
    return commit, {name: read_object(store, commit, name) for name in commit["objects"]}
