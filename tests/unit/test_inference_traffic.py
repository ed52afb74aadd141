"""Traffic placement by price, residency, warm clouds, grid requests, energy per token and the offline replay."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from crosscloud.energy.power import fit_power_curve
from crosscloud.serving.energy import ServedModel, electricity_usd, price_per_token, token_rates
from crosscloud.serving.offline import Scenario, crosscloud, evaluate, nearest, optimum, price_unaware
from crosscloud.serving.replay import ReplayCloud, Trace, build_replay, daily_profile, read_azure_trace
from crosscloud.serving.traffic import (TAIL, CloudOffer, Goal, GridCut, fill_cheapest, place_traffic, power_w,
                                        tail_at, utilisation_cap)

pytestmark = pytest.mark.inference

SERVICE = np.linspace(1.0, 6.0, 200)  # service times of the tenant's requests, seconds


def offer(name, price, jurisdiction="EU", capacity=1000.0, rtt_ms=20.0, warm=True, service=SERVICE, devices=8):
    return CloudOffer(name, "nvidia-h100", jurisdiction, capacity, price, rtt_ms, service, devices, 4, 32,
                      700.0, 70.0, 1.2, warm)


def goal(tps=600.0, **kw):
    return Goal(tps, kw.pop("p99_goal_s", 10.0), **kw)


def test_residency_never_sends_outside_the_allowed_jurisdictions():
    offers = [offer("eu-1", 5e-8), offer("us-1", 1e-8, "US"), offer("sg-1", 1e-9, "SG")]
    plan = place_traffic(goal(allowed_jurisdictions=frozenset({"EU"})), offers)
    assert plan.shares == {"eu-1": 1.0, "us-1": 0.0, "sg-1": 0.0}
    refused = {c.cloud: c.reason for c in plan.considered if not c.chosen}
    assert "jurisdiction US is outside" in refused["us-1"] and "jurisdiction SG" in refused["sg-1"]


def test_a_cloud_not_warm_gets_no_traffic_and_is_preheated_first():
    plan = place_traffic(goal(min_share=0.05), [offer("cheap", 1e-9, warm=False), offer("dear", 1e-7)])
    assert plan.shares["cheap"] == 0.0 and plan.replicas["cheap"] == 0
    assert plan.preheat_first == ["cheap"]
    assert "preheat first" in next(c.reason for c in plan.considered if c.cloud == "cheap")


def test_capacity_latency_and_standby_share_hold():
    offers = [offer("a", 1e-8, capacity=400.0), offer("b", 2e-8, capacity=400.0, rtt_ms=80.0),
              offer("c", 3e-8, capacity=2000.0), offer("far", 1e-9, rtt_ms=3000.0, service=SERVICE + 2)]
    g = goal(tps=900.0, min_share=0.03)
    plan = place_traffic(g, offers)
    assert sum(plan.shares.values()) == pytest.approx(1.0)
    tails = []
    for o in offers:
        rho = utilisation_cap(o, g)
        assert plan.tokens_per_s[o.name] <= o.capacity_tps * rho + 1e-6
        assert plan.shares[o.name] >= 0.03 - 1e-9  # warm standby everywhere usable
        tails.append(tail_at(o, g.p99_goal_s, rho))
    assert sum(plan.shares[o.name] * t for o, t in zip(offers, tails)) <= TAIL + 1e-9  # p99 <= the goal
    assert plan.latency_goal_met
    # the cheap but far cloud keeps little more than its standby: its requests would break the goal
    assert plan.shares["far"] < 0.2
    assert plan.shares["a"] == pytest.approx(400.0 * utilisation_cap(offers[0], g) / 900.0)


def test_fill_cheapest_is_the_lp_optimum():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(2, 7))
        prices = rng.uniform(0, 1, n)
        hi = rng.uniform(0.1, 0.6, n)
        lo = np.minimum(hi, rng.uniform(0, 0.1, n))
        if hi.sum() < 1 or lo.sum() > 1:
            continue
        lp = linprog(prices, A_eq=[np.ones(n)], b_eq=[1], bounds=list(zip(lo, hi)), method="highs")
        x = fill_cheapest(prices, lo, hi)
        assert x.sum() == pytest.approx(1.0) and np.all(x >= lo - 1e-12) and np.all(x <= hi + 1e-12)
        assert prices @ x == pytest.approx(lp.fun, abs=1e-12)


def test_a_grid_request_cuts_the_power_and_traffic_returns_when_it_ends():
    offers = [offer("cheap", 1e-9, capacity=2000.0, devices=16), offer("dear", 1e-7, capacity=2000.0, devices=16)]
    g = goal(tps=1200.0)
    before = place_traffic(g, offers)
    cut = GridCut("cheap", 30.0, 300.0)
    during = place_traffic(g, offers, [cut], in_force=before.tokens_per_s)
    shed = during.sheds[0]
    assert shed.after_w <= shed.before_w * 0.7 + 1e-6 and shed.held
    assert shed.replicas_before - shed.replicas_after >= 1  # it says how many replicas to remove
    power_after = power_w(offers[0], during.replicas["cheap"], during.tokens_per_s["cheap"])
    assert power_after <= shed.before_w * 0.7 + 1e-6
    assert during.shares["cheap"] < before.shares["cheap"] and sum(during.shares.values()) == pytest.approx(1.0)
    assert "grid request -30% power" in next(c.reason for c in during.considered if c.cloud == "cheap")
    after = place_traffic(g, offers)  # the request has ended: no cut passed
    assert after.shares == pytest.approx(before.shares)


def test_a_grid_request_is_planned_with_a_margin_for_the_routers_split():
    offers = [offer("cheap", 1e-9, capacity=2000.0, devices=16), offer("dear", 1e-7, capacity=2000.0, devices=16)]
    g = goal(tps=1200.0)
    before = place_traffic(g, offers).tokens_per_s
    exact = place_traffic(g, offers, [GridCut("cheap", 10.0, 300.0, margin_pct=0.0)], in_force=before).sheds[0]
    margin = place_traffic(g, offers, [GridCut("cheap", 10.0, 300.0)], in_force=before).sheds[0]
    assert exact.achieved_pct == pytest.approx(10.0, abs=0.01)
    assert margin.achieved_pct == pytest.approx(12.0, abs=0.01) and margin.held
    assert margin.limit_tps < exact.limit_tps


def test_energy_per_token_follows_the_inference_power_curve():
    curve = fit_power_curve(kind="inference")  # the synthetic sweep of tests/conftest.py: half cap -> 0.9 speed, 0.5 power
    model = ServedModel()
    full, half = token_rates("nvidia-a100", model), token_rates("nvidia-a100", model, cap=0.5, curve=curve)
    assert half.prefill_tps == pytest.approx(full.prefill_tps * 0.9)
    assert half.busy_w == pytest.approx(50.0 + (400.0 - 50.0) * 0.5)
    assert half.j_per_generated_token == pytest.approx(full.j_per_generated_token * (225.0 / 400.0) / 0.9)
    # prefill: 2 x 70e9 FLOP a token at half of the A100's 312 TFLOPS
    assert full.j_per_context_token == pytest.approx(400.0 / (312e12 * 0.5 / 140e9))
    assert float(electricity_usd(3.6e9, 100.0, 1.2)) == pytest.approx(120.0)  # 1 MWh at 100 USD/MWh, PUE 1.2
    p = price_per_token(full, 1000.0, 100.0, 100.0, 1.2, rental_per_device_hour=2.0, utilisation=0.5)
    assert p.rental == pytest.approx(2.0 / (full.mix_tps(1000.0, 100.0) * 3600 * 0.5))
    assert p.electricity == pytest.approx(float(full.energy_j(1000.0, 100.0)) / 1100 / 3.6e9 * 100 * 1.2)


def test_read_trace_and_replay_follow_the_profile(tmp_path):
    path = tmp_path / "trace.csv"
    rows = [f"2023-11-16 18:{m:02d}:00.0000000,{100 + m},{10 + m}" for m in range(60)]
    path.write_bytes(("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + "\r\n".join(rows)).encode())
    trace = read_azure_trace([path])
    assert len(trace) == 60 and trace.offset_s[-1] == 59 * 60 and trace.context[0] == 100
    profile = daily_profile(0.5, 12)
    replay = build_replay(trace, t0=24 * 19000, hours=48, peak_per_hour=120, profile=profile)
    counts = np.bincount(replay.hour, minlength=48)
    assert counts[12] == 120 and counts[0] == 60  # peak and trough (UTC = local here)
    assert len(replay) == sum(int(round(120 * profile[h % 24])) for h in range(48))


def small_scenario(prices: np.ndarray, grid=()):
    """Three clouds, six hours, a hand-sized trace: the optimum can be checked by hand."""
    hours = prices.shape[0]
    trace = Trace(np.arange(40) * 90.0, np.full(40, 500), np.full(40, 50), ("synthetic",))
    replay = build_replay(trace, 0, hours, 40, np.ones(24))
    clouds = [ReplayCloud("a", "A", "EU", "nvidia-h100", 8, 1.2, 20.0),
              ReplayCloud("b", "B", "EU", "nvidia-h100", 8, 1.2, 30.0),
              ReplayCloud("c", "C", "US", "nvidia-a100", 8, 1.1, 120.0, warm_from_h=2)]
    model = ServedModel()
    rates = [token_rates(c.accelerator, model) for c in clouds]
    sample = (trace.context, trace.generated)
    return Scenario(replay, clouds, rates, model, Goal(0.0, 30.0, None, 0.05), prices, lambda h: prices[h],
                    np.zeros(3), sample, list(grid))


def test_the_optimum_costs_no_more_than_any_policy():
    prices = np.array([[100, 50, 10], [100, 50, 10], [10, 50, 100], [50, 10, 100], [20, 20, 20], [80, 60, 5]], float)
    sc = small_scenario(prices)
    runs = [price_unaware(sc), nearest(sc), crosscloud(sc)]
    best = evaluate(sc, optimum(sc, runs[2].limits))
    for run in runs:
        assert best.electricity_usd <= evaluate(sc, run).electricity_usd + 1e-12
    # by hand: the demand fits any one cloud, so the optimum gives every usable cloud its 5 % standby and the rest
    # to the cheapest; c is not warm before hour 2
    assert np.allclose(optimum(sc, []).shares[0], [0.05, 0.95, 0.0])
    assert np.allclose(optimum(sc, []).shares[2], [0.90, 0.05, 0.05])
    assert evaluate(sc, crosscloud(sc)).electricity_usd == pytest.approx(best.electricity_usd)


def test_replay_grid_request_drains_during_its_hours_and_residency_holds_for_every_policy():
    from crosscloud.serving.offline import TimedCut

    prices = np.array([[10, 50, 100]] * 6, float)  # "a" is cheapest throughout
    sc = small_scenario(prices, [TimedCut(GridCut("a", 50.0, 300.0), 2, 2)])
    run = crosscloud(sc)
    a = [p.tokens_per_s["a"] for p in run.plans]
    free = [p.tokens_per_s["a"] for p in crosscloud(small_scenario(prices)).plans]
    assert a[2] < free[2] and a[3] < free[3]  # the cut hours
    assert a[:2] == pytest.approx(free[:2]) and a[4:] == pytest.approx(free[4:])  # before, and back after
    assert all(s.achieved_pct >= 50.0 for p in run.plans[2:4] for s in p.sheds)
    assert run.limits[2] and not run.limits[4]
    sc = small_scenario(prices)
    sc.goal = Goal(0.0, 30.0, frozenset({"EU"}), 0.05)
    for policy in (price_unaware, nearest, crosscloud):
        out = evaluate(sc, policy(sc))
        assert out.tokens_by_cloud["c"] == 0.0 and out.failed == 0


def test_the_replay_runs_the_replicas_of_a_rising_next_hour_ahead_and_follows_a_fall_only_when_it_comes():
    prices = np.array([[10, 50, 100]] * 8, float)
    trace = Trace(np.arange(40) * 90.0, np.full(40, 500), np.full(40, 50), ("synthetic",))
    profile = np.array([0.1, 0.2, 0.4, 0.8, 1.0, 0.5, 0.2, 0.1] + [0.1] * 16)  # a rise to hour 4, then a fall
    clouds = [ReplayCloud(n, n.upper(), "EU", "nvidia-h100", 64, 1.2, 20.0) for n in ("a", "b", "c")]
    model = ServedModel()
    sc = Scenario(build_replay(trace, 0, 8, 200000, profile), clouds, [token_rates(c.accelerator, model) for c in clouds],
                  model, Goal(0.0, 30.0, None, 0.05), prices, lambda h: prices[h], np.zeros(3),
                  (trace.context, trace.generated))
    run = crosscloud(sc)
    planned = [p.replicas for p in run.plans]
    assert all(run.replicas[h][c] >= n for h in range(8) for c, n in planned[h].items())
    for h in (2, 3):  # rising: the next hour's replicas are already running
        assert run.replicas[h]["a"] > planned[h]["a"] and run.replicas[h]["a"] >= planned[h + 1]["a"], (h, run.replicas)
    assert run.replicas[6:] == planned[6:]  # falling: no more than the hour's own plan
