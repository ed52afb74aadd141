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

from crosscloud.federation import Cloud

Credentials = dict[str, str]  # boto3 Session keyword arguments
_provider: Callable[[Cloud, str | None], Credentials | None] | None = None
_FIELDS = {"ACCESS_KEY_ID": "aws_access_key_id", "SECRET_ACCESS_KEY": "aws_secret_access_key", "SESSION_TOKEN": "aws_session_token"}


def set_provider(provider: Callable[[Cloud, str | None], Credentials | None] | None) -> None:
    """Install (or with None remove) the source consulted before the environment."""
    global _provider
    _provider = provider


def _env_prefix(*parts: str) -> str:
    return "CROSSCLOUD_" + "_".join(re.sub(r"[^A-Za-z0-9]", "_", p).upper() for p in parts) + "_"


def store_credentials(cloud: Cloud, tenant: str | None) -> Credentials | None:
    """boto3 session arguments for ``tenant`` on ``cloud``'s store; None: boto3's default chain."""
    if _provider is not None:
        found = _provider(cloud, tenant)
        if found:
            return found
    for prefix in ([_env_prefix(cloud.name, tenant)] if tenant else []) + [_env_prefix(cloud.name)]:
        found = {arg: os.environ[prefix + name] for name, arg in _FIELDS.items() if prefix + name in os.environ}
        if "aws_access_key_id" in found:
            return found
    return None


def credentials_env(cloud: Cloud, tenant: str) -> dict[str, str]:
    """The environment that gives a sub-task on ``cloud`` the tenant's credentials there."""
    found = store_credentials(cloud, tenant) or {}
    prefix = _env_prefix(cloud.name, tenant)
    return {prefix + name: found[arg] for name, arg in _FIELDS.items() if arg in found}
