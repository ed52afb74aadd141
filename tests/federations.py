"""The embedded federation, optionally changed, for tests that need a variant of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, Federation, parse_federation


def embedded_raw(mutate: Callable[[dict], None] | None = None) -> dict:
    """The embedded federation file's raw YAML, after ``mutate`` edits it."""
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    if mutate:
        mutate(raw)
    return raw


def embedded(mutate: Callable[[dict], None] | None = None) -> Federation:
    """The embedded federation file, parsed after ``mutate`` edits its raw YAML."""
    return parse_federation(embedded_raw(mutate))


def embedded_file(path: Path, mutate: Callable[[dict], None] | None = None) -> Path:
    """The changed embedded federation written to ``path``, for stages that load a federation file."""
    path.write_text(yaml.safe_dump(embedded_raw(mutate)))
    return path


def multi_host_file(path: Path, hosts: Path, s3_servers: dict, ssh_server) -> tuple[Path, dict[str, str]]:
    """The embedded federation as a multi-host deployment reaches it, written to ``path``: every cloud behind ssh
    (``ssh_server``, a workdir under ``hosts``) with its store on ``s3_servers[cloud]``; the Connections it names,
    as ``AIRFLOW_CONN_*`` environment variables."""
    import json
    import os
    import sys

    conns = {}

    def multi_host(raw: dict) -> None:
        for cloud in raw["clouds"]:
            name = cloud["name"]
            cloud["store"] = {"url": f"s3://crosscloud/multihost/{name}", "endpoint_url": s3_servers[name].endpoint,
                              "region": "us-east-1", "addressing_style": "path", "connection_id": f"s3_{name}_{{tenant}}"}
            cloud["access"] = {"method": "ssh", "connection_id": f"ssh_{name}", "workdir": str(hosts / name),
                               "python": sys.executable,
                               "env": {"CROSSCLOUD_STATE_DIR": str(hosts / name / "state"), "OMP_NUM_THREADS": "1",
                                       "CROSSCLOUD_DATA_DIR": os.environ["CROSSCLOUD_DATA_DIR"]}}
            conns[f"AIRFLOW_CONN_SSH_{name.upper()}"] = json.dumps(
                {"conn_type": "ssh", "host": "127.0.0.1", "port": ssh_server.port, "login": ssh_server.user,
                 "extra": {"key_file": str(ssh_server.key_file), "host_key": ssh_server.host_key}})
            conns[f"AIRFLOW_CONN_S3_{name.upper()}_TEAM-A"] = json.dumps(
                {"conn_type": "aws", "login": f"key-{name}", "password": f"secret-{name}"})

    return embedded_file(path, multi_host), conns
