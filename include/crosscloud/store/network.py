"""The network between clouds, as the transfer layer sees it.

A federation link with ``emulate: true`` makes every transfer over it take the
time a real link of that bandwidth and round-trip latency would: one round trip
per request plus the bytes at the link's rate, the link shared by all transfers
of this process. Used by benchmarks and tests to put a WAN between local
"clouds"; a link without ``emulate`` costs nothing extra.
"""

from __future__ import annotations

import threading
import time

from crosscloud.core.federation import Federation
from crosscloud.store.base import CHUNK, ObjectStore
from crosscloud.store.open_store import open_store

_LINKS: dict[tuple, EmulatedLink] = {}


class EmulatedLink:
    def __init__(self, bandwidth_mbps: float, latency_ms: float):
        self.bytes_per_s = bandwidth_mbps * 1e6 / 8
        self.rtt_s = latency_ms / 1000
        self._lock = threading.Lock()
        self._busy_until = 0.0
        self.bytes_sent = 0

    def transfer(self, nbytes: int) -> None:
        """Block for as long as moving ``nbytes`` over this link takes, queueing behind others."""
        with self._lock:
            start = max(time.monotonic(), self._busy_until)
            self._busy_until = start + nbytes / self.bytes_per_s
            done = self._busy_until + self.rtt_s
            self.bytes_sent += nbytes
        time.sleep(max(0.0, done - time.monotonic()))


class _Metered:
    """A readable stream whose reads cost link time."""

    def __init__(self, stream, link: EmulatedLink):
        self.stream, self.link = stream, link

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.link.transfer(len(data))
        return data


class LinkedStore(ObjectStore):
    """Another cloud's store reached over an emulated link."""

    def __init__(self, inner: ObjectStore, link: EmulatedLink):
        self.inner, self.link, self.cloud, self.jurisdiction = inner, link, inner.cloud, inner.jurisdiction

    def __repr__(self) -> str:
        return f"LinkedStore({self.inner!r})"

    def put(self, key: str, data: bytes) -> None:
        self.link.transfer(len(data))
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        try:
            data = self.inner.get(key)
        except Exception:
            self.link.transfer(0)  # a miss still costs its round trip
            raise
        self.link.transfer(len(data))
        return data

    def put_stream(self, key: str, stream) -> None:
        self.inner.put_stream(key, _Metered(stream, self.link))

    def iter_chunks(self, key: str, chunk: int = CHUNK):
        for data in self.inner.iter_chunks(key, chunk):
            self.link.transfer(len(data))
            yield data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        data = self.inner.get_range(key, start, length)
        self.link.transfer(len(data))
        return data

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.link.transfer(len(data))
        return self.inner.put_if_absent(key, data)

    def exists(self, key: str) -> bool:
        self.link.transfer(0)
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        self.link.transfer(0)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.link.transfer(0)
        self.inner.delete(key)


DEFAULT_LINK_MBPS = 100.0  # clouds without a declared link are assumed this far apart


def network(fed: Federation):
    """Seconds to move ``nbytes`` from one cloud to another over the federation's declared links."""

    def seconds(src: str, dst: str, nbytes: int) -> float:
        if src == dst:
            return 0.0
        link = fed.link(src, dst)
        mbps, latency_ms = (link.bandwidth_mbps, link.latency_ms) if link else (DEFAULT_LINK_MBPS, 50.0)
        return nbytes * 8 / (mbps * 1e6) + latency_ms / 1000

    return seconds


def nearest_first(fed: Federation, dst: str, clouds: list[str]) -> list[str]:
    """``clouds`` ordered by how fast they reach ``dst``: where a transfer reads from first."""
    seconds = network(fed)
    return sorted(dict.fromkeys(clouds), key=lambda c: (seconds(c, dst, 1 << 30), c))


def store_seen_from(fed: Federation, cloud: str, site: str, tenant: str) -> ObjectStore:
    """``cloud``'s store, for ``tenant``, as a process running on ``site`` reaches it: over the link between them."""
    store = open_store(fed.cloud(cloud), tenant)
    link = fed.link(cloud, site) if cloud != site else None
    if link is None or not link.emulate:
        return store
    key = (*sorted((cloud, site)), link.bandwidth_mbps, link.latency_ms)  # one shared queue per link
    if key not in _LINKS:
        _LINKS[key] = EmulatedLink(link.bandwidth_mbps, link.latency_ms)
    return LinkedStore(store, _LINKS[key])


def wan_bytes() -> int:
    """Bytes this process has moved over emulated links so far."""
    return sum(link.bytes_sent for link in _LINKS.values())
