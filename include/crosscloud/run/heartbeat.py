"""The run's lease as its sub-tasks see it: a heartbeat object in each cloud's store.

The ledger gives a run's devices back once its lease lapses (a runner killed
without its teardown), but the sub-tasks run in the clouds, where the ledger
may be out of reach, and would train on while another run takes their
devices. So whoever renews the lease (the watcher, the dispatch of a
sub-task) also writes when it now expires to every cloud of the run
(``RunKeys.lease``), and each sub-task reads its own cloud's copy at every
round boundary: once the lease has lapsed for longer than the grace the
heartbeat names, it stops after committing the round. A device is then used
by two runs for at most the grace plus one round. A run without a heartbeat
(started before there was one) trains on as before.

The grace also absorbs clock skew between the control plane and the clouds.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable

from crosscloud.core.keys import RunKeys
from crosscloud.store.base import ObjectStore, StoreError

GRACE_S = 60.0


def grace_s() -> float:
    """Seconds a sub-task trains on past its lease's expiry ($CROSSCLOUD_LEASE_GRACE_S)."""
    return float(os.environ.get("CROSSCLOUD_LEASE_GRACE_S") or GRACE_S)


def write(stores: Iterable[ObjectStore], keys: RunKeys, expires_at: float) -> list[str]:
    """Tell every cloud when the run's lease now expires; the clouds whose store refused it (their sub-tasks go by the
    last heartbeat they have)."""
    body = json.dumps({"expires_at": expires_at, "grace_s": grace_s(), "written_at": time.time()}).encode()
    failed = []
    for store in stores:
        try:
            store.put(keys.lease, body)
        except StoreError:
            failed.append(store.cloud)
    return failed


def lapsed(store: ObjectStore, keys: RunKeys, now: float | None = None) -> str:
    """Why the run's sub-tasks on ``store``'s cloud must stop (its lease lapsed past the grace), or "" when they train
    on: the lease holds, no heartbeat was ever written, or the store cannot say now (the next round asks again)."""
    try:
        beat = json.loads(store.get(keys.lease))
    except (StoreError, ValueError):  # none written (ObjectNotFound), or the store out now
        return ""
    now = time.time() if now is None else now
    over = now - beat["expires_at"]
    if over <= beat["grace_s"]:
        return ""
    return (f"its lease lapsed {over:.0f} s ago (grace {beat['grace_s']:.0f} s) and nothing renewed it: the ledger "
            "may have given its devices to another run")
