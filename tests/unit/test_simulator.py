"""The trace-driven simulator: queue order, forwarding, residency, split jobs, capacity and metrics."""

from __future__ import annotations

import random

import pytest

from crosscloud.pool.placement import Site, Weights
from simulation import POLICIES, Center, SimJob, metrics, simulate


def _job(id, home, t, devices, v100=None, k80=None, data=0, resident=False, **rt):
    runtime = dict(rt)
    if v100 is not None:
        runtime["v100"] = v100
    if k80 is not None:
        runtime["k80"] = k80
    return SimJob(id, home, t, devices, runtime, data, resident)


def _by_id(result):
    return {o.job.id: o for o in result.outcomes}


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "greedy"])
def test_fifo_with_easy_backfill(policy):
    centers = [Center("A", "v100", 4, "X")]
    jobs = [
        _job("j1", "A", 0, 2, v100=100),
        _job("j2", "A", 1, 4, v100=50),  # blocked until j1 ends at 100: it reserves t=100
        _job("j3", "A", 2, 2, v100=40),  # fits now and ends (42) before the reservation: backfilled
        _job("j4", "A", 3, 1, v100=200),  # would delay j2: waits behind it
    ]
    out = _by_id(simulate(centers, jobs, policy))
    assert {k: o.dispatch_s for k, o in out.items()} == {"j1": 0, "j2": 100, "j3": 2, "j4": 150}
    assert out["j4"].finish_s == 350


def test_greedy_lets_small_jobs_overtake_a_large_one_and_the_queue_does_not():
    """Admission before the queue started whatever fitted: a stream of 1-device jobs kept a 4-device job waiting."""
    centers = [Center("A", "v100", 4, "X")]
    jobs = [_job("first", "A", 0, 2, v100=100), _job("big", "A", 1, 4, v100=50)]
    jobs += [_job(f"s{i}", "A", 2 + 20 * i, 1, v100=60) for i in range(12)]  # always one ends as the next arrives
    greedy, queue = _by_id(simulate(centers, jobs, "greedy")), _by_id(simulate(centers, jobs, "crosscloud"))
    assert queue["big"].dispatch_s == 100  # its reservation: nothing that would delay it starts before
    assert greedy["big"].dispatch_s > 200


@pytest.mark.parametrize("policy", ["first_fit", "crosscloud"])
def test_job_forwarded_with_its_data_when_its_center_is_full(policy):
    centers = [Center("A", "v100", 1, "X"), Center("B", "v100", 1, "X")]
    jobs = [_job("long", "A", 0, 1, v100=1000), _job("j", "A", 1, 1, v100=100, data=2_000_000_000)]
    res = simulate(centers, jobs, policy, bandwidth_bytes_per_s=1e9)
    o = _by_id(res)["j"]
    assert o.parts == (("B", 1),) and o.forwarded
    assert (o.dispatch_s, o.run_start_s, o.finish_s) == (1, 3, 103)  # 2 s to move 2 GB, then 100 s
    assert o.bytes_forwarded == 2_000_000_000
    assert metrics(res)["bytes_forwarded"] == 2_000_000_000 and metrics(res)["forwarded_jobs"] == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_resident_job_waits_in_its_jurisdiction(policy):
    centers = [Center("A", "v100", 1, "X"), Center("B", "v100", 1, "Y")]
    jobs = [_job("long", "A", 0, 1, v100=1000, resident=True), _job("j", "A", 1, 1, v100=100, resident=True)]
    o = _by_id(simulate(centers, jobs, policy))["j"]
    assert o.parts == (("A", 1),) and o.dispatch_s == 1000


