"""A cloud's object store from its federation entry: the one place a URL scheme becomes a store."""

from __future__ import annotations

from pathlib import Path

from crosscloud.core.deployment import require_single_host
from crosscloud.core.federation import Cloud
from crosscloud.core.paths import state_dir
from crosscloud.store.base import LocalStore, ObjectStore, StoreError, TenantStore
from crosscloud.store.credentials import store_credentials


def open_store(cloud: Cloud, tenant: str | None = None) -> ObjectStore:
    """The object store of ``cloud``, scoped to ``tenant``'s prefix and credentials when given.

    Relative ``file://`` paths live in the state folder; ``s3://bucket/prefix``
    uses the cloud's endpoint and the tenant's credentials (see credentials.py).
    """
    url = cloud.store.url
    if url.startswith("file://"):
        path = Path(url.removeprefix("file://"))
        if not path.is_absolute():
            require_single_host(f"cloud {cloud.name}'s store {url} (a folder in this host's state folder)",
                                "use an S3 store, or an absolute path on a filesystem every host mounts")
        store: ObjectStore = LocalStore(path if path.is_absolute() else state_dir() / path, cloud=cloud.name)
    elif url.startswith("s3://"):
        from crosscloud.store.s3 import S3Store  # boto3 stays out of DAG parse time

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        store = S3Store(
            cloud.name, bucket, prefix, endpoint_url=cloud.store.endpoint_url, region=cloud.store.region,
            addressing_style=cloud.store.addressing_style, credentials=store_credentials(cloud, tenant),
            retry_deadline_s=cloud.store.retry_deadline_s, retry_backoff_s=cloud.store.retry_backoff_s,
            retry_backoff_max_s=cloud.store.retry_backoff_max_s,
        )
    else:
        raise StoreError(f"cloud {cloud.name}: store scheme of {url!r} is not supported (file:// or s3://)")
    store.jurisdiction = cloud.jurisdiction
    return TenantStore(store, tenant) if tenant else store
