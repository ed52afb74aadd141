"""A time limit on a call made in a process's main thread: past it, the call is interrupted with ``Overrun``.

Evaluation runs where the model lives, in the training process; one that
hangs or is far slower than planned must not hold the run. The limit is a
real-time interval timer (SIGALRM), so it interrupts Python code and returns
between native operations; elsewhere than the main thread no signal can be
delivered, and the call runs unlimited (the caller is told).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Overrun(Exception):
    """The call ran past its time limit."""


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[bool]:
    """Run the body under a limit of ``seconds``; yields whether the limit is enforced (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield False
        return

    def expire(signum, frame):
        raise Overrun(f"{what} ran past its time limit of {seconds:g} s")

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
