"""Admission: hard constraints with reasons, quotas, draining and joining, forwarding, no oversubscription."""

from __future__ import annotations

import pytest
from federations import embedded

from crosscloud.core.federation import FederationError
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.scheduler.admission import NotAdmitted, admit
from crosscloud.pool.inventory import collect
from crosscloud.pool.placement import PlacementError


def _admit(fed, ledger, run_id="r1", data_at=("beijing",), data_bytes=0, **job):
    return admit(fed, JobSpec(**job), run_id, "byte-lm", data_bytes, set(data_at), ledger)


def _where(admission):
    return {p.cloud: p.devices for p in admission.parts}


def test_spread_takes_every_eligible_cloud_and_reserves_it(ledger):
    fed = embedded()
    assert _where(_admit(fed, ledger)) == {"beijing": 1, "shanghai": 1, "singapore": 1}
    inv = collect(fed, ledger, tenant="team-a")
    assert {c.name: c.pools[0].free for c in inv.clouds} == {"beijing": 3, "shanghai": 1, "singapore": 1}
    assert inv.tenants[0].runs == ["r1"] and inv.tenants[0].used == {"beijing": 1, "shanghai": 1, "singapore": 1}
    assert ledger.release("team-a", "r1") == 3
    assert collect(fed, ledger).cloud("shanghai").pools[0].free == 2


def test_retried_admission_gets_its_own_reservation_back(ledger):
    fed = embedded()
    first = _admit(fed, ledger, devices_per_cloud=2)
    again = _admit(fed, ledger, devices_per_cloud=2)
    assert _where(again) == _where(first)
    assert sum(r.devices for r in ledger.active()) == 6


def test_rejections_carry_their_reason(ledger):
    def drain_and_no_image(raw):
        raw["clouds"][1]["state"] = "draining"
        raw["clouds"][2]["pools"][0]["accelerator"] = "hygon-k100"

    admission = _admit(embedded(drain_and_no_image), ledger)
    assert list(_where(admission)) == ["beijing"]
    reasons = {c.cloud: c.reason for c in admission.considered}
    assert "draining" in reasons["shanghai"]
    assert "no adapted image" in reasons["singapore"]


def test_draining_at_runtime_needs_no_restart(ledger):
    fed = embedded()
    ledger.set_state("shanghai", "draining")
    assert "shanghai" not in _where(_admit(fed, ledger, run_id="a"))
    ledger.set_state("shanghai", "active")
    assert "shanghai" in _where(_admit(fed, ledger, run_id="b"))


def test_joining_cloud_gets_work_only_after_a_passed_check(ledger):
    def joining(raw):
        raw["clouds"][2]["state"] = "joining"

    fed = embedded(joining)
    reasons = {c.cloud: c.reason for c in _admit(fed, ledger, run_id="a").considered}
    assert "has not passed its join check" in reasons["singapore"]
    ledger.record_check("singapore", False, "store: access denied")
    reasons = {c.cloud: c.reason for c in _admit(fed, ledger, run_id="b").considered}
    assert "join check failed (store: access denied)" in reasons["singapore"]
    ledger.record_check("singapore", True, "store, launcher and images work")
    assert "singapore" in _where(_admit(fed, ledger, run_id="c"))


def test_quota_bounds_devices_and_a_tenant_without_quota_is_told_why(ledger):
    fed = embedded()
    assert _where(_admit(fed, ledger, devices_per_cloud=3)) == {"beijing": 3, "shanghai": 2, "singapore": 2}
    with pytest.raises(PlacementError, match="singapore/cpu: tenant team-b has no quota left here"):
        _admit(fed, ledger, run_id="b", tenant="team-b", clouds=["singapore"])


def test_quota_is_per_tenant_and_counts_running_reservations(ledger):
    fed = embedded()
    _admit(fed, ledger, run_id="b1", tenant="team-b", clouds=["shanghai"])  # team-b's whole shanghai quota (1)
    with pytest.raises(NotAdmitted, match="shanghai/cpu: full: 0 of 2 free to team-b"):  # waits for its own run
        _admit(fed, ledger, run_id="b2", tenant="team-b", clouds=["shanghai"])
    # team-a is not affected by team-b's quota, only by the device it holds
    assert _where(_admit(fed, ledger, run_id="a1", clouds=["shanghai"], devices_per_cloud=2)) == {"shanghai": 1}


