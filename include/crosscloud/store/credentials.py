"""Where a cloud's object-store credentials come from: never the federation file.

Inside Airflow the plugin installs a provider that reads the cloud's Airflow
Connection (per cloud and tenant). Elsewhere - a sub-task, a benchmark - they
come from the environment: ``CROSSCLOUD_<CLOUD>_<TENANT>_ACCESS_KEY_ID`` /
``..._SECRET_ACCESS_KEY`` (tenant-specific), else ``CROSSCLOUD_<CLOUD>_...``,
else boto3's own chain (``AWS_ACCESS_KEY_ID`` ...).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from crosscloud.core.federation import Cloud

Credentials = dict[str, str]  # boto3 Session keyword arguments
_provider: Callable[[Cloud, str | None], Credentials | None] | None = None
_FIELDS = {"ACCESS_KEY_ID": "aws_access_key_id", "SECRET_ACCESS_KEY": "aws_secret_access_key", "SESSION_TOKEN": "aws_session_token"}


def set_provider(provider: Callable[[Cloud, str | None], Credentials | None] | None) -> None:
    """Install (or with None remove) the source consulted before the environment."""
    global _provider
    _provider = provider


def _env_prefix(*parts: str) -> str:
    return "CROSSCLOUD_" + "_".join(re.sub(r"[^A-Za-z0-9]", "_", p).upper() for p in parts) + "_"


class CredentialsError(ValueError):
    """A tenant without credentials for a cloud's store: says which Connection or variables to create."""


def store_credentials(cloud: Cloud, tenant: str | None) -> Credentials | None:
    """boto3 session arguments for ``tenant`` on ``cloud``'s store; None: boto3's default chain.

    A store that names a Connection never falls back on boto3's chain when
    neither it nor the variables exist: that would act as whatever identity
    this machine has, not as the tenant.
    """
    if _provider is not None:
        found = _provider(cloud, tenant)
        if found:
            return found
    prefixes = ([_env_prefix(cloud.name, tenant)] if tenant else []) + [_env_prefix(cloud.name)]
    for prefix in prefixes:
        found = {arg: os.environ[prefix + name] for name, arg in _FIELDS.items() if prefix + name in os.environ}
        if "aws_access_key_id" in found:
            return found
    conn_id = cloud.store.connection_id
    if conn_id and cloud.store.url.startswith("s3://"):
        raise CredentialsError(
            f"tenant {tenant} has no credentials for the store of cloud {cloud.name} "
            f"(clouds.{cloud.name}.store.connection_id {conn_id!r}): create the Airflow Connection "
            f"{conn_id.format(tenant=tenant or '')!r} (login: access key id, password: secret key) "
            f"or set {prefixes[0]}ACCESS_KEY_ID and {prefixes[0]}SECRET_ACCESS_KEY"
        )
    return None


def require_credentials(clouds: list[Cloud], tenant: str) -> None:
    """Fail before a run writes anything when ``tenant`` lacks credentials on any of ``clouds``' stores."""
    for cloud in clouds:
        store_credentials(cloud, tenant)


def credential_env_names(cloud: str, tenant: str) -> dict[str, str]:
    """Each variable a sub-task reads the tenant's store keys from, with the credential it holds (``aws_...``)."""
    prefix = _env_prefix(cloud, tenant)
    return {prefix + name: arg for name, arg in _FIELDS.items()}


def credentials_env(cloud: Cloud, tenant: str) -> dict[str, str]:
    """The environment that gives a sub-task on ``cloud`` the tenant's credentials there."""
    found = store_credentials(cloud, tenant) or {}
    return {var: found[arg] for var, arg in credential_env_names(cloud.name, tenant).items() if arg in found}
