"""A run's hold on its reservation: renewed while something still works for the run.

A reservation is a lease (``crosscloud.ledger``): a run whose worker died
without its teardown stops renewing, and the ledger gives its devices back
once the lease lapses. The watcher renews it on its polls; a long stage
(preheating a large model, the final evaluation) renews it from a thread for
as long as it runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from crosscloud.ledger import Ledger, lease_seconds


class Lease:
    """Renews the run's reservation at most every quarter lease; a ledger outage is logged, never fatal."""

    def __init__(self, tenant: str, run_id: str, ledger: Ledger | None = None, log: Callable[[str], None] = print,
                 beat: Callable[[float], None] | None = None):
        self.tenant, self.run_id, self.log, self.beat = tenant, run_id, log, beat  # beat(expiry): tell the clouds
        self._ledger = ledger
        self.every_s = lease_seconds() / 4
        self._renewed_at = float("-inf")
        self.lapsed = False
        self.released = False
        self._lock = threading.Lock()  # a renewal from the thread never runs after the run gave its devices back

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger()
        return self._ledger

    def release(self) -> int:
        """Give the run's devices back (training is over, a calibration run may need them); returns how many it
        held. Nothing renews the lease after, so no renewal mistakes the release for a lapse."""
        with self._lock:
            self.released = True
            return self.ledger.release(self.tenant, self.run_id)

    def renew(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._renewed_at < self.every_s:
            return
        with self._lock:
            if not self.released:
                self._renew()

    def _renew(self) -> None:
        try:
            held = self.ledger.renew(self.tenant, self.run_id)
        except Exception as exc:  # noqa: BLE001 - a ledger out of reach: renewed at the next poll, the lease outlasts a blip
            self.log(f"run {self.run_id}: the ledger cannot renew the reservation now ({exc})")
            return
        self._renewed_at = time.monotonic()
        if held and self.beat is not None:
            self.beat(time.time() + lease_seconds())
        if not held and not self.lapsed:
            self.lapsed = True
            self.log(f"run {self.run_id} holds no reservation any more (released, or its lease lapsed): "
                     "its devices may be given to another run")


@contextmanager
def held(tenant: str, run_id: str, log: Callable[[str], None] = print, ledger: Ledger | None = None) -> Iterator[Lease]:
    """Keep renewing the run's lease from a thread while the block runs, until it ends or ``Lease.release``."""
    lease, stop = Lease(tenant, run_id, ledger, log=log), threading.Event()

    def renew() -> None:
        while not stop.wait(min(lease.every_s, 30.0)):
            lease.renew(force=True)

    thread = threading.Thread(target=renew, name=f"lease-{run_id}", daemon=True)
    thread.start()
    try:
        yield lease
    finally:
        stop.set()
        thread.join(timeout=5)
