"""The reservation ledger: SQLite on one host, PostgreSQL for a deployment of several (docs/pool.md).

``url`` says which database, ``engine`` how it is locked, ``schema`` and
``migrations`` what it holds, ``leases`` how long a reservation lives, and
``ledger`` the ``Ledger`` every caller uses.
"""

from crosscloud.ledger.leases import lease_seconds
from crosscloud.ledger.ledger import Ledger
from crosscloud.ledger.records import STATES, Event, Membership, Reservation, ReservationError, Usage
from crosscloud.ledger.url import LedgerNotConfigured, ledger_url, set_url_provider, sqlite_path

__all__ = ["STATES", "Event", "Ledger", "LedgerNotConfigured", "Membership", "Reservation", "ReservationError", "Usage",
           "lease_seconds", "ledger_url", "set_url_provider", "sqlite_path"]
