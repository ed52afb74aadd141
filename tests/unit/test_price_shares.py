"""Price-driven shares of a running run: when moving a cloud's share pays, and the directives that carry it."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from federations import embedded

from crosscloud.core.job import JobSpec
from crosscloud.core.presets import preset
from crosscloud.grid.demand_response import Action, read_directives, write_directive
from crosscloud.grid.following_prices import CloudRate, choose_away, cost_per_work, follow_prices
from crosscloud.run.plan import CloudAssignment, Plan
from crosscloud.store.chunks import BlobRef
from crosscloud.store.open_store import open_store


def _rate(name, price, rental=0.0, throughput=1.0, devices=1):
    return CloudRate(name, devices, throughput, rental, busy_w=1000.0, idle_w=100.0, pue=1.0, price_usd_mwh=price)


def test_cost_per_work_counts_idle_draw_of_held_devices_and_the_slower_run():
    clouds = [_rate("a", 100.0), _rate("b", 300.0)]
    # both train: (0.1 + 0.3) USD/h over 2 units of throughput
    assert cost_per_work(clouds, frozenset()) == pytest.approx(0.2)
    # b idles: (0.1 + 0.03) USD/h over 1 unit
    assert cost_per_work(clouds, frozenset({"b"})) == pytest.approx(0.13)
    assert cost_per_work(clouds, frozenset({"a", "b"})) == float("inf")


def test_a_price_spike_moves_the_dear_clouds_share_away_when_devices_are_owned():
    clouds = [_rate("a", 50.0), _rate("b", 60.0), _rate("c", 900.0)]
    assert choose_away(clouds) == {"c"}
    # the same spike with rented devices: the slower run's rental outweighs the energy saved
    rented = [_rate(c.name, c.price_usd_mwh, rental=2.0) for c in clouds]
    assert choose_away(rented) == frozenset()


def test_the_slowdown_limit_and_the_run_keeps_training():
    clouds = [_rate("a", 900.0, throughput=3.0), _rate("b", 50.0)]
    assert choose_away(clouds, max_slowdown=1.5) == frozenset()  # taking a away makes the run 4x slower
    assert choose_away(clouds, max_slowdown=10.0) == {"a"}
    assert choose_away([_rate("a", 900.0), _rate("b", 950.0)], max_slowdown=10.0) != {"a", "b"}


def test_small_gains_do_not_flip_shares_back_and_forth():
    # c at 120: without its share the run pays 0.6 % less per unit of work; at 115, 0.7 % more
    dearer = [_rate("a", 100.0), _rate("b", 100.0), _rate("c", 120.0)]
    assert cost_per_work(dearer, frozenset({"c"})) < cost_per_work(dearer, frozenset())
    assert choose_away(dearer, current=frozenset(), max_slowdown=2.0, min_gain=0.02) == frozenset()
    assert choose_away(dearer, current=frozenset(), max_slowdown=2.0, min_gain=0.0) == {"c"}
    cheaper = [_rate("a", 100.0), _rate("b", 100.0), _rate("c", 115.0)]
    assert cost_per_work(cheaper, frozenset()) < cost_per_work(cheaper, frozenset({"c"}))
    assert choose_away(cheaper, current=frozenset({"c"}), max_slowdown=2.0, min_gain=0.02) == {"c"}


def test_clouds_a_grid_request_holds_stay_away_and_are_not_chosen():
    clouds = [_rate("a", 50.0), _rate("b", 900.0), _rate("c", 60.0)]
    assert choose_away(clouds, fixed=frozenset({"b"}), held=frozenset({"b"}), max_slowdown=2.0) == frozenset()
    assert choose_away(clouds, held=frozenset({"b"}), max_slowdown=2.0) == frozenset()  # e.g. throttled by the grid


def _prices(root, region, value):
    folder = root / "electricity" / "prices"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [f"2023-07-10 {h:02d}:00:00+00:00,,{value}" for h in range(24)]
    (folder / f"{region}_2023.csv").write_text("Datetime (UTC),Datetime (Local),Price (USD/MWh)\n" + "\n".join(rows))


@pytest.fixture()
def run(tmp_path, monkeypatch):
    """A three-cloud run of the embedded federation (devices owned: no rental) and a feed where singapore spikes."""
    monkeypatch.setenv("CROSSCLOUD_DATA_DIR", str(tmp_path / "data"))
    for region, price in (("DE-LU", 40.0), ("US-CAL-CISO", 30.0), ("SG", 4000.0)):
        _prices(tmp_path / "data", region, price)

    def owned(raw):
        for c in raw["clouds"]:
            for p in c["pools"]:
                p["price_per_device_hour"] = 0.0

    fed = embedded(owned)
    blob = BlobRef(sha256="0" * 64, size=1)
    clouds = [CloudAssignment(name=n, role=fed.cloud(n).role, method="local", accelerator="cpu", devices=2, throughput=2.0,
                              share=8, shards=[0], image="") for n in ("beijing", "shanghai", "singapore")]
    run_id = f"prices-{time.time_ns()}"
    spec = JobSpec(follow_prices=True)
    plan = Plan(tenant="team-a", run_id=run_id, federation=fed.name, federation_path="", job=spec, model=preset(spec.model_size),
                outer=spec.outer, coordinator_cloud="beijing", clouds=clouds, candidates=[], dataset="python-stdlib",
                shards=[blob], held_out=blob, init=blob, created_at=time.time())
    home = open_store(fed.local_cloud, "team-a")
    plan.save(home)
    return fed, plan, home


NOON = datetime(2023, 7, 10, 12, tzinfo=timezone.utc).timestamp()


def test_follow_prices_writes_a_shift_directive_and_withdraws_it_when_prices_fall(run, tmp_path):
    fed, plan, home = run
    decision = follow_prices(fed, "team-a", plan.run_id, now=NOON)
    assert decision["away"] == ["singapore"] and decision["cost_chosen"] < decision["cost_now"]
    directive = read_directives(home, plan.keys.root)["singapore"]
    assert directive["kind"] == "shift" and directive["request"]["source"] == "prices"
    assert follow_prices(fed, "team-a", plan.run_id, now=NOON)["changed"] == []  # settled: nothing rewritten
    _prices(tmp_path / "data", "SG", 35.0)
    from crosscloud.pool import inventory

    inventory._FEEDS.clear()  # the feed caches files it has read
    decision = follow_prices(fed, "team-a", plan.run_id, now=NOON)
    assert decision["away"] == [] and decision["changed"] == ["singapore"]
    assert read_directives(home, plan.keys.root) == {}


def test_follow_prices_leaves_a_grid_request_alone(run):
    fed, plan, home = run
    grid = Action("team-a", plan.run_id, "throttle", 0.7, 0.9, 10.0, 0.05)
    write_directive(home, plan.keys.root, "singapore", grid, {"cloud": "singapore", "reduce_pct": 10})
    follow_prices(fed, "team-a", plan.run_id, now=NOON)
    assert read_directives(home, plan.keys.root)["singapore"]["kind"] == "throttle"


def test_an_unknown_price_changes_nothing_and_says_why(run):
    fed, plan, home = run
    decision = follow_prices(fed, "team-a", plan.run_id, now=datetime(2023, 8, 1, tzinfo=timezone.utc).timestamp())
    assert decision["changed"] == [] and len(decision["unknown"]) == 3
    assert read_directives(home, plan.keys.root) == {}


def test_only_runs_that_asked_for_it_follow_prices(run, ledger):
    fed, plan, home = run
    other = plan.model_copy(update={"run_id": plan.run_id + "-fixed", "job": JobSpec(follow_prices=False)})
    other.save(home)
    capacity = fed.capacity()
    quotas = dict(fed.tenant("team-a").quotas)
    for p in (plan, other):
        ledger.admit("team-a", p.run_id, lambda usage: [("beijing", "cpu", 1)], capacity, quotas)
    from crosscloud.grid.following_prices import follow_prices_all

    decisions = follow_prices_all(fed, ledger, now=NOON)
    assert [d["run_id"] for d in decisions] == [plan.run_id]
    assert read_directives(home, other.keys.root) == {}


@pytest.mark.queue
def test_a_run_the_queue_is_pausing_is_left_to_it(run, ledger):
    from crosscloud.grid.following_prices import follow_prices_all
    from crosscloud.scheduler.admission import entry_for
    from crosscloud.scheduler.entry import Decision, decision_json
    from crosscloud.scheduler.service import Queue

    fed, plan, home = run
    queue = Queue(fed, ledger, clock=lambda: NOON)
    queue.submit(entry_for(fed, JobSpec(clouds=["beijing"], devices_per_cloud=1), plan.run_id, "byte-lm", 0, set(),
                           NOON))
    queue.run_pass(force=True)
    row = ledger.queue.get("team-a", plan.run_id)
    assert row.state == "running"
    [d] = follow_prices_all(fed, ledger, now=NOON)  # not pausing: it follows prices as before
    assert not any(u.startswith("left to the queue") for u in d["unknown"])
    before = read_directives(home, plan.keys.root)
    ledger.queue.record([(row.id, decision_json(Decision("pause", "paused after its next committed round")))], NOON)
    [d] = follow_prices_all(fed, ledger, now=NOON)
    assert d["unknown"] == ["left to the queue: paused after its next committed round"] and d["changed"] == []
    assert read_directives(home, plan.keys.root) == before