@pytest.mark.parametrize("policy", ["crosscloud", "static_split"])
def test_split_job_runs_at_the_combined_rate_with_the_penalty(policy):
    centers = [Center("A", "v100", 2, "X"), Center("B", "k80", 2, "X")]
    job = _job("big", "A", 0, 4, v100=100, k80=300)  # no center holds 4 devices
    o = _by_id(simulate(centers, [job], policy, split_penalty=0.1))["big"]
    assert sorted(o.parts) == [("A", 2), ("B", 2)]
    # half the devices at 1/100 of the job per second, half at 1/300: 1 / (0.5/100 + 0.5/300) = 150 s, +10 %
    assert o.finish_s == pytest.approx(165.0)
    assert metrics(simulate(centers, [job], "independent"))["unfinished"] == 1  # alone, A can never run it


def _random_scenario(seed: int, n: int = 150):
    rng = random.Random(seed)
    centers = [Center("v", "v100", 8, "X"), Center("p", "p100", 4, "X"), Center("k", "k80", 6, "Y")]
    jobs = []
    for i in range(n):
        v = rng.uniform(10, 500)
        jobs.append(SimJob(f"j{i}", rng.choice("vpk"), rng.uniform(0, 3000), rng.choice([1, 1, 1, 2, 4, 8]),
                           {"v100": v, "p100": v * rng.uniform(1, 2), "k80": v * rng.uniform(2, 5)},
                           rng.randrange(0, 10**10), rng.random() < 0.3))
    return centers, jobs


@pytest.mark.parametrize("policy", POLICIES)
def test_no_center_ever_over_its_devices_and_residency_holds(policy):
    centers, jobs = _random_scenario(7)
    total = {c.name: c.devices for c in centers}
    seen = []

    def observe(t, used):
        seen.append(t)
        for name, u in used.items():
            assert 0 <= u <= total[name], (t, name, u)

    res = simulate(centers, jobs, policy, window_s=3000, split_penalty=0.05, observe=observe)
    assert len(seen) == res.events > 0
    # the same from the outcomes: devices held over [dispatch, finish) never exceed the center's count
    for c in centers:
        spans = [(o.dispatch_s, o.finish_s, n) for o in res.outcomes for name, n in o.parts if name == c.name]
        for t, _, _ in spans:
            assert sum(n for a, b, n in spans if a <= t < b) <= c.devices
    jur = {c.name: c.jurisdiction for c in centers}
    for o in res.outcomes:
        assert sum(n for _, n in o.parts) == o.job.devices
        assert o.dispatch_s >= o.job.arrival_s
        if o.job.resident:
            assert {jur[name] for name, _ in o.parts} == {jur[o.job.home]}
    # a job is left unrun only when the centers it may use can never hold it (split over several where allowed)
    for j in res.unfinished:
        allowed = [c.devices for c in centers if not j.resident or c.jurisdiction == jur[j.home]]
        if policy == "independent":
            allowed = [c.devices for c in centers if c.name == j.home]
        can_split = policy in ("static_split", "crosscloud") and len(allowed) > 1
        assert j.devices > (sum(allowed) if can_split else max(allowed))
    assert res.unfinished or policy != "crosscloud"  # the scenario has such jobs (8 devices, resident in Y)


