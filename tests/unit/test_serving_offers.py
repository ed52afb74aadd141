"""A served model's offers from the federation: prices from the electricity feed, quotas, links, and the replan."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import torch
from federations import embedded

from crosscloud.core.federation import load_federation
from crosscloud.serving.energy import token_rates
from crosscloud.serving.offers import (RequestMix, cloud_offer, federation_offers, measured_rates, offer_from_dict,
                                       offer_to_dict, rtt_ms, served_model)
from crosscloud.serving.placement import ServingRequest, decision_record, replan
from crosscloud.serving.replica import ServeSpec
from crosscloud.serving.traffic import place_traffic
from crosscloud.store.tensors import to_bytes

pytestmark = pytest.mark.inference

WHEN = datetime(2023, 7, 10, 12, tzinfo=timezone.utc).timestamp()  # an hour the price files below cover
MIX = RequestMix(64.0, 16.0)
CLOUDS = ["beijing", "shanghai", "singapore"]


def _prices(root: Path, region: str, value: float, hours=range(24)) -> None:
    folder = root / "electricity" / "prices"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [f"2023-07-10 {h:02d}:00:00+00:00,,{value}" for h in hours]
    (folder / f"{region}_2023.csv").write_text("Datetime (UTC),Datetime (Local),Price (USD/MWh)\n" + "\n".join(rows))


@pytest.fixture()
def data(tmp_path, monkeypatch):
    """``data(REGION=price, ...)``: a new data folder in use, with these prices and the session's power sweep.

    Each call makes a folder of its own: the inventory keeps a feed (and its read prices) per folder.
    """
    sweep = Path(os.environ["CROSSCLOUD_DATA_DIR"]) / "power" / "dvfs_sweep.csv"
    made = []

    def write(**prices):
        root = tmp_path / f"data{len(made)}"
        made.append(root)
        (root / "power").mkdir(parents=True)
        shutil.copy(sweep, root / "power")
        for region, value in prices.items():
            _prices(root, region.replace("_", "-"), value)
        monkeypatch.setenv("CROSSCLOUD_DATA_DIR", str(root))
        return root

    return write


@pytest.fixture(scope="module")
def model():
    return served_model(to_bytes({"w": torch.zeros(64, 64), "b": torch.zeros(64)}))


def _offer(fed, cloud, model, tenant="team-a", users_near="beijing", warm=True, step_s=None, family=None):
    return cloud_offer(fed, fed.cloud(cloud), tenant, model, MIX, WHEN, users_near, warm, 0.9, step_s, family)


def test_served_model_reads_the_size_from_the_weights():
    weights = to_bytes({"w": torch.zeros(256, 256), "b": torch.zeros(256, dtype=torch.bfloat16)})
    m = served_model(weights, devices_per_replica=2)
    assert m.params_b * 1e9 == pytest.approx(256 * 256 + 256)
    # the weights' bytes over the parameters: float32 and bf16 mixed, plus the safetensors header
    assert m.weight_bytes == pytest.approx(len(weights))
    assert 256 * 256 * 4 + 256 * 2 < m.weight_bytes < 256 * 256 * 4 + 256 * 2 + 1024
    assert m.devices_per_replica == 2


def test_a_cheaper_electricity_price_gives_a_cheaper_token(data, model):
    fed = load_federation()
    data(DE_LU=40.0, US_CAL_CISO=40.0, SG=40.0)
    cheap = _offer(fed, "beijing", model)
    # the same cloud, another data folder where its grid's price is ten times higher
    data(DE_LU=400.0, US_CAL_CISO=40.0, SG=40.0)
    dear = _offer(fed, "beijing", model)
    assert dear.electricity_per_token == pytest.approx(10 * cheap.electricity_per_token)
    assert cheap.price_per_token < dear.price_per_token
    # the rental part is the same: the difference is all electricity
    assert dear.price_per_token - cheap.price_per_token == pytest.approx(
        dear.electricity_per_token - cheap.electricity_per_token)
    assert cheap.pue == 1.3 and cheap.devices == 4 and cheap.capacity_tps == dear.capacity_tps


def test_the_round_trip_is_zero_at_home_and_the_link_latency_elsewhere(data, model):
    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    assert rtt_ms(fed, "beijing", "beijing") == 0.0
    assert {c: _offer(fed, c, model).rtt_ms for c in CLOUDS} == {"beijing": 0.0, "shanghai": 25.0, "singapore": 50.0}
    assert _offer(fed, "singapore", model, users_near="shanghai").rtt_ms == 45.0
    assert _offer(fed, "singapore", model, users_near="singapore").rtt_ms == 0.0


def test_a_cloud_without_a_price_for_the_hour_is_refused_not_priced_at_zero(data, model):
    fed = load_federation()
    root = data(DE_LU=50.0, US_CAL_CISO=50.0)  # no SG file at all
    _prices(root, "DE-LU", 50.0, hours=[h for h in range(24) if h != 12])  # a gap at the hour placed
    gap = _offer(fed, "beijing", model)
    assert isinstance(gap, str) and gap.startswith("refused: no electricity price for 2023-07-10 12:00")
    assert "DE-LU" in gap
    missing = _offer(fed, "singapore", model)
    assert isinstance(missing, str) and "no electricity price" in missing and "SG" in missing
    offers, refused = federation_offers(fed, "team-a", CLOUDS, model, MIX, WHEN, "beijing", {}, 0.9)
    assert [o.name for o in offers] == ["shanghai"]
    assert {c.cloud for c in refused} == {"beijing", "singapore"}


def test_a_cloud_with_no_link_from_the_users_is_refused(data, model):
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    fed = embedded(lambda raw: raw.__setitem__(
        "links", [lk for lk in raw["links"] if {lk["a"], lk["b"]} != {"beijing", "singapore"}]))
    made = _offer(fed, "singapore", model)
    assert isinstance(made, str) and "no link from beijing" in made
    assert not isinstance(_offer(fed, "singapore", model, users_near="shanghai"), str)


def test_a_tenant_without_quota_on_a_cloud_is_refused_and_quota_bounds_the_devices(data, model):
    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    made = _offer(fed, "singapore", model, tenant="team-b")
    assert isinstance(made, str) and "team-b may use 0 device(s)" in made
    assert _offer(fed, "beijing", model, tenant="team-b").devices == 2  # quota 2 of the pool's 4
    assert _offer(fed, "beijing", model, tenant="team-a").devices == 4
    big = replace(model, devices_per_replica=3)
    assert "a replica needs 3" in _offer(fed, "shanghai", big)  # shanghai has 2 cpus


def test_a_measured_step_slows_decode_but_never_speeds_it_up(data, model):
    rates = token_rates("cpu", replace(model, batch=1), full_w=65.0)
    slow = measured_rates(rates, rates.step_s * 10)
    assert slow.step_s == pytest.approx(rates.step_s * 10)
    assert slow.decode_tps == pytest.approx(rates.decode_tps / 10)
    assert slow.prefill_tps == rates.prefill_tps
    fast = measured_rates(rates, rates.step_s / 10)
    assert fast.step_s == rates.step_s and fast.decode_tps == pytest.approx(rates.decode_tps)
    # in an offer: a measured 10 ms a token lowers the capacity and lengthens the service times
    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    modelled, measured = _offer(fed, "beijing", model), _offer(fed, "beijing", model, step_s=0.01)
    assert measured.capacity_tps < modelled.capacity_tps / 100
    assert measured.service_s.mean() > 100 * modelled.service_s.mean()
    assert measured.price_per_token > modelled.price_per_token


def test_an_offer_survives_its_json_form(data, model):
    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    offer = _offer(fed, "shanghai", model, step_s=0.01)
    back = offer_from_dict(json.loads(json.dumps(offer_to_dict(offer))))
    assert isinstance(back.service_s, np.ndarray) and back.service_s.shape == offer.service_s.shape
    np.testing.assert_allclose(back.service_s, offer.service_s, rtol=0, atol=1e-6)
    for k in ("name", "capacity_tps", "price_per_token", "rtt_ms", "devices", "busy_w", "pue", "warm",
              "electricity_per_token"):
        assert getattr(back, k) == getattr(offer, k)


def test_federation_offers_reports_refused_clouds_and_warmth(data, model):
    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    offers, refused = federation_offers(fed, "team-b", CLOUDS, model, MIX, WHEN, "beijing",
                                        {"beijing": True, "shanghai": False}, 0.9)
    assert {o.name: o.warm for o in offers} == {"beijing": True, "shanghai": False}
    assert [(c.cloud, c.accelerator, c.chosen) for c in refused] == [("singapore", "cpu", False)]
    assert refused[0].reason.startswith("refused: tenant team-b")
    plan = place_traffic(ServingRequest("team-b", "m").goal(), offers)
    assert plan.shares["shanghai"] == 0.0 and plan.preheat_first == ["shanghai"]


def _record(fed, model, req):
    offers, _ = federation_offers(fed, req.tenant, req.chosen_clouds(fed), model, req.mix(), WHEN, "beijing",
                                  dict.fromkeys(CLOUDS, True), req.goal().max_utilisation, 0.01)
    plan = place_traffic(req.goal(), offers)
    spec = ServeSpec(tenant=req.tenant, name="chat", model=f"{'a' * 64}:123", program="p.py")
    record = decision_record(req, spec, {"name": "m", "version": 1, "run_id": "r"}, plan, offers, WHEN, {})
    return json.loads(json.dumps(record)), plan  # as a grid request reads it back from the store


def test_replan_reproduces_the_record_and_a_grid_cut_shrinks_the_cloud(data, model):
    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=30.0, SG=50.0)
    req = ServingRequest("team-a", "m", tokens_per_s=100.0)
    record, plan = _record(fed, model, req)
    busiest = max(plan.shares, key=plan.shares.get)
    assert plan.shares[busiest] > 0
    again = replan(record, {}, None)
    assert again.shares == pytest.approx(record["shares"], abs=1e-6)
    assert again.tokens_per_s == pytest.approx(plan.tokens_per_s, rel=1e-4)
    cut = {busiest: {"reduce_pct": 10, "within_s": 60, "until": time.time() + 3600}}
    cut_plan = replan(record, cut, record["tokens_per_s"])
    assert cut_plan.shares[busiest] < again.shares[busiest]
    assert sum(cut_plan.shares.values()) == pytest.approx(1.0)
    assert [s.cloud for s in cut_plan.sheds] == [busiest] and cut_plan.sheds[0].achieved_pct >= 10
    # a cut on a cloud the record has no offer for changes nothing
    assert replan(record, {"nowhere": cut[busiest]}, None).shares == pytest.approx(again.shares)


def test_a_kubernetes_cloud_gets_an_offer_only_for_a_model_vllm_loads_with_an_image_for_its_warm_check(data, model):
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)

    def access(method: str, images: bool = True, **more):
        def mutate(raw):
            next(c for c in raw["clouds"] if c["name"] == "singapore")["access"] = {"method": method, **more}
            next(c for c in raw["clouds"] if c["name"] == "singapore")["store"]["url"] = "s3://sg-bucket"
            raw["images"] = raw["images"] if images else [i for i in raw["images"] if i["family"] != "hf-causal-lm"]
        return embedded(mutate)

    over_ssh = _offer(access("ssh", host="10.0.0.7", workdir="/srv/cc", python="/opt/cc/bin/python"), "singapore", model)
    assert not isinstance(over_ssh, str), over_ssh
    k8s = access("kubernetes", namespace="serving")
    refused = _offer(k8s, "singapore", model, family="byte-lm")
    assert isinstance(refused, str) and refused.startswith("refused: a kubernetes cloud serves with vLLM, which loads "
                                                           "hf-causal-lm models, not byte-lm")
    served = _offer(k8s, "singapore", model, family="hf-causal-lm")
    assert not isinstance(served, str), served
    no_image = _offer(access("kubernetes", images=False, namespace="serving"), "singapore", model, family="hf-causal-lm")
    assert isinstance(no_image, str) and "no image adapted to hf-causal-lm" in no_image


def test_replicas_for_a_rising_forecast_are_up_in_the_hour_before_and_a_falling_one_keeps_this_hours(data, model):
    from crosscloud.serving.placement import hour_and_next, plan_hour

    fed = load_federation()
    data(DE_LU=50.0, US_CAL_CISO=50.0, SG=50.0)
    req = ServingRequest("team-a", "m", tokens_per_s=200.0)
    warm = dict.fromkeys(CLOUDS, True)
    now, _ = plan_hour(fed, req, model, warm, WHEN, {}, step_s=0.002)
    rising, _ = plan_hour(fed, replace(req, tokens_per_s=2000.0), model, warm, WHEN + 3600, {}, step_s=0.002)
    assert sum(rising.replicas.values()) > sum(now.replicas.values())  # the case this test is about
    plan, _, replicas = hour_and_next(fed, req, model, warm, WHEN, {}, step_s=0.002, next_tps=2000.0)
    assert plan.shares == now.shares  # traffic follows this hour's plan ...
    assert all(replicas[c] >= max(now.replicas.get(c, 0), rising.replicas.get(c, 0)) for c in replicas)  # ... capacity the next's
    assert replicas == {c: max(now.replicas.get(c, 0), rising.replicas.get(c, 0)) for c in replicas}
    _, _, falling = hour_and_next(fed, req, model, warm, WHEN, {}, step_s=0.002, next_tps=20.0)
    assert falling == now.replicas  # scaled down by the next run, not ahead of a fall
    _, _, unknown = hour_and_next(fed, req, model, warm, WHEN + 11 * 3600, {}, step_s=0.002, next_tps=2000.0)
    assert unknown == plan_hour(fed, req, model, warm, WHEN + 11 * 3600, {}, step_s=0.002)[0].replicas  # no prices yet
