"""Emulated WAN links: applied only where the federation says so, each with its own figures."""

from __future__ import annotations

import time

from federations import embedded

from crosscloud.store.network import EmulatedLink, LinkedStore, store_seen_from


def _fed(bandwidth: float):
    return embedded(lambda raw: raw["links"][1].update({"emulate": True, "bandwidth_mbps": bandwidth}))  # beijing <-> singapore


def test_only_emulated_links_wrap_the_store():
    fed = _fed(100)
    assert isinstance(store_seen_from(fed, "singapore", "beijing", "team-a"), LinkedStore)
    assert not isinstance(store_seen_from(fed, "shanghai", "beijing", "team-a"), LinkedStore)
    assert not isinstance(store_seen_from(fed, "beijing", "beijing", "team-a"), LinkedStore)


def test_each_link_keeps_its_own_bandwidth_and_counts_bytes():
    slow = store_seen_from(_fed(10), "singapore", "beijing", "team-a")
    fast = store_seen_from(_fed(1000), "singapore", "beijing", "team-a")
    assert slow.link is not fast.link
    assert slow.link.bytes_per_s == 10e6 / 8 and fast.link.bytes_per_s == 1000e6 / 8
    before = fast.link.bytes_sent
    fast.put("team-a/x", b"12345")
    assert fast.get("team-a/x") == b"12345"
    assert fast.link.bytes_sent - before == 10


def test_transfers_sharing_a_link_queue_behind_each_other():
    link = EmulatedLink(bandwidth_mbps=8, latency_ms=0)  # 1 MB/s
    start = time.monotonic()
    link.transfer(1000)
    link.transfer(1000)
    # the link's schedule holds both transfers back to back: 2 x 1 ms of bytes
    assert link._busy_until >= start + 0.002
    assert link.bytes_sent == 2000
