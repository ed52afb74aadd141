"""SIGTERM as an interrupt, so that a run stopped by ``timeout``, ``kill`` or a CI runner cleans up as Ctrl-C does.

Python ends on SIGTERM without unwinding: no ``finally`` runs, so a benchmark
or CLI run stopped that way would leave its sub-tasks training and its devices
reserved. Only a process that has not set its own handler gets this one (an
Airflow task's runner has its own).

An interrupt that lands inside a database transaction (``deferred``) waits
for its end: raised in the middle of SQLite's statement, it left the
transaction's lock held, and the release that cleanup runs next waited for
that lock until it gave up ("database is locked"), so the devices stayed
reserved until their lease ran out.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


_DEFERRABLE = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred() -> Iterator[None]:
    """Within the block, Ctrl-C and an interrupting SIGTERM wait: raised at its end, not in the middle of it.

    Only the main thread handles signals, so only there is anything deferred;
    a handler the process set itself (neither Python's Ctrl-C nor
    ``terminate_as_interrupt``'s) is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {s: h for s in _DEFERRABLE if (h := signal.getsignal(s)) in (signal.default_int_handler, _interrupt)}
    caught: list[int] = []
    for sig in held:
        signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if caught:
            raise KeyboardInterrupt(f"signal {caught[0]}")


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread (where nobody else handles it)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
