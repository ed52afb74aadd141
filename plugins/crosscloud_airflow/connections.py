"""Object-store credentials from Airflow Connections, one per cloud (and tenant).

A cloud's ``store.connection_id`` names the Connection; ``{tenant}`` in it is
replaced by the tenant, so each tenant has its own keys on each cloud
(``s3_guiyang_{tenant}`` -> ``s3_guiyang_team-a``). The Connection's login is
the access key id, its password the secret key, and ``extra`` may hold
``aws_session_token``. Nothing of it is logged or written to a plan.
"""

from __future__ import annotations


def connection_credentials(cloud, tenant: str | None) -> dict[str, str] | None:
    conn_id = cloud.store.connection_id
    if not conn_id:
        return None
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id.format(tenant=tenant or ""))
    found = {"aws_access_key_id": conn.login, "aws_secret_access_key": conn.password}
    token = (conn.extra_dejson or {}).get("aws_session_token")
    if token:
        found["aws_session_token"] = token
    return {k: v for k, v in found.items() if v}


def use_airflow_connections() -> None:
    """Make the engine take store credentials from Airflow Connections in this process."""
    from crosscloud import credentials

    credentials.set_provider(connection_credentials)
