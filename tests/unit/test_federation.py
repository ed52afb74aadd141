"""Federation files: the embedded default loads; wrong files fail naming the file and field."""

from __future__ import annotations

import copy

import pytest
import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, FederationError, load_federation, parse_federation


@pytest.fixture()
def raw() -> dict:
    return yaml.safe_load(DEFAULT_FEDERATION.read_text())


def test_embedded_federation_has_one_local_and_two_collaboration_clouds():
    fed = load_federation()
    assert [c.role for c in fed.clouds].count("local") == 1
    assert [c.role for c in fed.clouds].count("collaboration") == 2
    assert len({c.store.url for c in fed.clouds}) == 3
    assert fed.local_cloud.name == "beijing"


def _error(data: dict, source: str = "fed.yaml") -> str:
    with pytest.raises(FederationError) as info:
        parse_federation(data, source)
    return str(info.value)


def test_unknown_accelerator_names_field_and_known_types(raw):
    raw["clouds"][1]["pools"][0]["accelerator"] = "nvidia-a1000"
    msg = _error(raw)
    assert "fed.yaml" in msg and "clouds.1.pools.0.accelerator" in msg
    assert "nvidia-a1000" in msg and "nvidia-a100" in msg


def test_negative_price_is_refused(raw):
    raw["clouds"][0]["pools"][0]["price_per_device_hour"] = -1
    msg = _error(raw)
    assert "clouds.0.pools.0.price_per_device_hour" in msg and "greater than or equal to 0" in msg


def test_duplicate_cloud(raw):
    raw["clouds"].append(copy.deepcopy(raw["clouds"][1]))
    assert "duplicate cloud name(s) ['shanghai']" in _error(raw)


def test_link_to_unknown_cloud(raw):
    raw["links"].append({"a": "beijing", "b": "mars", "bandwidth_mbps": 10, "latency_ms": 1})
    assert "unknown cloud 'mars'" in _error(raw)


def test_two_local_clouds(raw):
    raw["clouds"][1]["role"] = "local"
    assert "exactly one cloud must have role 'local'" in _error(raw)


def test_missing_and_misspelled_fields(raw):
    del raw["clouds"][0]["store"]
    raw["clouds"][0]["jurisdicton"] = "CN"
    msg = _error(raw)
    assert "clouds.0.store: field required" in msg
    assert "clouds.0.jurisdicton: unknown field" in msg


def test_unsafe_cloud_name(raw):
    raw["clouds"][2]["name"] = "../etc"
    assert "cloud name '../etc' is not allowed" in _error(raw)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(FederationError, match="federation file not found"):
        load_federation(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("clouds: [\n")
    with pytest.raises(FederationError, match=f"{bad}: not valid YAML"):
        load_federation(bad)


def test_unknown_cloud_lookup_lists_known_ones():
    with pytest.raises(FederationError, match="unknown cloud 'x'.*beijing"):
        load_federation().cloud("x")


def test_store_credentials_shared_by_tenants_are_refused(raw):
    raw["clouds"][1]["store"] = {"url": "s3://crosscloud/x", "connection_id": "s3_shanghai"}
    msg = _error(raw)
    assert "clouds.1.store.connection_id" not in msg  # a whole-federation check: it names the cloud
    assert "clouds.shanghai.store.connection_id: 's3_shanghai' would give tenants ['team-a', 'team-b']" in msg
    assert "'s3_shanghai_{tenant}'" in msg
    raw["clouds"][1]["store"]["connection_id"] = "s3_shanghai_{tenant}"
    parse_federation(raw)


def test_store_connection_id_takes_only_the_tenant_placeholder(raw):
    raw["clouds"][1]["store"] = {"url": "s3://crosscloud/x", "connection_id": "s3_{tenat}"}
    assert "clouds.1.store.connection_id: 's3_{tenat}': the only placeholder allowed is {tenant}" in _error(raw)


def test_store_retry_budget_must_be_positive(raw):
    raw["clouds"][1]["store"]["retry_deadline_s"] = 0
    assert "clouds.1.store.retry_deadline_s" in _error(raw)
