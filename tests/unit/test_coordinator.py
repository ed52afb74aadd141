"""The coordinator on real stores, with contributions written by the test in place of workers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import admit_stage, preheat_stage, release_stage
from crosscloud.store.commit import read_commit, write_step
from crosscloud.store.digest import IntegrityError
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import to_bytes
from crosscloud.training.coordinator import (
    PATIENCE,
    PATIENCE_FLOOR_S,
    Coordinator,
    SubTaskLost,
    load_global,
    patience_s,
)
from crosscloud.training.screening import outliers


def _commit_delta(store, plan, cloud, round_, scale=0.01, delta=None):
    params = load_global(store, plan, 0)[0]
    delta = delta or {n: torch.full_like(t, scale) for n, t in params.items()}
    meta = {"round": round_, "losses": [1.0], "step_s": [0.01], "wait_s": 0, "download_s": 0, "compute_s": 0.01, "upload_s": 0}
    write_step(store, plan.keys.cloud_step(cloud, round_), {"delta.safetensors": to_bytes(delta)}, meta=meta)


@pytest.fixture()
def planned(request):
    """A planned run of 2 rounds; a test's indirect parameter changes its job spec."""
    spec = JobSpec(**{"rounds": 2, "inner_steps": 1, "model_size": "tiny", "round_timeout_s": 1.0, "outer_lr": 0.7,
                      "outer_momentum": 0.9, **getattr(request, "param", {})})
    ref = admit_stage(spec, "coord-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[-100:])
    preheat_stage(ref)
    fed, plan = ref.load()
    yield plan, {c.name: open_store(fed.cloud(c.name)) for c in plan.clouds}
    release_stage(ref)


def _round_0_then_stall(plan, stores):
    """Every cloud commits round 0 and none round 1: the coordinator publishes global 1 and stops at round 1."""
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 0)
    with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()


def test_resumes_after_last_committed_round_and_never_applies_one_twice(planned):
    plan, stores = planned
    _round_0_then_stall(plan, stores)
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


@pytest.mark.faults
@pytest.mark.parametrize("planned", [{"eval_every_steps": 1}], indirect=True)  # every round evaluated
def test_a_crash_between_publishing_a_round_and_recording_it_loses_no_record(planned):
    plan, stores = planned
    home, key = stores[plan.coordinator_cloud], f"{plan.keys.root}/history.json"
    _round_0_then_stall(plan, stores)
    recorded = json.loads(home.get(key))[0]
    home.put(key, b"[]")  # killed after global 1 was committed, before history.json was written
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 1)
    history = Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    assert [r["round"] for r in history] == [0, 1]
    assert history[0]["published_at"] == recorded["published_at"]  # from global 1's commit, not a round re-run
    assert history[0]["eval_loss"] == pytest.approx(recorded["eval_loss"])


def _global_step_of(plan, stores, scale):
    """Global round 1 after a first Nesterov step (lr 0.7, momentum 0.9) on a pseudo-gradient of ``scale`` everywhere."""
    init, after = load_global(stores[plan.coordinator_cloud], plan, 0)[0], load_global(stores[plan.coordinator_cloud], plan, 1)[0]
    return all(torch.allclose(init[n] - after[n], torch.full_like(init[n], 0.7 * 1.9 * scale), atol=1e-6) for n in init)


def _poison(kind, params):
    name = next(iter(params))
    delta = {n: torch.full_like(t, 0.05) for n, t in params.items()}
    if kind in ("nan", "inf"):
        delta[name][..., 0] = float(kind)
    elif kind == "shape":
        delta[name] = torch.zeros(3, 5)
    elif kind == "dtype":
        delta[name] = delta[name].double()
    elif kind == "norm":
        delta = {n: torch.full_like(t, 1.0) for n, t in params.items()}  # 100x the others' 0.01
    return delta


@pytest.mark.faults
@pytest.mark.parametrize("kind, says", [("nan", "NaN or Inf"), ("inf", "NaN or Inf"), ("shape", "expected"),
                                        ("dtype", "float64"), ("norm", "above 10x the median")])
def test_a_wrong_contribution_is_refused_flagged_and_the_round_completes_without_it(planned, kind, says):
    plan, stores = planned
    for cloud in ("beijing", "singapore"):
        for r in (0, 1):
            _commit_delta(stores[cloud], plan, cloud, r)
    params = load_global(stores["shanghai"], plan, 0)[0]
    _commit_delta(stores["shanghai"], plan, "shanghai", 0, delta=_poison(kind, params))
    _commit_delta(stores["shanghai"], plan, "shanghai", 1)
    logs = []
    history = Coordinator(plan, stores, handles=[], log=logs.append).run()
    assert says in history[0]["refused"]["shanghai"] and list(history[0]["refused"]) == ["shanghai"]
    assert history[1]["refused"] == {}  # refused for its round only: its next contribution counts
    assert _global_step_of(plan, stores, 0.01)  # the others' 0.01 alone: shanghai's 0.05 never reached the model
    assert any("refused the contribution of cloud shanghai" in line for line in logs)


