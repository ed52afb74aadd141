"""The SSH Connections of docker-compose.yaml's cloud hosts, built from the federation and the keys cloud-keys made.

airflow-init writes them to a file and imports it (``airflow connections import --overwrite``), so they
live in Airflow's database: every worker, on this host or another, reaches the cloud hosts through
them with nothing to copy. The client key travels in the Connection (encrypted with the fernet key)
and each cloud host's key is pinned (``host_key``), so no known_hosts file is needed anywhere.

usage: python ssh_connections.py KEYS_FOLDER OUT_JSON     (the federation: $CROSSCLOUD_FEDERATION)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from crosscloud.core.federation import Federation, load_federation

CLIENT_KEY = "client_ed25519"  # the key every Airflow worker logs in with


def host_key_file(cloud: str) -> str:
    return f"host_{cloud}_ed25519"


def connections(fed: Federation, keys: Path) -> dict[str, dict]:
    """conn_id -> the Connection (Airflow's import format) of every ssh cloud; host, port and user from its access."""
    private_key = (keys / CLIENT_KEY).read_text()
    found = {}
    for cloud in (c for c in fed.clouds if c.access.method == "ssh"):
        key_type, key_data = (keys / f"{host_key_file(cloud.name)}.pub").read_text().split()[:2]  # no comment
        extra = {"private_key": private_key, "host_key": f"{key_type} {key_data}", "look_for_keys": "false"}
        found[cloud.access.connection_id] = {"conn_type": "ssh", "host": cloud.access.host, "port": cloud.access.port,
                                             "login": cloud.access.user, "extra": json.dumps(extra)}
    return found


if __name__ == "__main__":
    keys, out = sys.argv[1:3]
    Path(out).write_text(json.dumps(connections(load_federation(), Path(keys)), indent=2))
