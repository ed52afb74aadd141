"""Moving a round's objects between a store and local files: concurrent ranged reads, streamed writes, polite polling."""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crosscloud.store.base import ObjectStore
from crosscloud.store.digest import IntegrityError

PART = 8 * 1024 * 1024
WORKERS = 4  # ranged reads in flight per download: WORKERS x PART bytes in memory at most
READS = 3  # a mismatching download is read again (bits flipped in transit), then refused
# polling a store while waiting: never more than MAX_RPS requests a second to one store; after PATIENT_S of
# waiting (longer than a round usually waits for the others) slower and slower, up to POLL_MAX_S
POLL_MIN_S, POLL_MAX_S, POLL_GROWTH, MAX_RPS, PATIENT_S = 0.5, 2.0, 1.25, 2.0, 10.0


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(PART):
            h.update(chunk)
    return h.hexdigest()


def download(store: ObjectStore, entry: dict, path: Path) -> None:
    """The committed object ``entry`` (key, size, sha256) of ``store`` into ``path``, verified.

    Parts are read concurrently into their place in the file; the file's sha256
    must match the commit's, else it is read again and finally refused.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    size, key = int(entry["size"]), entry["key"]
    for attempt in range(READS):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)

            def fetch(start: int) -> None:
                os.pwrite(fd, store.get_range(key, start, min(PART, size - start)), start)

            with ThreadPoolExecutor(WORKERS) as pool:
                list(pool.map(fetch, range(0, size, PART)))
        finally:
            os.close(fd)
        got = file_sha256(path)
        if got == entry["sha256"]:
            return
        if attempt == READS - 1:
            raise IntegrityError(f"cloud {store.cloud}: {key} does not match its commit "
                                 f"(sha256 {got[:12]} vs {entry['sha256'][:12]}, read {READS} times)")


def upload(store: ObjectStore, key: str, path: Path, digest: str | None = None) -> dict:
    """Write a local file as object ``key`` (multipart, streamed); returns its commit entry (``digest``: known already)."""
    digest = digest or file_sha256(path)
    with open(path, "rb") as fh:
        store.put_stream(key, fh)
    return {"key": key, "size": path.stat().st_size, "sha256": digest}


class Poll:
    """Waits between polls of a store: ``POLL_MIN_S`` for ``PATIENT_S``, then growing to ``POLL_MAX_S``."""

    def __init__(self, min_s: float = POLL_MIN_S, max_s: float = POLL_MAX_S):
        self.min_s, self.max_s, self.wait_s = min_s, max_s, min_s
        self.since = time.monotonic()

    def progress(self) -> None:
        self.wait_s, self.since = self.min_s, time.monotonic()

    def sleep(self, requests: int = 1) -> None:
        """Wait before the next poll, which makes at most ``requests`` requests to any one store."""
        time.sleep(max(self.wait_s, requests / MAX_RPS))
        if time.monotonic() - self.since > PATIENT_S:
            self.wait_s = min(self.max_s, self.wait_s * POLL_GROWTH)