@pytest.mark.faults
def test_a_refused_contribution_flags_its_cloud_in_mlflow(planned):
    from crosscloud.tracking.mlflow_runs import Tracker

    plan, stores = planned
    tracker = Tracker()
    plan.tracking = tracker.start_job(plan, "coordinator-faults", {})
    for cloud in ("beijing", "singapore"):
        for r in (0, 1):
            _commit_delta(stores[cloud], plan, cloud, r)
    _commit_delta(stores["shanghai"], plan, "shanghai", 0, delta=_poison("norm", load_global(stores["shanghai"], plan, 0)[0]))
    _commit_delta(stores["shanghai"], plan, "shanghai", 1)
    Coordinator(plan, stores, handles=[], log=lambda m: None, on_round=lambda rec: tracker.log_round(plan, rec)).run()
    client, tr = tracker.client, plan.tracking
    assert client.get_run(tr["parent_run_id"]).data.tags["crosscloud.refused.shanghai"].startswith("round 0: pseudo-gradient norm")
    assert client.get_run(tr["child_run_ids"]["shanghai"]).data.tags["crosscloud.refused"].startswith("round 0:")
    assert "crosscloud.refused" not in client.get_run(tr["child_run_ids"]["beijing"]).data.tags
    refused = sorted((m.step, m.value) for m in client.get_metric_history(tr["parent_run_id"], "contributions_refused"))
    assert refused == [(0, 1.0), (1, 0.0)]


@pytest.mark.faults
@pytest.mark.parametrize("damage", ["bit-flip", "truncate"])
def test_a_damaged_delta_is_refused_by_its_sha256_and_dropped_from_its_round(planned, damage):
    plan, stores = planned
    for cloud in ("beijing", "singapore"):
        _commit_delta(stores[cloud], plan, cloud, 0)
    _commit_delta(stores["shanghai"], plan, "shanghai", 0, scale=0.05)
    commit = read_commit(stores["shanghai"], plan.keys.cloud_step("shanghai", 0))
    path = Path(stores["shanghai"].root) / commit["objects"]["delta.safetensors"]["key"]
    data = bytearray(path.read_bytes())
    if damage == "bit-flip":
        data[len(data) // 2] ^= 0x10
    else:
        del data[len(data) // 2:]
    path.write_bytes(bytes(data))
    with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):  # nothing commits round 1 here
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    history = json.loads(stores[plan.coordinator_cloud].get(f"{plan.keys.root}/history.json"))
    assert "does not match its commit" in history[0]["refused"]["shanghai"]
    assert _global_step_of(plan, stores, 0.01)


def test_every_contribution_refused_fails_the_round(planned):
    plan, stores = planned
    params = load_global(stores["shanghai"], plan, 0)[0]
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 0, delta=_poison("nan", params))
    with pytest.raises(IntegrityError, match="round 0: every contribution was refused"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    assert read_commit(stores[plan.coordinator_cloud], plan.keys.global_step(1)) is None


def test_outliers_are_judged_against_the_median_of_the_others():
    assert list(outliers({"a": 1.0, "b": 1.3, "c": 30.0})) == ["c"]  # the poisoned cloud cannot raise its own bar
    assert outliers({"a": 1.0, "b": 4.0, "c": 2.0}) == {}  # spread, but no cloud 10x the others
    assert outliers({"a": 1.0}) == {}  # alone: nothing to compare with


@pytest.mark.faults
def test_a_dead_subtask_is_lost_and_the_run_continues_on_the_others(planned):
    plan, stores = planned
    from crosscloud.backends import SubTaskSpec, get_backend

    backend = get_backend("local")
    handle = backend.start(SubTaskSpec(tenant=plan.tenant, run_id=plan.run_id, cloud="singapore", image="x",
                                       accelerator="cpu", devices=1, module="json.tool"))  # exits 1 at once: no input
    for cloud in ("beijing", "shanghai"):
        for r in (0, 1):
            _commit_delta(stores[cloud], plan, cloud, r, scale=0.01 * (r + 1))
    logs = []
    history = Coordinator(plan, {**stores}, handles=[handle], log=logs.append).run()
    assert "sub-task is failed" in history[0]["lost"]["singapore"] and history[1]["lost"] == {}
    assert sorted(history[0]["clouds"]) == sorted(history[1]["clouds"]) == ["beijing", "shanghai"]
    # its share of the global batch goes to the others from the next round on
    for record in history:
        assert record["next_shares"]["singapore"] == 0 and sum(record["next_shares"].values()) == plan.spec.global_batch
    assert _global_step_of(plan, stores, 0.01)  # the round averaged over the two that committed
    assert any("cloud singapore lost" in line for line in logs)


@pytest.mark.faults
@pytest.mark.parametrize("planned", [{"round_timeout_s": 120.0}], indirect=True)
def test_a_silent_cloud_is_lost_after_a_deadline_from_measured_rounds(planned):
    # singapore's sub-task is not watched here (no handle): only its missing commit can tell
    plan, stores = planned
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 0)
    for cloud in ("beijing", "shanghai"):
        _commit_delta(stores[cloud], plan, cloud, 1)
    history = Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    patience = patience_s(history[:1], plan.spec.round_timeout_s)
    assert patience < plan.spec.round_timeout_s
    assert f"patience {patience:.1f} s from measured rounds" in history[1]["lost"]["singapore"]
    assert sorted(history[1]["clouds"]) == ["beijing", "shanghai"]


