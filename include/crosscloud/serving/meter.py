"""What one replica served lately: tokens per second and latency percentiles over a sliding window.

A replica measures itself so that an operator (``crosscloud serve status``, the
Airflow page) and the grid-request check see served traffic, not the plan's
intent: the power model turns a cloud's measured tokens per second into watts.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

WINDOW_S = 60.0
RECENT_S = 10.0  # the grid check's window: draw before and after a cut are compared over the same span


class Meter:
    """Completed requests of the last ``window_s`` seconds, and totals since start; safe across threads."""

    def __init__(self, window_s: float = WINDOW_S, clock=time.monotonic):
        self.window_s, self.clock = window_s, clock
        self.started = clock()
        self.recent: deque[tuple[float, int, float]] = deque()  # (finished at, tokens, seconds)
        self.requests = self.tokens = 0
        self._lock = threading.Lock()

    def record(self, tokens: int, seconds: float) -> None:
        """One answered request: its prompt and completion tokens and its time in this replica."""
        with self._lock:
            self.recent.append((self.clock(), tokens, seconds))
            self.requests += 1
            self.tokens += tokens

    def snapshot(self) -> dict:
        """Tokens/s, p50 and p99 seconds over the window (over the time since start when that is shorter)."""
        now = self.clock()
        with self._lock:
            while self.recent and self.recent[0][0] < now - self.window_s:
                self.recent.popleft()
            rows = list(self.recent)
            totals = {"requests": self.requests, "tokens": self.tokens}
        span = max(min(self.window_s, now - self.started), 1e-9)
        recent = max(min(RECENT_S, now - self.started), 1e-9)
        seconds = np.array([r[2] for r in rows]) if rows else None
        return {**totals, "window_s": round(span, 3), "tokens_per_s": sum(r[1] for r in rows) / span,
                "recent_tokens_per_s": sum(r[1] for r in rows if r[0] >= now - RECENT_S) / recent,
                "p50_s": float(np.quantile(seconds, 0.5)) if rows else None,
                "p99_s": float(np.quantile(seconds, 0.99)) if rows else None}
