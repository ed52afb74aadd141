"""Content-addressed preheating: each cloud holds what its sub-task reads before it starts.

Content lives at ``<tenant>/blobs/sha256/<digest>``; bytes a cloud already holds
are never sent again, and every copy is verified by its digest on arrival.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crosscloud.commit import IntegrityError, sha256
from crosscloud.names import blob_key
from crosscloud.plan import BlobRef
from crosscloud.storage import ObjectStore


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


def copy_blob(src: ObjectStore, dst: ObjectStore, tenant: str, ref: BlobRef, report: TransferReport) -> None:
    """Make ``dst`` hold the blob, sending it from ``src`` only if it is missing or damaged."""
    key = blob_key(tenant, ref.sha256)
    if dst.exists(key):
        try:
            read_blob(dst, tenant, ref)
            report.add(dst.cloud, ref.size, sent=False)
            return
        except IntegrityError:
            dst.delete(key)  # a damaged copy is replaced, never trusted
    dst.put(key, read_blob(src, tenant, ref))
    report.add(dst.cloud, ref.size, sent=True)
