"""Placement and partition: shares follow effective throughput, constraints are explained."""

from __future__ import annotations

import pytest
import yaml

from crosscloud.federation import DEFAULT_FEDERATION, parse_federation
from crosscloud.job import JobSpec, JobSpecError
from crosscloud.partition import PlacementError, apportion, partition


def _fed(mutate=None):
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    if mutate:
        mutate(raw)
    return parse_federation(raw)


def _free(fed):
    return {c.name: {p.accelerator: p.count for p in c.pools} for c in fed.clouds}


def test_apportion_is_proportional_and_exact():
    assert apportion(24, [1, 1, 1]) == [8, 8, 8]
    assert apportion(30, [2, 1, 0.5 + 0.5 + 1]) == [12, 6, 12]
    parts = apportion(10, [3, 1, 1])
    assert sum(parts) == 10 and parts[0] > parts[1]
    assert min(apportion(3, [100, 1, 1])) == 1  # every chosen cloud trains something
    with pytest.raises(PlacementError, match="smaller than the 3 clouds"):
        apportion(2, [1, 1, 1])


def test_shares_proportional_to_effective_throughput():
    def faster(raw):
        raw["clouds"][1]["pools"][0]["throughput"] = {"default": 1.0, "byte-lm": 2.0}

    fed = _fed(faster)
    clouds, _ = partition(fed, JobSpec(global_batch=40), "byte-lm", _free(fed), 12)
    shares = {c.name: c.share for c in clouds}
    assert shares == {"beijing": 10, "shanghai": 20, "singapore": 10}
    # data follows the shares: the faster cloud holds twice the shards
    shards = {c.name: len(c.shards) for c in clouds}
    assert shards == {"beijing": 3, "shanghai": 6, "singapore": 3}
    assert sorted(i for c in clouds for i in c.shards) == list(range(12))


def test_devices_bounded_by_quota_and_free_devices():
    fed = _fed()
    free = _free(fed)
    free["shanghai"]["cpu"] = 1
    clouds, _ = partition(fed, JobSpec(devices_per_cloud=3), "byte-lm", free, 12)
    devices = {c.name: c.devices for c in clouds}
    assert devices == {"beijing": 3, "shanghai": 1, "singapore": 2}  # quota of singapore is 2


def test_rejections_carry_their_reason():
    def drain_and_no_image(raw):
        raw["clouds"][1]["state"] = "draining"
        raw["clouds"][2]["pools"][0]["accelerator"] = "hygon-k100"

    fed = _fed(drain_and_no_image)
    clouds, candidates = partition(fed, JobSpec(), "byte-lm", _free(fed), 12)
    assert [c.name for c in clouds] == ["beijing"]
    reasons = {c.cloud: c.reason for c in candidates}
    assert "draining" in reasons["shanghai"]
    assert "no adapted image" in reasons["singapore"]


def test_tenant_without_quota_anywhere_gets_every_reason():
    fed = _fed()
    with pytest.raises(PlacementError, match="singapore: tenant team-b has no quota here"):
        partition(fed, JobSpec(tenant="team-b", clouds=["singapore"]), "byte-lm", _free(fed), 12)


def test_resident_data_never_planned_out_of_its_jurisdiction():
    def cn_resident(raw):
        raw["datasets"][0]["residency"] = "CN"

    fed = _fed(cn_resident)
    with pytest.raises(PlacementError, match=r"resident in CN and may not be sent to \['singapore'\]"):
        partition(fed, JobSpec(), "byte-lm", _free(fed), 12)
    clouds, _ = partition(fed, JobSpec(clouds=["beijing", "shanghai"]), "byte-lm", _free(fed), 12)
    assert {c.name for c in clouds} == {"beijing", "shanghai"}


def test_single_cluster_mode_uses_one_cloud_with_whole_batch():
    fed = _fed()
    clouds, _ = partition(fed, JobSpec(mode="single_cluster", devices_per_cloud=3), "byte-lm", _free(fed), 12)
    assert [(c.name, c.devices, c.share, len(c.shards)) for c in clouds] == [("beijing", 3, 24, 12)]


def test_unknown_cloud_in_params():
    fed = _fed()
    with pytest.raises(ValueError, match="unknown cloud 'mars'"):
        partition(fed, JobSpec(clouds=["mars"]), "byte-lm", _free(fed), 12)


@pytest.mark.parametrize(
    ("params", "field"),
    [({"rounds": 0}, "rounds"), ({"model_size": "huge"}, "model_size"), ({"mode": "fast"}, "mode"),
     ({"outer_momentum": 1.0}, "outer_momentum"), ({"tenant": "../x"}, "tenant"), ({"roundz": 3}, "roundz")],
)
def test_job_params_fail_naming_the_field(params, field):
    with pytest.raises(JobSpecError, match=field):
        JobSpec.from_params(params)
