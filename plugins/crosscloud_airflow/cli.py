"""``crosscloud`` on a host of an Airflow deployment, reaching the clouds as the DAGs do.

The engine's command line reads credentials from the environment and SSH
hosts from the federation file. On a worker or scheduler host the clouds are
reached through Airflow's Connections instead (SSH and Kubernetes clients,
store keys, the ledger's ``crosscloud_ledger``): ``crosscloud-airflow serve
stop`` there stops a served model whose replicas run on SSH clouds, whichever
host started them. Same commands, same arguments as ``crosscloud``, and one
of its own: ``tenant-bundles`` writes each tenant's DAG bundle for Airflow's
multi-team mode (``crosscloud_airflow.bundles``).
"""

from __future__ import annotations

import sys

from crosscloud.cli import main as crosscloud_main


def main(argv: list[str] | None = None) -> int:
    import logging

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tenant-bundles"]:
        from crosscloud_airflow.bundles import main as bundles_main

        return bundles_main(argv[1:])

    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    for handler in logging.getLogger().handlers:  # Airflow's logging writes to stdout: keep it for the output
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)
    return crosscloud_main(argv)


if __name__ == "__main__":
    sys.exit(main())