def test_resident_data_is_never_placed_out_of_its_jurisdiction(ledger):
    def cn_resident(raw):
        raw["datasets"][0]["residency"] = "CN"

    fed = embedded(cn_resident)
    admission = _admit(fed, ledger)
    assert set(_where(admission)) == {"beijing", "shanghai"}
    assert "data resident in CN, cloud is in SG" in {c.cloud: c.reason for c in admission.considered}["singapore"]
    with pytest.raises(PlacementError, match="singapore"):
        _admit(fed, ledger, run_id="r2", clouds=["beijing", "singapore"])


def test_unknown_cloud_and_single_cluster_errors(ledger):
    fed = embedded()
    with pytest.raises(FederationError, match="unknown cloud 'mars'"):
        _admit(fed, ledger, clouds=["mars"])
    with pytest.raises(PlacementError, match="single_cluster mode runs on one cloud"):
        _admit(fed, ledger, mode="single_cluster", clouds=["beijing", "shanghai"])
    single = _admit(fed, ledger, mode="single_cluster", devices_per_cloud=3)
    assert _where(single) == {"beijing": 3}


def test_auto_uses_one_cloud_when_it_suffices_and_splits_when_none_can(ledger):
    fed = embedded()
    one = _admit(fed, ledger, run_id="a", placement="auto", devices=3)
    assert _where(one) == {"beijing": 3}
    ledger.release("team-a", "a")
    # no cloud holds 6 devices alone: a split job over several clouds
    split = _admit(fed, ledger, run_id="b", placement="auto", devices=6, devices_per_cloud=1)
    assert sum(_where(split).values()) == 6 and len(_where(split)) >= 2
    assert any("split over" in c.reason for c in split.considered if c.chosen)


def test_auto_forwards_a_job_with_its_data_when_its_center_is_full(ledger):
    fed = embedded()
    _admit(fed, ledger, run_id="other", tenant="team-b", clouds=["beijing"], devices_per_cloud=2)
    _admit(fed, ledger, run_id="mine", clouds=["beijing"], devices_per_cloud=2)  # beijing is now full
    moved = _admit(fed, ledger, run_id="next", placement="auto", devices=2, data_at=("beijing",), data_bytes=10**9)
    assert _where(moved) == {"shanghai": 2}  # the faster link from beijing (1000 Mbit/s) beats singapore's 100
    reasons = {c.cloud: c.reason for c in moved.considered}
    # beijing would have to wait for the runs holding it to end (the queue knows when they are expected to)
    assert reasons["beijing"].startswith("alone: start ") and not reasons["beijing"].startswith("alone: start 0 s")


def test_full_federation_waits_then_admits_when_devices_free(ledger):
    fed = embedded()
    _admit(fed, ledger, run_id="big", devices_per_cloud=4)  # every device of the federation
    with pytest.raises(NotAdmitted, match="queued at position 1: reserved 2 x cpu on .*, expected free in"):
        _admit(fed, ledger, run_id="waiting", placement="auto", devices=2)
    ledger.release("team-a", "big")
    assert sum(_where(_admit(fed, ledger, run_id="waiting", placement="auto", devices=2)).values()) == 2


def _contend(where: str, i: int, results) -> None:
    fed = embedded()
    try:
        admission = admit(fed, JobSpec(placement="auto", devices=1, tenant="team-a"), f"run-{i}", "byte-lm", 0, {"beijing"},
                          Ledger(where))
        results.put(sum(p.devices for p in admission.parts))
    except NotAdmitted:
        results.put(0)


def test_concurrent_admissions_never_oversubscribe(ledger_location, in_processes):
    """Twelve processes admit at once for 8 devices (team-a's quota): exactly 8 get one, on SQLite and PostgreSQL."""
    Ledger(ledger_location)
    got = in_processes(_contend, [(ledger_location, i) for i in range(12)])
    assert sum(got) == 8 and got.count(0) == 4
    usage = Ledger(ledger_location).usage()
    assert usage.pools == {("beijing", "cpu"): 4, ("shanghai", "cpu"): 2, ("singapore", "cpu"): 2}
