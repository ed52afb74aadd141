"""Which database holds the ledger: one SQLAlchemy URL, chosen once per Ledger.

In order: the path or URL a caller passes, ``$CROSSCLOUD_LEDGER_URL``, the URL
provider the Airflow plugin registers (the Connection ``crosscloud_ledger``),
and last the embedded SQLite file (``$CROSSCLOUD_LEDGER``, else
``state_dir()/ledger.sqlite``). A SQLite file lives on one host: when Airflow
runs tasks on several, each would get its own empty ledger and every run
would see every device free, so that is refused rather than guessed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from crosscloud.core.deployment import SingleHostOnly, executor, multi_host
from crosscloud.core.paths import state_dir

URL_ENV = "CROSSCLOUD_LEDGER_URL"
CONNECTION_ID = "crosscloud_ledger"
# Airflow's Connection URIs and libpq's say "postgres"; both mean PostgreSQL through psycopg2
DRIVERS = {"postgres": "postgresql+psycopg2", "postgresql": "postgresql+psycopg2"}

_provider: Callable[[], str | None] | None = None


class LedgerNotConfigured(SingleHostOnly):
    """A multi-host deployment whose ledger would be a file on each host."""


def set_url_provider(fn: Callable[[], str | None] | None) -> None:
    """Where the ledger's URL comes from when ``$CROSSCLOUD_LEDGER_URL`` is unset (the Airflow plugin); None forgets it."""
    global _provider
    _provider = fn


def sqlite_path() -> Path:
    """The embedded ledger's file: one host's, with LocalExecutor or ``airflow standalone``."""
    return Path(os.environ.get("CROSSCLOUD_LEDGER") or state_dir() / "ledger.sqlite")


def normalize(url: str | URL) -> URL:
    """A SQLAlchemy URL: ``postgres://`` and ``postgresql://`` go through psycopg2; Airflow's ``__extra__`` is dropped."""
    parsed = make_url(url)
    parsed = parsed.set(drivername=DRIVERS.get(parsed.drivername, parsed.drivername))
    return parsed.difference_update_query(["__extra__"])


def sqlite_url(path: str | os.PathLike) -> URL:
    return URL.create("sqlite", database=str(Path(path).expanduser().resolve()))


def _refuse_if_shared(url: URL) -> URL:
    if url.get_backend_name() == "sqlite" and multi_host():
        raise LedgerNotConfigured(
            f"the reservation ledger is a SQLite file ({url.database}) and Airflow runs tasks on several hosts "
            f"({executor()}): several hosts would each get their own empty ledger; set {URL_ENV} or the Airflow "
            f"Connection {CONNECTION_ID} to a PostgreSQL database")
    return url


def ledger_url(path_or_url: str | URL | os.PathLike | None = None) -> URL:
    """The ledger's URL; a plain path (str or PathLike) means a SQLite file there."""
    if path_or_url and not isinstance(path_or_url, URL) and "://" not in str(path_or_url):
        return _refuse_if_shared(sqlite_url(path_or_url))
    chosen = path_or_url or os.environ.get(URL_ENV) or (_provider() if _provider else None)
    return _refuse_if_shared(normalize(chosen) if chosen else sqlite_url(sqlite_path()))
