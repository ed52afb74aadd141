"""Content-addressed preheating: each cloud holds what its sub-task reads before it starts.

Content lives at ``<tenant>/blobs/sha256/<digest>``; bytes a cloud already holds
are never sent again, and every copy is verified by its digest on arrival.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from crosscloud.commit import IntegrityError, sha256
from crosscloud.names import blob_key
from crosscloud.plan import BlobRef
from crosscloud.storage import ObjectStore, StoreError


@dataclass
class TransferReport:
    """What a preheat sent and what it found already there, per target cloud."""

    sent_bytes: dict[str, int] = field(default_factory=dict)
    skipped_bytes: dict[str, int] = field(default_factory=dict)
    sent_objects: int = 0
    skipped_objects: int = 0

    def add(self, cloud: str, size: int, sent: bool) -> None:
        bucket = self.sent_bytes if sent else self.skipped_bytes
        bucket[cloud] = bucket.get(cloud, 0) + size
        self.sent_bytes.setdefault(cloud, 0)
        self.skipped_bytes.setdefault(cloud, 0)
        if sent:
            self.sent_objects += 1
        else:
            self.skipped_objects += 1

    def to_dict(self) -> dict:
        return {
            "sent_bytes": self.sent_bytes,
            "skipped_bytes": self.skipped_bytes,
            "sent_objects": self.sent_objects,
            "skipped_objects": self.skipped_objects,
            "total_sent_bytes": sum(self.sent_bytes.values()),
            "total_skipped_bytes": sum(self.skipped_bytes.values()),
        }


def put_blob(store: ObjectStore, tenant: str, data: bytes) -> tuple[BlobRef, bool]:
    """Store ``data`` by its digest unless it is there already; returns (ref, written)."""
    ref = BlobRef.of(data)
    key = blob_key(tenant, ref.sha256)
    if store.exists(key):
        return ref, False
    store.put(key, data)
    return ref, True


def read_blob(store: ObjectStore, tenant: str, ref: BlobRef) -> bytes:
    """Read a blob and check it is the content its digest names."""
    data = store.get(blob_key(tenant, ref.sha256))
    if len(data) != ref.size or sha256(data) != ref.sha256:
        raise IntegrityError(f"cloud {store.cloud}: blob {ref.sha256[:12]} is corrupted (size {len(data)} of {ref.size})")
    return data


class _HashingReader:
    """A file-like view of a stream of chunks that hashes and counts what passes through."""

    def __init__(self, chunks):
        self._chunks, self._buf = iter(chunks), b""
        self.hash, self.size = hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf = self._buf + chunk if self._buf else chunk
        if n < 0 or n >= len(self._buf):
            out, self._buf = self._buf, b""
        else:
            view = memoryview(self._buf)
            out, self._buf = bytes(view[:n]), bytes(view[n:])
        self.hash.update(out)
        self.size += len(out)
        return out


def stream_copy(src: ObjectStore, dst: ObjectStore, key: str, ref: BlobRef, attempts: int = 5) -> None:
    """Stream one object from ``src`` to ``dst`` (never whole in memory), verified on arrival.

    A failed attempt starts again from the source; a copy whose digest does not
    match is deleted, never left for a reader.
    """
    for attempt in range(1, attempts + 1):
        reader = _HashingReader(src.iter_chunks(key))
        try:
            dst.put_stream(key, reader)
        except StoreError:
            if attempt == attempts:
                raise
            time.sleep(min(2.0**attempt, 10.0))
            continue
        if reader.size != ref.size or reader.hash.hexdigest() != ref.sha256:
            dst.delete(key)
            raise IntegrityError(
                f"cloud {src.cloud}: {key} is corrupted at the source (size {reader.size} of {ref.size}); not copied to {dst.cloud}"
            )
        return


def copy_blob(src: ObjectStore, dst: ObjectStore, tenant: str, ref: BlobRef, report: TransferReport) -> None:
    """Make ``dst`` hold the blob, sending it from ``src`` only if it is missing."""
    key = blob_key(tenant, ref.sha256)
    if dst.exists(key):
        report.add(dst.cloud, ref.size, sent=False)
        return
    stream_copy(src, dst, key, ref)
    report.add(dst.cloud, ref.size, sent=True)
