"""Distribution over real stores: demand from real runs, pins, eviction that frees packs, fetches that warm."""

from __future__ import annotations

import json
import os

import pytest

from crosscloud.artifacts.catalog import apply, choose_tenant_warm_sets, load_catalog
from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.pipeline.stages import admit_stage, preheat_stage, release_stage
from crosscloud.store.chunks import put_blob

T = "team-b"  # a tenant of its own, so other tests' runs do not count as demand here


@pytest.fixture(scope="module")
def run():
    ref = admit_stage(JobSpec(tenant=T, rounds=1, inner_steps=1, model_size="tiny"), "catalog-run")
    preheat_stage(ref)
    release_stage(ref)
    return ref.load()


def test_demand_comes_from_runs_and_cold_artifacts_are_evicted(run, tmp_path):
    fed, plan = run
    cold = os.urandom(400_000)
    cold_ref, _ = put_blob(load_catalog(fed, T, ["shanghai"]).stores["shanghai"], T, cold, kind="checkpoint")
    clouds = [c.name for c in plan.clouds]
    cat, result = choose_tenant_warm_sets(fed, T, clouds, 10**9, 7 * 86400, ledger=Ledger(tmp_path / "l.sqlite"))
    used_there = {p.sha256 for c in plan.clouds if c.name == "shanghai" for p in [plan.program.code, *(plan.shards[i] for i in c.shards)]}
    shanghai = result.clouds["shanghai"]
    assert used_there <= {a for a, _, _ in shanghai.keep}  # what its run read stays warm
    assert [a for a, _ in shanghai.evict] == [cold_ref.sha256]  # nobody needs the checkpoint
    done = apply(fed, cat, shanghai)
    assert done["freed_bytes"] >= len(cold)  # its pack held nothing a kept artifact uses
    after = load_catalog(fed, T, ["shanghai"])
    assert cold_ref.sha256 not in after.present["shanghai"]
    assert all(after.warmth(sha, "shanghai", verify=True).warm for sha in used_there)


def test_a_pinned_artifact_is_fetched_and_kept_whatever_its_demand(run, tmp_path):
    fed, _ = run
    model, _ = put_blob(load_catalog(fed, T, ["beijing"]).stores["beijing"], T, os.urandom(300_000), kind="model")
    ledger = Ledger(tmp_path / "l.sqlite")
    cat, result = choose_tenant_warm_sets(fed, T, ["beijing", "singapore"], 10**9, 7 * 86400, pin=[model.sha256],
                                    pin_s=3600, ledger=ledger)
    singapore = result.clouds["singapore"]
    assert model.sha256 in singapore.pinned and model.sha256 in [a for a, _, _ in singapore.fetch]
    done = apply(fed, cat, singapore)
    assert done["total_sent_bytes"] > 0 and set(done["read_from"]) == {"beijing"}
    assert load_catalog(fed, T, ["singapore"]).warmth(model.sha256, "singapore", verify=True).warm
    again = apply(fed, load_catalog(fed, T, ["beijing", "singapore"]), singapore)
    assert again["total_sent_bytes"] == 0  # never sent twice


def test_pins_over_budget_and_unknown_artifacts_are_refused(run, tmp_path):
    fed, plan = run
    with pytest.raises(ValueError, match="not in tenant team-b's catalog"):
        choose_tenant_warm_sets(fed, T, ["beijing"], 10**9, 86400, pin=["0" * 64], pin_s=60, ledger=Ledger(tmp_path / "a"))
    with pytest.raises(ValueError, match="beijing"):
        choose_tenant_warm_sets(fed, T, ["beijing"], 10, 86400, pin=[plan.program.code.sha256], pin_s=60, ledger=Ledger(tmp_path / "b"))


def test_warm_command_shows_each_artifact_on_each_cloud(run, capsys):
    from crosscloud import cli

    _, plan = run
    assert cli.main(["warm", "--tenant", T, "--json", "--verify"]) == 0
    rows = {r["artifact"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[plan.program.code.sha256]["clouds"]["beijing"] == "warm"
    shard_of_beijing = plan.shards[plan.cloud("beijing").shards[0]].sha256
    assert rows[shard_of_beijing]["clouds"]["beijing"] == "warm"
    assert rows[plan.program.code.sha256]["kind"] == "program"


def test_transfers_are_capped_only_while_runs_train_on_the_cloud(tmp_path):
    from crosscloud.artifacts.catalog import protective_cap

    fed, ledger = load_federation(), Ledger(tmp_path / "l.sqlite")
    assert protective_cap(fed, "singapore", 0.5, ledger) is None  # idle: full speed
    ledger.admit("team-a", "training", lambda usage: [("singapore", "cpu", 1)], {("singapore", "cpu"): 2}, {"singapore": 2})
    cap = protective_cap(fed, "singapore", 0.5, ledger)
    assert cap.rate == 0.5 * 100e6 / 8  # half of its 100 Mbit/s links
