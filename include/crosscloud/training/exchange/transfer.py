"""Moving a round's objects between a store and local files: concurrent ranged reads, streamed writes, polite polling."""

from __future__ import annotations

import hashlib
import os
import threading
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


def download(store: ObjectStore, entry: dict, path: Path, handed: bytes | None = None) -> None:
    """The committed object ``entry`` (key, size, sha256) of ``store`` into ``path``, verified.

    Parts are read concurrently into their place in the file; the file's sha256
    must match the commit's, else it is read again and finally refused.
    ``handed``: the object's very bytes, already in this process (see ``Download``).
    """
    Download(store, entry, path, handed).result()


class Download:
    """A download in flight (``download``'s work, in a thread), whose bytes can be read as they land.

    ``wait(end)`` blocks until the file's first ``end`` bytes are in (the parts
    land in any order; the prefix counts), so a reader can work through the
    file behind the download. The sha256 is hashed along that prefix, so the
    check at the end costs no second read. A read again after a mismatch
    rewrites the file: ``attempts`` tells a reader that worked on the first
    read that it must not trust what it read.

    ``handed``: the bytes this process committed as ``entry`` (a cloud's own
    delta, which ``put_object`` hashed as it wrote them): written to the file
    at once instead of read back from the store.
    """

    def __init__(self, store: ObjectStore, entry: dict, path: Path, handed: bytes | None = None):
        self.store, self.entry, self.path, self._handed = store, entry, path, handed
        self.size, self.attempts, self.seconds = int(entry["size"]), 0, 0.0  # seconds: until verified
        self._cond = threading.Condition()
        self._prefix, self._done, self._error = 0, False, None
        path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name=f"download {entry['key']}", daemon=True)
        self._thread.start()

    def wait(self, end: int) -> None:
        """Until the first ``end`` bytes are in the file; raises what the download failed with."""
        with self._cond:
            while self._prefix < min(end, self.size) and self._error is None and not self._done:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    def result(self) -> Path:
        """The verified file, once the download is done; raises ``IntegrityError`` after ``READS`` mismatches."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.path

    def _run(self) -> None:
        t = time.perf_counter()
        try:
            for attempt in range(READS):
                self.attempts = attempt + 1
                got = self._write_handed() if self._handed is not None else self._read_once()
                if got == self.entry["sha256"]:
                    break
                if attempt == READS - 1:
                    raise IntegrityError(f"cloud {self.store.cloud}: {self.entry['key']} does not match its commit "
                                         f"(sha256 {got[:12]} vs {self.entry['sha256'][:12]}, read {READS} times)")
        except BaseException as exc:  # handed to whoever waits
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._done, self.seconds = True, time.perf_counter() - t
            self._cond.notify_all()

    def _write_handed(self) -> str:
        """The handed bytes into the file, once; its sha256 is the entry's (a second try reads the store)."""
        data, self._handed = self._handed, None
        if len(data) != self.size:
            return ""
        with open(self.path, "wb") as fh:
            fh.write(data)
        with self._cond:
            self._prefix = self.size
            self._cond.notify_all()
        return self.entry["sha256"]

    def _read_once(self) -> str:
        """One read of every part (concurrent ranged reads), the sha256 hashed along the landed prefix."""
        size, key, parts = self.size, self.entry["key"], -(-self.size // PART)
        with self._cond:
            self._prefix = 0
        landed, h, hashed = set(), hashlib.sha256(), 0
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)

            def fetch(index: int) -> None:
                nonlocal hashed
                start = index * PART
                os.pwrite(fd, self.store.get_range(key, start, min(PART, size - start)), start)
                with self._cond:
                    landed.add(index)
                    while hashed < parts and hashed in landed:  # the prefix grows: hash it, in order, once
                        at = hashed * PART
                        h.update(os.pread(fd, min(PART, size - at), at))
                        hashed += 1
                    self._prefix = min(hashed * PART, size)
                    self._cond.notify_all()

            with ThreadPoolExecutor(WORKERS) as pool:
                list(pool.map(fetch, range(parts)))
        finally:
            os.close(fd)
        return h.hexdigest()


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
