"""The run's lease as its sub-tasks see it: renewed in the ledger, told to the clouds, obeyed past a grace."""

from __future__ import annotations

import json
import time

import pytest

from crosscloud.core.keys import RunKeys
from crosscloud.run import heartbeat
from crosscloud.run.lease import Lease
from crosscloud.store.base import LocalStore, StoreError

pytestmark = pytest.mark.faults

KEYS = RunKeys("team-a", "r1")


class _Down(LocalStore):
    def get(self, key):
        raise StoreError("503 for a minute")

    def put(self, key, data):
        raise StoreError("503 for a minute")


def test_a_sub_task_stops_only_once_its_lease_lapsed_past_the_grace(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "beijing", cloud="beijing")
    assert heartbeat.lapsed(store, KEYS) == ""  # a run started before there were heartbeats trains on
    monkeypatch.setenv("CROSSCLOUD_LEASE_GRACE_S", "30")
    assert heartbeat.write([store], KEYS, expires_at=1000.0) == []
    assert json.loads(store.get(KEYS.lease))["grace_s"] == 30.0
    assert heartbeat.lapsed(store, KEYS, now=999.0) == ""  # the lease holds
    assert heartbeat.lapsed(store, KEYS, now=1029.0) == ""  # lapsed, within the grace (clock skew, a slow renewal)
    why = heartbeat.lapsed(store, KEYS, now=1031.0)
    assert "lease lapsed 31 s ago (grace 30 s)" in why and "another run" in why
    # a store out of reach says nothing either way: the next round asks again
    down = _Down(tmp_path / "shanghai", cloud="shanghai")
    assert heartbeat.lapsed(down, KEYS, now=5000.0) == ""
    assert heartbeat.write([store, down], KEYS, expires_at=2000.0) == ["shanghai"]
    assert heartbeat.lapsed(store, KEYS, now=1031.0) == ""  # renewed


def test_each_renewal_of_a_held_lease_tells_the_clouds_and_a_lost_one_does_not(ledger, monkeypatch):
    monkeypatch.setenv("CROSSCLOUD_LEASE_S", "100")
    ledger.admit("team-a", "r1", lambda usage: [("beijing", "cpu", 1)], {("beijing", "cpu"): 4}, {"beijing": 4})
    beats = []
    lease = Lease("team-a", "r1", ledger, log=lambda m: None, beat=beats.append)
    before = time.time()
    lease.renew(force=True)
    assert len(beats) == 1 and before + 100 <= beats[0] <= time.time() + 100
    ledger.release("team-a", "r1")
    lease.renew(force=True)
    assert len(beats) == 1  # no reservation: nothing to tell the clouds, so their heartbeat runs out
