"""The distribution planner: what is warm where, under byte budgets, with pins and eviction."""

from __future__ import annotations

import json

import pytest

from crosscloud.artifacts.distribution import Artifact, Pin, PinsOverBudget, Use, choose_warm_sets, demand
from synthetic_catalog import SYNTHETIC_NOW, synthetic_catalog

NOW = 1_000_000.0
GB = 10**9


def _cat(**sizes: int) -> dict[str, Artifact]:
    return {n: Artifact(n, "model", s) for n, s in sizes.items()}


def _one(artifacts, held, budget, dem, pins=(), cloud="c1", **kw):
    return choose_warm_sets(artifacts, {cloud: held}, {cloud: budget}, {(a, cloud): d for a, d in dem.items()},
                list(pins), NOW, **kw).clouds[cloud]


def _names(entries):
    return [e[0] for e in entries]


def test_hand_computed_demand_scores():
    uses = [
        Use("c1", ("m",), at=NOW - 10, weight=1.0),   # one half-life old: p = 0.5
        Use("c1", ("m", "m"), at=NOW - 20),           # two half-lives: p = 0.25 (read twice, counted once)
        Use("c2", ("m",), at=NOW, weight=0.4),        # migration candidate: p = 0.4
        Use("c2", ("d",), at=NOW + 100),              # planned run: age clamped, p = 1
    ]
    d = demand(uses, NOW, half_life_s=10)
    assert d[("m", "c1")] == pytest.approx(1 - 0.5 * 0.75)  # 0.625
    assert d[("m", "c2")] == pytest.approx(0.4)
    assert d[("d", "c2")] == pytest.approx(1.0)
    assert ("d", "c1") not in d  # sparse: only pairs some job used


def test_demand_decays_with_age_and_grows_with_uses():
    fresh = demand([Use("c", ("a",), NOW - 3600)], NOW)[("a", "c")]
    old = demand([Use("c", ("a",), NOW - 30 * 86400)], NOW)[("a", "c")]
    assert 0 < old < fresh <= 1
    once = demand([Use("c", ("a",), NOW - 86400, 0.3)], NOW)[("a", "c")]
    thrice = demand([Use("c", ("a",), NOW - 86400, 0.3)] * 3, NOW)[("a", "c")]
    assert once < thrice < 1
    # The same history seen later is colder.
    later = demand([Use("c", ("a",), NOW - 3600)], NOW + 7 * 86400)[("a", "c")]
    assert later == pytest.approx(fresh / 2)


def test_hand_computed_plan_scores():
    arts = _cat(a=100, b=50)
    cp = _one(arts, {"a": 40, "b": 50}, 1000, {"a": 0.5, "b": 0.2})
    assert cp.fetch == [("a", 60, pytest.approx(30.0))]  # demand x missing bytes
    assert cp.keep == [("b", 50, pytest.approx(10.0))]   # demand x size
    assert cp.used_bytes == 150 and cp.evict == []


def test_budget_never_exceeded():
    arts, held, budgets, dem, pins = synthetic_catalog(3000, 5, 300 * GB, seed=7)
    p = choose_warm_sets(arts, held, budgets, dem, pins, SYNTHETIC_NOW)
    assert set(p.clouds) == set(budgets)
    for cloud, cp in p.clouds.items():
        chosen = _names(cp.fetch) + _names(cp.keep)
        assert len(chosen) == len(set(chosen))
        assert cp.used_bytes == sum(arts[n].size for n in chosen) <= budgets[cloud]
        assert cp.fetch_bytes == sum(arts[n].size - min(arts[n].size, held[cloud].get(n, 0)) for n in _names(cp.fetch))
    # Tight budgets too: only the item that fits is taken, larger ones are skipped.
    arts = _cat(big=70, mid=40, small=25)
    cp = _one(arts, {}, 100, {"big": 0.9, "mid": 0.8, "small": 0.7})
    assert _names(cp.fetch) == ["big", "small"] and cp.used_bytes == 95


def test_pins_kept_even_when_cold_and_expired_pins_are_not():
    arts = _cat(pinned=60, expired=30, hot=40)
    pins = [Pin("pinned", "c1", NOW + 3600), Pin("expired", "c1", NOW - 1), Pin("hot", "elsewhere", NOW + 3600)]
    cp = _one(arts, {"pinned": 60, "expired": 30}, 100, {"hot": 0.9}, pins)
    assert cp.pinned == ["pinned"]
    assert _names(cp.keep) == ["pinned"]                 # no demand at all, yet kept
    assert _names(cp.fetch) == ["hot"]
    assert cp.evict == [("expired", 30)]                 # its pin ran out and nothing needs it
    # A pin that expires exactly now has expired.
    cp = _one(arts, {"pinned": 60}, 100, {}, [Pin("pinned", "c1", NOW)])
    assert cp.pinned == [] and cp.evict == [("pinned", 60)]


