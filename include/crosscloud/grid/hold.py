"""A grid request holds its cloud's free devices in the ledger, so the queue starts no new work there while it lasts.

Throttling and shifting cut the draw of the runs on the cloud; a run the
queue started there meanwhile would add its draw back. So the request
reserves every free device of the cloud in the ledger the queue's pass
allocates from, under a holder no tenant can be named (``GRID``), with a
lease of the request's duration. The pass then sees the cloud full and says
so in its decisions (the devices are in use), waiting runs go elsewhere or
wait, and `crosscloud inventory` shows the hold. The devices come back when
the request is restored, or by themselves when the lease lapses, so a
restore that never ran holds nothing for ever.
"""

from __future__ import annotations

from crosscloud.core.federation import Federation
from crosscloud.ledger import Ledger

GRID = "@grid"  # not a valid tenant name: no tenant's run is ever taken for a grid hold


def is_grid(tenant: str) -> bool:
    return tenant == GRID


def hold_free(fed: Federation, cloud: str, duration_s: float, ledger: Ledger | None = None) -> int:
    """Reserve every free device of ``cloud`` for ``duration_s``; returns how many (a second request renews)."""
    capacity = fed.capacity()
    mine = {key: n for key, n in capacity.items() if key[0] == cloud}

    def free(usage):
        return [(c, a, n - usage.pool(c, a)) for (c, a), n in mine.items() if n - usage.pool(c, a) > 0]

    made = (ledger or Ledger()).admit(GRID, cloud, free, capacity, {cloud: sum(mine.values())},
                                      lease_s=max(duration_s, 1.0), holder="demand_response")
    return sum(r.devices for r in made)


def give_back(cloud: str, ledger: Ledger | None = None) -> int:
    """The request is over: the held devices go back to the queue; returns how many."""
    return (ledger or Ledger()).release(GRID, cloud, "grid request over")
