"""The ledger on a real PostgreSQL server: one lock for admissions, migrations that take turns, forks, the Connection.

The behaviour every backend shares is tested in tests/unit/test_ledger.py
(``any_ledger``); these are PostgreSQL's own: several processes and hosts
reach one server.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from crosscloud.core import deployment
from crosscloud.ledger import Ledger, engine, migrate, url
from crosscloud.ledger.engine import LEDGER_LOCK
from crosscloud.ledger.schema import VERSION_TABLE

pytestmark = pytest.mark.multihost


def _fresh(postgres) -> str:
    return postgres.create_database(f"ledger_{uuid.uuid4().hex[:12]}")


def _open_and_admit(where: str, i: int, results) -> None:
    ledger = Ledger(where)
    ledger.admit("team-a", f"run-{i}", lambda usage: [("beijing", "cpu", 1)], {("beijing", "cpu"): 64}, {"beijing": 64})
    results.put(i)


def test_processes_opening_a_new_database_at_once_migrate_it_once(postgres, in_processes):
    where = _fresh(postgres)
    assert sorted(in_processes(_open_and_admit, [(where, i) for i in range(6)])) == list(range(6))
    with sa.create_engine(where).connect() as conn:
        assert conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").all() == [(migrate.head(),)]


def test_an_admission_waits_for_the_ledger_lock(postgres):
    """While another transaction holds the ledger's lock, an admission decides nothing; it goes on once it is free."""
    ledger, decided = Ledger(_fresh(postgres)), threading.Event()

    def decide(usage):
        decided.set()
        return [("beijing", "cpu", 1)]

    holder = sa.create_engine(ledger.url).connect()
    holder.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LEDGER_LOCK})")
    admitting = threading.Thread(target=ledger.admit, args=("team-a", "r", decide, {("beijing", "cpu"): 1}, {"beijing": 1}))
    admitting.start()
    time.sleep(0.5)
    assert not decided.is_set()
    holder.rollback()
    admitting.join(10)
    assert decided.is_set() and [r.run_id for r in ledger.active()] == ["r"]
    holder.close()


def test_a_connection_the_server_dropped_is_replaced_once_it_sat_idle(postgres, monkeypatch):
    """A server restart (here: every connection of the ledger's ends) costs no ledger call of a long-lived worker."""
    ledger = Ledger(_fresh(postgres))
    assert ledger.active() == []  # a pooled connection now
    with sa.create_engine(postgres.url()).connect() as admin:
        admin.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              f"WHERE datname = '{ledger.url.database}' AND pid <> pg_backend_pid()")
    monkeypatch.setattr(engine, "PING_AFTER_IDLE_S", 0.0)
    assert ledger.active() == []


def _in_child(ledger: Ledger, results) -> None:
    ledger.admit("team-b", "child", lambda usage: [("beijing", "cpu", 1)], {("beijing", "cpu"): 4}, {"beijing": 4})
    results.put(ledger.release("team-b", "child"))


def test_a_forked_child_uses_connections_of_its_own(postgres):
    """LocalExecutor and Celery fork: the child's engine must not talk over the parent's pooled connections."""
    ledger = Ledger(_fresh(postgres))
    ledger.admit("team-a", "parent", lambda usage: [("beijing", "cpu", 1)], {("beijing", "cpu"): 4}, {"beijing": 4})
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_in_child, args=(ledger, results))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and results.get(timeout=5) == 1
    assert [r.run_id for r in ledger.active()] == ["parent"]  # the parent's pooled connection still works
    assert ledger.release("team-a", "parent") == 1


def test_the_airflow_connection_names_the_ledger_of_a_multi_host_deployment(postgres, monkeypatch):
    from crosscloud_airflow.connections import ledger_url, use_airflow_connections

    where = _fresh(postgres)
    monkeypatch.delenv("CROSSCLOUD_LEDGER_URL", raising=False)
    monkeypatch.setattr(url, "_provider", None)
    monkeypatch.setattr(deployment, "_executor", None)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    assert ledger_url() is None
    conn = {"conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": postgres.user,
            "schema": where.rsplit("/", 1)[1]}
    monkeypatch.setenv("AIRFLOW_CONN_CROSSCLOUD_LEDGER", json.dumps(conn))
    use_airflow_connections()
    assert deployment.multi_host()
    ledger = Ledger()
    assert ledger.url.drivername == "postgresql+psycopg2" and ledger.url.port == postgres.port
    assert ledger.active() == []