def test_pins_are_fetched_first():
    arts = _cat(p=50, hot=60)
    cp = _one(arts, {}, 100, {"hot": 1.0}, [Pin("p", "c1", NOW + 10)])
    assert _names(cp.fetch) == ["p"] and cp.used_bytes == 50  # the hot one no longer fits


def test_pins_over_budget_raise_naming_the_cloud():
    arts = _cat(x=60, y=50)
    pins = [Pin("x", "tokyo", NOW + 10), Pin("y", "tokyo", NOW + 10)]
    with pytest.raises(PinsOverBudget) as err:
        choose_warm_sets(arts, {}, {"tokyo": 100, "paris": 100}, {}, pins, NOW)
    msg = str(err.value)
    assert "tokyo" in msg and "x" in msg and "y" in msg and "110" in msg and "100" in msg
    assert err.value.cloud == "tokyo" and err.value.pinned_bytes == 110
    # The same pins, expired, are no problem.
    choose_warm_sets(arts, {}, {"tokyo": 100}, {}, [Pin("x", "tokyo", NOW - 1), Pin("y", "tokyo", NOW - 1)], NOW)


def test_pin_on_unknown_artifact_is_an_error():
    with pytest.raises(ValueError, match="ghost"):
        choose_warm_sets(_cat(a=1), {}, {"c1": 10}, {}, [Pin("ghost", "c1", NOW + 10)], NOW)


def test_hotter_artifact_displaces_colder_one():
    arts = _cat(cold=80, hot=80)
    cp = _one(arts, {"cold": 80}, 100, {"cold": 0.2, "hot": 0.9})
    assert _names(cp.fetch) == ["hot"] and cp.keep == []
    assert cp.evict == [("cold", 80)]


def test_held_artifact_kept_over_equally_demanded_missing_one():
    arts = _cat(here=80, there=80)
    cp = _one(arts, {"here": 80}, 100, {"here": 0.5, "there": 0.5})
    assert _names(cp.keep) == ["here"] and cp.fetch == [] and cp.evict == []
    # Stickiness: a slightly hotter newcomer does not make the plan thrash; a clearly hotter one does.
    cp = _one(arts, {"here": 80}, 100, {"here": 0.5, "there": 0.52})
    assert _names(cp.keep) == ["here"]
    cp = _one(arts, {"here": 80}, 100, {"here": 0.5, "there": 0.6})
    assert _names(cp.fetch) == ["there"]
    cp = _one(arts, {"here": 80}, 100, {"here": 0.5, "there": 0.5}, stickiness=0.0)
    assert _names(cp.keep) == ["here"]  # equal density without stickiness: held still wins the tie
    cp = _one(arts, {"here": 80}, 100, {"here": 0.5, "there": 0.52}, stickiness=0.0)
    assert _names(cp.fetch) == ["there"]


def test_eviction_lists_exactly_held_but_not_chosen_coldest_first():
    arts = _cat(a=30, b=30, c=30, d=30, e=30)
    held = {"a": 30, "b": 30, "c": 10, "d": 30, "unknown": 5}
    cp = _one(arts, held, 60, {"a": 0.9, "b": 0.1, "c": 0.3, "e": 0.95})
    chosen = set(_names(cp.fetch) + _names(cp.keep))
    assert chosen == {"e", "a"}
    assert {n for n, _ in cp.evict} == {n for n in held if n not in chosen}
    assert cp.evict == [("d", 30), ("unknown", 5), ("b", 30), ("c", 10)]  # demand 0 first, then by demand
    assert cp.evict_bytes == 75


def test_plan_serialises_and_formats():
    arts, held, budgets, dem, pins = synthetic_catalog(500, 3, 50 * GB, seed=1)
    p = choose_warm_sets(arts, held, budgets, dem, pins, SYNTHETIC_NOW)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["totals"]["fetch_bytes"] == p.fetch_bytes == sum(c.fetch_bytes for c in p.clouds.values())
    assert set(d["clouds"]) == set(budgets)
    table = p.format()
    assert all(c in table for c in budgets) and "total" in table


def test_synthetic_catalog_is_deterministic_per_seed():
    a = synthetic_catalog(2000, 4, 100 * GB, seed=3)
    b = synthetic_catalog(2000, 4, 100 * GB, seed=3)
    c = synthetic_catalog(2000, 4, 100 * GB, seed=4)
    assert a == b and a != c
    arts, held, budgets, dem, pins = a
    assert len(arts) == 2000 and len(budgets) == 4
    assert sum(x.size for x in arts.values()) == pytest.approx(100 * GB, rel=0.01)
    assert {x.kind for x in arts.values()} <= {"model", "dataset", "image", "checkpoint"}
    assert all(0 < v <= 1 for v in dem.values())
    assert any(0 < n < arts[k].size for h in held.values() for k, n in h.items())  # some partially held
    assert all(sum(h.values()) <= budgets[c] for c, h in held.items())
