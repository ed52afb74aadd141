"""Airflow's ``[core] hostname_callable`` for the multi-host tests: each process says which "host" it stands for."""

from __future__ import annotations

import os
import socket


def host_name() -> str:
    return os.environ.get("CROSSCLOUD_TEST_HOST") or socket.getfqdn()
