"""A tenant reaches only its own prefix, with its own credentials; no name climbs out of its prefix."""

from __future__ import annotations

import pytest
from federations import embedded

from crosscloud.core.federation import FederationError
from crosscloud.core.keys import RunKeys, validate_name
from crosscloud.store.base import LocalStore, StoreError, TenantStore
from crosscloud.store.credentials import CredentialsError, credentials_env, store_credentials
from crosscloud.store.open_store import open_store

ODD = [
    "../team-b", "..", ".", "/abs", "/", "a/b", "a\\b", "", " team", "team ", "team\n", "team\x00", "tab\tname",
    "-leading", ".hidden", "caf\u00e9", "\u0661\u0662", "x" * 129, "a..b", "C:\\x", "$(id)", "team;rm", "%2e%2e",
]


@pytest.mark.parametrize("bad", ODD)
def test_odd_names_are_refused_as_tenants_runs_and_clouds(bad):
    with pytest.raises(ValueError, match="is not allowed"):
        validate_name(bad, "run id")
    with pytest.raises(ValueError, match="is not allowed"):
        RunKeys(bad, "run")
    with pytest.raises(ValueError, match="is not allowed"):
        RunKeys("team-a", bad)
    with pytest.raises(ValueError, match="is not allowed"):
        RunKeys("team-a", "run").cloud_step(bad, 0)


def test_odd_cloud_and_tenant_names_are_refused_in_the_federation():
    for bad in ("team\n", "../x"):
        with pytest.raises(FederationError, match="cloud name .* is not allowed"):
            embedded(lambda raw: raw["clouds"][2].update(name=bad))
        with pytest.raises(FederationError, match="tenant name .* is not allowed"):
            embedded(lambda raw: raw["tenants"][1].update(name=bad))


def test_airflow_run_ids_are_valid_names():
    assert RunKeys("team-a", "manual__2026-01-01T00:00:00.123456+00:00").root.startswith("team-a/runs/manual__")


@pytest.mark.parametrize(
    "key",
    ["team-b/runs/r/plan.json", "team-a/../team-b/runs/r/plan.json", "team-a/./x", "team-a//x", "team-a",
     "team-a/", "/team-a/x", "team-ab/x", "team/x", "team-a/x\n", "team-a/x\x00", "team-a\\..\\team-b/x", ""],
)
def test_a_tenant_store_refuses_every_key_outside_its_prefix(tmp_path, key):
    raw = LocalStore(tmp_path, cloud="c")
    raw.put("team-b/runs/r/plan.json", b"team-b's plan")
    a = TenantStore(raw, "team-a")
    for op in (lambda: a.get(key), lambda: a.put(key, b"x"), lambda: a.exists(key), lambda: a.list(key),
               lambda: a.delete(key), lambda: a.put_if_absent(key, b"x"), lambda: a.get_range(key, 0, 1)):
        with pytest.raises(StoreError, match="tenant team-a may not touch"):
            op()
    assert raw.get("team-b/runs/r/plan.json") == b"team-b's plan"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["plan.json"]


def test_every_store_a_run_opens_is_scoped_to_its_tenant(state_dir):
    fed = embedded()
    a = open_store(fed.cloud("shanghai"), "team-a")
    a.put("team-a/runs/r/x", b"mine")
    b = open_store(fed.cloud("shanghai"), "team-b")
    with pytest.raises(StoreError, match="tenant team-b may not touch 'team-a/runs/r/x'"):
        b.get("team-a/runs/r/x")
    assert "team-a/runs/r/x" not in b.list("team-b/runs")
    with pytest.raises(StoreError, match="tenant team-b may not touch"):
        b.list("team-a/runs")


def test_each_tenant_gets_its_own_credentials_and_never_another_identity(monkeypatch):
    fed = embedded(lambda raw: raw["clouds"][1].update(
        store={"url": "s3://crosscloud/x", "connection_id": "s3_shanghai_{tenant}"}))
    cloud = fed.cloud("shanghai")
    monkeypatch.setenv("CROSSCLOUD_SHANGHAI_TEAM_A_ACCESS_KEY_ID", "key-a")
    monkeypatch.setenv("CROSSCLOUD_SHANGHAI_TEAM_A_SECRET_ACCESS_KEY", "secret-a")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "this-machine")  # boto3's chain would find this identity
    assert store_credentials(cloud, "team-a") == {"aws_access_key_id": "key-a", "aws_secret_access_key": "secret-a"}
    assert credentials_env(cloud, "team-a") == {"CROSSCLOUD_SHANGHAI_TEAM_A_ACCESS_KEY_ID": "key-a",
                                                "CROSSCLOUD_SHANGHAI_TEAM_A_SECRET_ACCESS_KEY": "secret-a"}
    with pytest.raises(CredentialsError, match="tenant team-b has no credentials for the store of cloud shanghai"):
        store_credentials(cloud, "team-b")
    with pytest.raises(CredentialsError):
        open_store(cloud, "team-b")
