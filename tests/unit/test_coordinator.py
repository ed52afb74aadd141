"""The coordinator on real stores, with contributions written by the test in place of workers."""

from __future__ import annotations

import json

import pytest
import torch

from crosscloud.commit import IntegrityError, read_commit, write_step
from crosscloud.coordinator import Coordinator, SubTaskLost, load_global
from crosscloud.job import JobSpec
from crosscloud.pipeline import admit_stage, preheat_stage, release_stage
from crosscloud.storage import open_store
from crosscloud.tensors import to_bytes


def _commit_delta(store, plan, cloud, round_, scale=0.01, delta=None):
    params = load_global(store, plan, 0)[0]
    delta = delta or {n: torch.full_like(t, scale) for n, t in params.items()}
    meta = {"round": round_, "losses": [1.0], "step_s": [0.01], "wait_s": 0, "download_s": 0, "compute_s": 0.01, "upload_s": 0}
    write_step(store, plan.keys.cloud_step(cloud, round_), {"delta.safetensors": to_bytes(delta)}, meta=meta)


@pytest.fixture()
def planned(request):
    spec = JobSpec(rounds=2, inner_steps=1, model_size="tiny", round_timeout_s=1.0, outer_lr=0.7, outer_momentum=0.9)
    ref = admit_stage(spec, f"coord-{request.node.name}")
    preheat_stage(ref)
    fed, plan = ref.load()
    yield plan, {c.name: open_store(fed.cloud(c.name)) for c in plan.clouds}
    release_stage(ref)


def test_resumes_after_last_committed_round_and_never_applies_one_twice(planned):
    plan, stores = planned
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 0)
    with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    home = stores[plan.coordinator_cloud]
    round1 = read_commit(home, plan.keys.global_step(1))
    assert round1 is not None and read_commit(home, plan.keys.global_step(2)) is None
    # global round 1 = init - lr * (1 + momentum) * 0.01 (first Nesterov step)
    init, after = load_global(home, plan, 0)[0], load_global(home, plan, 1)[0]
    name = next(iter(init))
    assert torch.allclose(init[name] - after[name], torch.full_like(init[name], 0.7 * 1.9 * 0.01), atol=1e-6)

    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 1)
    logs = []
    history = Coordinator(plan, stores, handles=[], log=logs.append).run()
    assert any("resuming" in line for line in logs)
    assert [r["round"] for r in history] == [0, 1]
    assert read_commit(home, plan.keys.global_step(1)) == round1  # round 0's outer step was not applied again
    for store in stores.values():
        assert read_commit(store, plan.keys.global_step(2)) is not None
    assert len(json.loads(home.get(f"{plan.keys.root}/history.json"))) == 2


def test_malformed_contribution_is_refused(planned):
    plan, stores = planned
    for cloud in ("beijing", "singapore"):
        _commit_delta(stores[cloud], plan, cloud, 0)
    params = load_global(stores["shanghai"], plan, 0)[0]
    bad = {n: torch.full_like(t, float("nan")) for n, t in params.items()}
    _commit_delta(stores["shanghai"], plan, "shanghai", 0, delta=bad)
    with pytest.raises(IntegrityError, match="cloud shanghai: .* NaN or Inf"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    assert read_commit(stores[plan.coordinator_cloud], plan.keys.global_step(1)) is None


def test_dead_subtask_fails_the_round_with_its_cloud_named(planned):
    plan, stores = planned
    from crosscloud.backends import SubTaskSpec, get_backend

    backend = get_backend("local")
    handle = backend.start(SubTaskSpec(tenant=plan.tenant, run_id=plan.run_id, cloud="singapore", image="x",
                                       accelerator="cpu", devices=1, module="json.tool"))  # exits 1 at once: no input
    for cloud in ("beijing", "shanghai"):
        _commit_delta(stores[cloud], plan, cloud, 0)
    with pytest.raises(SubTaskLost, match="cloud singapore: sub-task is failed"):
        Coordinator(plan, {**stores}, handles=[handle], log=lambda m: None).run()


def test_grid_directives_become_next_round_shares_and_caps(planned):
    from crosscloud.demand_response import Action, write_directive

    plan, stores = planned
    home, coordinator = stores[plan.coordinator_cloud], Coordinator(plan, stores, handles=[], log=lambda m: None)
    shares = {c.name: c.share for c in plan.clouds}
    assert coordinator.next_round(shares, {}, home) == {"caps": {}, "next_shares": shares}  # nothing asked
    shift = Action(plan.tenant, plan.run_id, "shift", 1.0, 1.0, 50.0, 0.3)
    write_directive(home, plan.keys.root, "beijing", shift, {})
    nxt = coordinator.next_round(shares, {}, home)["next_shares"]
    assert nxt["beijing"] == 0 and sum(nxt.values()) == plan.spec.global_batch
    throttle = Action(plan.tenant, plan.run_id, "throttle", 0.7, 0.88, 20.0, 0.04)
    write_directive(home, plan.keys.root, "beijing", throttle, {})
    assert coordinator.next_round(shares, {}, home)["caps"] == {"beijing": {"cap": 0.7, "throughput": 0.88}}
    write_directive(home, plan.keys.root, "beijing", None, {})
    restored = coordinator.next_round({**shares, "beijing": 0}, {}, home)
    assert restored == {"caps": {}, "next_shares": shares}  # the plan's shares, said explicitly to the idle worker


def test_a_round_committed_at_home_only_is_completed_on_resume(planned):
    # the coordinator's own store is written first: a crash right after it leaves the other
    # clouds without the round, and the restarted coordinator re-publishes it unchanged
    plan, stores = planned
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 0)
    with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    home = stores[plan.coordinator_cloud]
    other = next(name for name in stores if name != plan.coordinator_cloud)
    before = read_commit(stores[other], plan.keys.global_step(1))
    stores[other].delete(f"{plan.keys.global_step(1)}/COMMIT.json")
    assert read_commit(home, plan.keys.global_step(1)) is not None
    with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    assert read_commit(stores[other], plan.keys.global_step(1)) == before
