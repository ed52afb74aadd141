"""Demand response planning: modelled power, and the choice between throttling and shifting work."""

from __future__ import annotations

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.energy.power import fit_power_curve
from crosscloud.grid.demand_response import RunOnCloud, cloud_power_w, plan_shed, read_directives, write_directive
from crosscloud.store.base import LocalStore


@pytest.fixture(scope="module")
def curve():
    return fit_power_curve()


def _run(devices=1, share=8, others=("shanghai",), round_s=4.0, run_id="r1"):
    return RunOnCloud("team-a", run_id, "cpu", devices, share, 24, round_s, tuple(others))


def test_power_counts_busy_devices_at_their_cap_and_the_rest_idle(curve):
    fed = load_federation()
    idle = cloud_power_w(fed, "beijing", [], curve)
    busy = cloud_power_w(fed, "beijing", [_run(devices=2)], curve)
    throttled = cloud_power_w(fed, "beijing", [RunOnCloud("team-a", "r1", "cpu", 2, 8, 24, 4.0, (), cap=0.7)], curve)
    assert idle < throttled < busy
    pue = fed.cloud("beijing").grid.pue if fed.cloud("beijing").grid else 1.2
    assert busy - idle == pytest.approx(2 * (65 - 10) * pue)  # two devices from idle (10 W) to full (65 W)


def test_a_small_cut_is_met_by_throttling_which_costs_less_progress_than_shifting(curve):
    fed = load_federation()
    plan = plan_shed(fed, "beijing", [_run(devices=3, share=12)], reduce_pct=10, within_s=300, curve=curve)
    assert plan.feasible and [a.kind for a in plan.actions] == ["throttle"]
    shift_cost = 12 / 24
    assert plan.actions[0].progress_lost < shift_cost


def test_a_deep_cut_shifts_the_share_to_the_other_clouds(curve):
    fed = load_federation()
    plan = plan_shed(fed, "beijing", [_run(devices=3, share=12)], reduce_pct=60, within_s=300, curve=curve)
    assert plan.feasible and plan.actions[0].kind == "shift"


def test_rounds_longer_than_the_deadline_or_no_other_cloud_are_refused_and_said(curve):
    fed = load_federation()
    slow = plan_shed(fed, "beijing", [_run(round_s=600)], reduce_pct=10, within_s=300, curve=curve)
    assert not slow.feasible and "longer than the 300 s allowed" in slow.refused[0]
    alone = plan_shed(fed, "beijing", [_run(devices=3, others=())], reduce_pct=60, within_s=300, curve=curve)
    assert "no other cloud" in alone.refused[0] and not alone.feasible


def test_directives_are_written_and_withdrawn(tmp_path, curve):
    store = LocalStore(tmp_path, "beijing")
    plan = plan_shed(load_federation(), "beijing", [_run(devices=3)], reduce_pct=10, within_s=300, curve=curve)
    write_directive(store, "team-a/runs/r1", "beijing", plan.actions[0], {"reduce_pct": 10})
    assert read_directives(store, "team-a/runs/r1")["beijing"]["kind"] == "throttle"
    write_directive(store, "team-a/runs/r1", "beijing", None, {})
    assert read_directives(store, "team-a/runs/r1") == {}


@pytest.mark.queue
def test_a_grid_request_holds_the_cloud_s_free_devices_from_the_queue_until_it_is_restored(ledger):
    from federations import embedded

    from crosscloud.core.job import JobSpec
    from crosscloud.grid.demand_response import ShedPlan, restore
    from crosscloud.grid.hold import GRID, hold_free
    from crosscloud.scheduler.admission import NotAdmitted, admit
    from crosscloud.scheduler.service import Queue

    fed = embedded()
    admit(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "running", "byte-lm", 0, {"beijing"}, ledger)
    total = sum(p.count for p in fed.cloud("beijing").pools)
    assert hold_free(fed, "beijing", 3600, ledger) == total - 1  # every free device, not the run's
    with pytest.raises(NotAdmitted, match="queued at position"):  # the queue starts nothing there meanwhile
        admit(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), "new", "byte-lm", 0, {"beijing"}, ledger)
    assert {r.tenant for r in ledger.active()} == {"team-a", GRID}
    restore(fed, ShedPlan("beijing", 10, 300, 0.0, 0.0), ledger)
    assert {r.tenant for r in ledger.active()} == {"team-a"}
    Queue(fed, ledger).run_pass(force=True)
    assert Queue(fed, ledger).status("team-a", "new").state == "running"


@pytest.mark.queue
def test_a_grid_hold_lapses_by_itself_at_the_request_s_end(ledger):
    from federations import embedded

    from crosscloud.grid.hold import hold_free

    fed = embedded()
    assert hold_free(fed, "beijing", 1.0, ledger) > 0
    import time

    time.sleep(1.2)
    ledger.reap()
    assert ledger.active() == []
