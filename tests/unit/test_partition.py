"""Partition of an admitted job: shares follow effective throughput, shards follow shares and residency."""

from __future__ import annotations

import pytest
from federations import embedded

from crosscloud.core.job import JobSpec, JobSpecError
from crosscloud.pool.partition import apportion, partition
from crosscloud.pool.placement import Part, PlacementError

ALL = [Part("beijing", "cpu", 1), Part("shanghai", "cpu", 1), Part("singapore", "cpu", 1)]


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

    clouds = partition(embedded(faster), JobSpec(global_batch=40), "byte-lm", ALL, 12)
    assert {c.name: c.share for c in clouds} == {"beijing": 10, "shanghai": 20, "singapore": 10}
    # data follows the shares: the faster cloud holds twice the shards
    assert {c.name: len(c.shards) for c in clouds} == {"beijing": 3, "shanghai": 6, "singapore": 3}
    assert sorted(i for c in clouds for i in c.shards) == list(range(12))


def test_more_devices_mean_a_larger_share():
    parts = [Part("beijing", "cpu", 3), Part("shanghai", "cpu", 1)]
    clouds = partition(embedded(), JobSpec(global_batch=24), "byte-lm", parts, 12)
    assert [(c.name, c.devices, c.share) for c in clouds] == [("beijing", 3, 18), ("shanghai", 1, 6)]


def test_resident_shards_are_refused_out_of_their_jurisdiction():
    def cn_resident(raw):
        raw["datasets"][0]["residency"] = "CN"

    with pytest.raises(PlacementError, match=r"resident in CN and may not be sent to \['singapore'\]"):
        partition(embedded(cn_resident), JobSpec(), "byte-lm", ALL, 12)


@pytest.mark.parametrize(
    ("params", "field"),
    [({"rounds": 0}, "rounds"), ({"model_size": "huge"}, "model_size"), ({"mode": "fast"}, "mode"),
     ({"outer_momentum": 1.0}, "outer_momentum"), ({"tenant": "../x"}, "tenant"), ({"roundz": 3}, "roundz"),
     ({"placement": "random"}, "placement"), ({"devices": 0}, "devices")],
)
def test_job_params_fail_naming_the_field(params, field):
    with pytest.raises(JobSpecError, match=field):
        JobSpec.from_params(params)