def test_metric_definitions_on_a_hand_computed_case():
    centers = [Center("F", "v100", 1, "X"), Center("S", "k80", 1, "X")]
    jobs = [_job("j1", "S", 0, 1, v100=10, k80=30), _job("j2", "S", 0, 1, v100=10, k80=30)]
    m = metrics(simulate(centers, jobs, "independent", window_s=100))
    # on S alone: j1 runs 0-30, j2 30-60; ideal = 10 s each (v100, the fastest type present)
    assert m["efficiency"] == pytest.approx((10 / 30 + 10 / 60) / 2)
    assert m["mean_jct_s"] == pytest.approx(45) and m["p95_jct_s"] == pytest.approx(60)
    assert m["utilization"] == {"F": 0.0, "S": pytest.approx(0.6)}
    assert m["useful_device_hours_per_hour"] == pytest.approx(20 / 100)
    assert m["forwarded_jobs"] == 0 and m["bytes_forwarded"] == 0 and m["unfinished"] == 0
    # a window that ends mid-run counts the part of the run inside it: j2 is half done at 45
    m = metrics(simulate(centers, jobs, "independent", window_s=45))
    assert m["utilization"]["S"] == pytest.approx(1.0)
    assert m["useful_device_hours_per_hour"] == pytest.approx((10 + 5) / 45)
    # crosscloud sends j1 to the idle, faster center; j2 starts at once on its own, slower one, since no job waits
    # while devices it fits are idle
    m = metrics(simulate(centers, jobs, "crosscloud", window_s=100))
    assert m["efficiency"] == pytest.approx((10 / 10 + 10 / 30) / 2)
    assert m["faster_jobs"] == 1 and m["forwarded_jobs"] == 1
    # a federation that lets jobs wait for a faster pool: j2 waits 10 s on F rather than run 30 s on S
    m = metrics(simulate(centers, jobs, "crosscloud", window_s=100, weights=Weights(wait_for_faster=True)))
    assert m["efficiency"] == pytest.approx((10 / 10 + 10 / 20) / 2)
    assert m["faster_jobs"] == 2 and m["forwarded_jobs"] == 2


def test_static_split_divides_by_weight_and_sends_single_devices_round_robin():
    centers = [Center("A", "v100", 4, "X"), Center("B", "v100", 4, "X")]
    jobs = [_job(f"j{i}", "A", i, 1, v100=1) for i in range(4)]
    out = _by_id(simulate(centers, jobs, "static_split"))
    assert [out[f"j{i}"].parts for i in range(4)] == [(("A", 1),), (("B", 1),), (("A", 1),), (("B", 1),)]


def test_unknown_policy_and_missing_run_time_are_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        simulate([Center("A", "v100", 1, "X")], [], "best")
    with pytest.raises(ValueError, match="no run time on k80"):
        simulate([Center("A", "k80", 1, "X")], [_job("j", "A", 0, 1, v100=1)], "independent")


def test_site_wait_counts_the_devices_queued_ahead_and_backfills_only_what_does_not_delay_them():
    site = Site("A", "v100", "X", total=4, free=1, frees=((10.0, 1), (20.0, 1), (30.0, 2)),
                queued_device_s=2 * 500.0, queued_devices=2)
    # the two queued devices take the free one and the release at 10, this job's comes at 20; but never
    # sooner than the queued work spread over the pool (1000 device-seconds / 4)
    assert site.wait_s(1) == 250.0
    # none free: the releases at 10 and 20 go to the queued jobs, this job's device comes at 30
    assert Site("A", "v100", "X", 4, 0, frees=((10.0, 1), (20.0, 1), (30.0, 2)), queued_device_s=8.0,
                queued_devices=2).wait_s(1) == 30.0
    # backfill: the free device may be held if it is given back by 10 s, when the queued jobs could start
    assert site.backfills(1, 10.0) and not site.backfills(1, 11.0) and not site.backfills(2, 1.0)
    # queued work of unknown shape (the DAGs' view): no backfill, as before
    assert not Site("A", "v100", "X", 4, 4, queued_device_s=10.0).backfills(1, 1.0)


def test_a_split_never_puts_two_parts_on_one_cloud():
    from crosscloud.pool.placement import JobRequest, Site, place

    sites = [Site("x", "v100", "A", 2, 2, families=frozenset({"f"})), Site("x", "p100", "A", 2, 2, families=frozenset({"f"})),
             Site("y", "v100", "A", 2, 2, families=frozenset({"f"}))]
    decision = place(JobRequest("j", "t", "f", 4, {"v100": 100.0, "p100": 200.0}), sites)
    clouds = [p.cloud for p in decision.option.parts]
    assert len(clouds) == len(set(clouds)) and sum(p.devices for p in decision.option.parts) == 4
