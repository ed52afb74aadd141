"""The order in which a pass considers queued entries: priority, then the tenant's fair share, then age.

Fair share is usage against weight (Kueue's fair sharing, Slurm's fair-share
factor): a tenant's devices held divided by its weight in the federation
file. Of two backlogged tenants with equal weights, the one holding fewer
devices goes next, so over time each gets the device-hours its weight says,
whoever submits more. The share is updated as the pass starts entries, so one
pass that starts several does not give them all to one tenant. Ties go to the
older entry, then to the tenant and run id, so every host orders the same
queue the same way.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping

from crosscloud.scheduler.entry import Entry


def share(held: float, weight: float | None) -> float:
    """Devices held per unit of weight (a tenant without a weight weighs 1)."""
    return held / max(1.0 if weight is None else weight, 1e-9)


def rank(priority: int, tenant_share: float, submitted_at: float, tenant: str, run_id: str) -> tuple:
    """Where a waiting run stands: higher priority first, then the tenant with the smaller share, then the older."""
    return -priority, tenant_share, submitted_at, tenant, run_id


class FairOrder:
    """Entries one at a time in fair-share order; ``started`` tells it a tenant's share grew."""

    def __init__(self, entries: Iterable[Entry], held: Mapping[str, float], weights: Mapping[str, float]):
        self.weights = weights
        self.held = dict(held)
        self.lines: dict[str, list[Entry]] = {}
        for e in sorted(entries, key=lambda e: (-e.priority, e.submitted_at, e.run_id)):
            self.lines.setdefault(e.tenant, []).append(e)
        self.next = {t: 0 for t in self.lines}
        self.heap = [self._key(t) for t in self.lines]
        heapq.heapify(self.heap)

    def share(self, tenant: str) -> float:
        return share(self.held.get(tenant, 0.0), self.weights.get(tenant))

    def _key(self, tenant: str) -> tuple:
        head = self.lines[tenant][self.next[tenant]]
        return rank(head.priority, self.share(tenant), head.submitted_at, tenant, head.run_id)

    def __iter__(self) -> Iterator[Entry]:
        while self.heap:
            key = heapq.heappop(self.heap)
            tenant = key[3]
            entry = self.lines[tenant][self.next[tenant]]
            self.next[tenant] += 1
            if self.next[tenant] < len(self.lines[tenant]):  # its next entry waits in the heap meanwhile
                heapq.heappush(self.heap, self._key(tenant))
            yield entry

    def rest(self) -> list[Entry]:
        """The entries not yet given out, in order (cheap when one tenant is queued)."""
        if len(self.heap) == 1:
            tenant = self.heap.pop()[3]
            return self.lines[tenant][self.next[tenant]:]
        return list(self)

    def started(self, tenant: str, devices: float) -> None:
        """``tenant`` now holds ``devices`` more: its next entries rank by its new share."""
        self.held[tenant] = self.held.get(tenant, 0.0) + devices
        for i, key in enumerate(self.heap):
            if key[3] == tenant:
                self.heap[i] = self._key(tenant)
                heapq.heapify(self.heap)
                return


def ordered(entries: Iterable[Entry], held: Mapping[str, float], weights: Mapping[str, float]) -> list[Entry]:
    """``entries`` in the order a pass would consider them if none started: the queue's positions."""
    return list(FairOrder(entries, held, weights))
