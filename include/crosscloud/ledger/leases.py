"""Leases: how long a reservation outlives its run's last sign of life, and who holds it.

A run renews its reservation while it works (the watcher, long stages); a
worker killed without its teardown stops renewing, and once the lease lapses
the ledger gives the devices back at the next admission (``Ledger.reap``).
"""

from __future__ import annotations

import os
import socket
import time

LEASE_ENV = "CROSSCLOUD_LEASE_S"
DEFAULT_LEASE_S = 600.0


def lease_seconds() -> float:
    """``$CROSSCLOUD_LEASE_S``, else 600: long enough for a stage between two renewals, short enough to reclaim."""
    raw = os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{LEASE_ENV}={raw!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"{LEASE_ENV}={raw!r}: a lease must last more than 0 seconds")
    return seconds


def default_holder() -> str:
    """This process, as host:pid: where to look when a lease lapses."""
    return f"{socket.gethostname()}:{os.getpid()}"


def lapse_reason(holder: str, expired_at: float) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expired_at))
    return f"lease lapsed (holder {holder or 'unknown'} stopped renewing at {when})"