def test_patience_follows_measured_round_times():
    assert patience_s([], 600.0) == 600.0  # nothing measured: the job's limit
    assert patience_s([{"wall_s": 0.1}], 600.0) == PATIENCE_FLOOR_S
    assert patience_s([{"wall_s": 30.0}, {"wall_s": 2.0}, {"wall_s": 3.0}, {"wall_s": 4.0}], 600.0) == 4.0 * PATIENCE
    assert patience_s([{"wall_s": 300.0}], 600.0) == 600.0


@pytest.mark.faults
def test_a_draining_cloud_gives_its_share_to_the_others_at_the_next_round(planned):
    from crosscloud.core.federation import load_federation
    from crosscloud.pool.membership import activate, drain

    plan, stores = planned
    fed, home = load_federation(plan.federation_path), stores[plan.coordinator_cloud]
    for cloud, store in stores.items():
        _commit_delta(store, plan, cloud, 0)
    drain(fed, "singapore")
    try:
        with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):
            Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    finally:
        activate(fed, "singapore")
    shares = read_commit(home, plan.keys.global_step(1))["meta"]["next_shares"]
    planned_shares = {c.name: c.share for c in plan.clouds}
    assert shares["singapore"] == 0 and sum(shares.values()) == plan.spec.global_batch
    assert all(shares[c] > planned_shares[c] for c in ("beijing", "shanghai"))


def test_grid_directives_become_next_round_shares_and_caps(planned):
    from crosscloud.grid.demand_response import Action, write_directive

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
    _round_0_then_stall(plan, stores)
    home = stores[plan.coordinator_cloud]
    other = next(name for name in stores if name != plan.coordinator_cloud)
    before = read_commit(stores[other], plan.keys.global_step(1))
    stores[other].delete(f"{plan.keys.global_step(1)}/COMMIT.json")
    assert read_commit(home, plan.keys.global_step(1)) is not None
    with pytest.raises(SubTaskLost, match="round 1: no pseudo-gradient"):
        Coordinator(plan, stores, handles=[], log=lambda m: None).run()
    assert read_commit(stores[other], plan.keys.global_step(1)) == before


def test_the_last_output_of_a_remote_subtask_reaches_the_log_after_the_last_round(planned, monkeypatch):
    # a remote host is asked for new output only every so often; the sub-task prints its last line and exits
    # after its last commit, which can be after the coordinator's last ask
    import time

    from crosscloud.backends import BACKENDS, Backend

    ends = time.monotonic() + 2.0

    class SlowHost(Backend):
        name = "slowhost"

        def state(self, handle):
            return "running" if time.monotonic() < ends else "succeeded"

        def logs(self, handle, offset=0):
            return ("round 1: loss 1.0 -> 0.9\n", 1) if offset == 0 and self.state(handle) != "running" else ("", offset)

    monkeypatch.setitem(BACKENDS, "slowhost", SlowHost)
    plan, stores = planned
    for cloud, store in stores.items():
        for r in (0, 1):
            _commit_delta(store, plan, cloud, r)
    logs = []
    Coordinator(plan, stores, handles=[{"backend": "slowhost", "cloud": "singapore"}], log=logs.append).run()
    assert "[singapore] round 1: loss 1.0 -> 0.9" in logs
