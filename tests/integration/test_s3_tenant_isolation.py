"""Tenant isolation on a real S3 server that checks IAM policies: each tenant's keys reach only its prefix.

Two walls, each tested alone: the store layer (``TenantStore``) refuses keys
outside the tenant's prefix before a request leaves, and the server refuses a
tenant's credentials on another tenant's objects even when the store layer is
bypassed (what a sub-task holding its tenant's keys could try). moto does not
evaluate ``s3:prefix`` conditions, so listing other tenants' key names is
stopped by the store layer only here; a real store's policy adds the condition.
"""

from __future__ import annotations

import pytest
from federations import embedded
from s3servers import S3Server, tenant_policy

from crosscloud.core.keys import RunKeys
from crosscloud.store.base import StoreError
from crosscloud.store.commit import read_step, write_step
from crosscloud.store.credentials import store_credentials
from crosscloud.store.open_store import open_store
from crosscloud.store.s3 import S3Store

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def policed(tmp_path_factory):
    server = S3Server("shanghai", tmp_path_factory.mktemp("policed"))
    server.start()
    try:
        server.make_bucket("crosscloud")
        keys = server.enforce_policies({t: tenant_policy("crosscloud", "exchange", t) for t in ("team-a", "team-b")})
        yield server, keys
    finally:
        server.stop()


@pytest.fixture()
def cloud(policed, monkeypatch):
    server, keys = policed
    for tenant, creds in keys.items():
        env = tenant.upper().replace("-", "_")
        monkeypatch.setenv(f"CROSSCLOUD_SHANGHAI_{env}_ACCESS_KEY_ID", creds["aws_access_key_id"])
        monkeypatch.setenv(f"CROSSCLOUD_SHANGHAI_{env}_SECRET_ACCESS_KEY", creds["aws_secret_access_key"])
    fed = embedded(lambda raw: raw["clouds"][1].update(store={
        "url": "s3://crosscloud/exchange", "endpoint_url": server.endpoint, "addressing_style": "path",
        "connection_id": "s3_shanghai_{tenant}"}))
    return fed.cloud("shanghai")


def test_each_tenant_works_in_its_own_prefix_with_its_own_keys(cloud):
    for tenant in ("team-a", "team-b"):
        store = open_store(cloud, tenant)
        step = RunKeys(tenant, "r1").global_step(0)
        write_step(store, step, {"params.safetensors": f"{tenant}'s weights".encode()})
        assert read_step(store, step)[1]["params.safetensors"] == f"{tenant}'s weights".encode()
    assert store_credentials(cloud, "team-a") != store_credentials(cloud, "team-b")


def test_the_store_layer_refuses_another_tenants_keys(cloud):
    write_step(open_store(cloud, "team-a"), "team-a/runs/r2/global/0", {"params.safetensors": b"a"})
    b = open_store(cloud, "team-b")
    for op in (lambda: b.get("team-a/runs/r2/global/0/COMMIT.json"), lambda: b.list("team-a/runs"),
               lambda: b.put("team-a/runs/r2/global/0/params.safetensors", b"poisoned"),
               lambda: b.put("team-b/../team-a/runs/r2/x", b"poisoned")):
        with pytest.raises(StoreError, match="tenant team-b may not touch"):
            op()


def test_the_server_refuses_a_tenants_keys_on_another_tenants_objects(cloud, policed):
    server, _ = policed
    write_step(open_store(cloud, "team-a"), "team-a/runs/r3/global/0", {"params.safetensors": b"a's weights"})
    # team-b's credentials on a raw store, past the store layer
    raw = S3Store("shanghai", "crosscloud", "exchange", endpoint_url=server.endpoint,
                  credentials=store_credentials(cloud, "team-b"))
    key = "team-a/runs/r3/global/0/params.safetensors"
    for what, op in (("head", lambda: raw.get(key)), ("upload", lambda: raw.put(key, b"poisoned")),
                     ("delete", lambda: raw.delete(key))):
        with pytest.raises(StoreError, match=f"cloud shanghai: s3://crosscloud/exchange/{key}: {what} refused: (403|AccessDenied)"):
            op()
    assert read_step(open_store(cloud, "team-a"), "team-a/runs/r3/global/0")[1]["params.safetensors"] == b"a's weights"
    # and with no valid keys at all, nothing is reachable
    stranger = S3Store("shanghai", "crosscloud", "exchange", endpoint_url=server.endpoint,
                       credentials={"aws_access_key_id": "testing", "aws_secret_access_key": "testing"})
    with pytest.raises(StoreError, match="refused"):
        stranger.get(key)
