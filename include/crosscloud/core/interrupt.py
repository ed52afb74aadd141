"""SIGTERM as an interrupt, so that a run stopped by ``timeout``, ``kill`` or a CI runner cleans up as Ctrl-C does.

Python ends on SIGTERM without unwinding: no ``finally`` runs, so a benchmark
or CLI run stopped that way would leave its sub-tasks training and its devices
reserved. Only a process that has not set its own handler gets this one (an
Airflow task's runner has its own).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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
