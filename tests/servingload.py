"""Client load for serving tests: threads sending completions through a router without pause, every answer kept."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from crosscloud.serving.server import CLOUD_HEADER


@dataclass
class Load:
    """Client threads sending completions through the router without pause; every answer recorded."""

    url: str
    clients: int = 3
    records: list[tuple[float, float, str, str]] = field(default_factory=list)  # start, end, cloud, error
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                start, cloud, error = time.monotonic(), "", ""
                try:
                    r = client.post(f"{self.url}/v1/completions", json={"prompt": "def ", "max_tokens": 4, "temperature": 0})
                    cloud = r.headers.get(CLOUD_HEADER, "")
                    if r.status_code != 200 or r.json()["usage"]["completion_tokens"] != 4:
                        error = f"HTTP {r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                self.records.append((start, time.monotonic(), cloud, error))

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def failures(self) -> list[tuple]:
        return [r for r in self.records if r[3]]

    def split(self, t0: float, t1: float) -> dict[str, int]:
        """Requests sent after ``t0`` and answered before ``t1``, by the cloud that answered."""
        counts: dict[str, int] = {}
        for start, end, cloud, _ in self.records:
            if start >= t0 and end <= t1:
                counts[cloud] = counts.get(cloud, 0) + 1
        return counts


def phase(load: Load, seconds: float) -> dict[str, int]:
    """Let the load run ``seconds`` under the weights just set; the split of that window."""
    t0 = time.monotonic()
    time.sleep(seconds)
    return load.split(t0, time.monotonic())
