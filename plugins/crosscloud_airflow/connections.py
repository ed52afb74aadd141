"""Object-store credentials from Airflow Connections, one per cloud (and tenant); the ledger's database too.

A cloud's ``store.connection_id`` names the Connection; ``{tenant}`` in it is
replaced by the tenant, so each tenant has its own keys on each cloud
(``s3_guiyang_{tenant}`` -> ``s3_guiyang_team-a``). The Connection's login is
the access key id, its password the secret key, and ``extra`` may hold
``aws_session_token``. Nothing of it is logged or written to a plan.

The reservation ledger's database is the Connection ``crosscloud_ledger``
(a PostgreSQL URI), unless ``CROSSCLOUD_LEDGER_URL`` says otherwise.
"""

from __future__ import annotations


def connection_credentials(cloud, tenant: str | None) -> dict[str, str] | None:
    conn_id = cloud.store.connection_id
    if not conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id.format(tenant=tenant or ""))
    except AirflowNotFoundException:  # the engine says which Connection or variables to create
        return None
    found = {"aws_access_key_id": conn.login, "aws_secret_access_key": conn.password}
    token = (conn.extra_dejson or {}).get("aws_session_token")
    if token:
        found["aws_session_token"] = token
    return {k: v for k, v in found.items() if v}


def ssh_client(cloud: str, access: dict):
    """A connected paramiko client for an ssh cloud: its SSH Connection through the SSH provider's hook.

    The Connection holds host, port, login and the key (``key_file`` or
    ``private_key`` in extra) and should pin the host's key (``host_key`` extra).
    Without ``access.connection_id`` the engine's own target (host, user, key file) is used.
    """
    from crosscloud.backends.ssh import SSHTarget

    if not access.get("connection_id"):
        return SSHTarget.from_access(cloud, access).connect()
    from airflow.providers.ssh.hooks.ssh import SSHHook

    return SSHHook(ssh_conn_id=access["connection_id"], remote_host=access.get("host") or "").get_conn()


def kubernetes_client(access: dict):
    """The ``ApiClient`` of a kubernetes cloud: its Connection (kubeconfig or in-cluster) through KubernetesHook."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=access.get("connection_id")).get_conn()


def ledger_url() -> str | None:
    """The URI of the Connection ``crosscloud_ledger``; None when it does not exist (the embedded SQLite ledger)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from crosscloud.ledger.url import CONNECTION_ID

    try:
        return BaseHook.get_connection(CONNECTION_ID).get_uri()
    except AirflowNotFoundException:
        return None


def use_airflow_connections() -> None:
    """Make the engine take store credentials, the clients of ssh and kubernetes clouds and the ledger's database
    from Airflow Connections, and tell it the executor (whether tasks run on several hosts)."""
    from airflow.configuration import conf

    from crosscloud import ledger
    from crosscloud.backends import kubernetes, ssh
    from crosscloud.core import deployment
    from crosscloud.store import credentials

    credentials.set_provider(connection_credentials)
    ssh.set_connector(ssh_client)
    kubernetes.set_client_factory(kubernetes_client)
    ledger.set_url_provider(ledger_url)
    deployment.set_executor(conf.get("core", "executor"))
