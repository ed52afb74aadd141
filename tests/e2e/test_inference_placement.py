"""The DAG ``inference_placement`` under ``dag.test()`` over the local clouds, and a grid request on what it serves.

A real run of ``retraining`` registers a tiny byte_lm model as team-a's
champion; ``inference_placement`` then serves it behind a real HAProxy with
real replica processes, for requests that may stay only in CN. Client threads
send completions through the router while a grid request cuts a cloud's
draw and ends.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from pricefiles import write_flat_prices
from servingload import Load, phase

from crosscloud.cli import main as cli
from crosscloud.core.federation import load_federation
from crosscloud.serving.demand import Demand
from crosscloud.serving.fleet import Fleet
from crosscloud.serving.meter import RECENT_S
from crosscloud.serving.placement import warm_clouds
from crosscloud.serving.replica import ServeSpec
from crosscloud.serving.server import CLOUD_HEADER
from crosscloud.serving.status import fleet_status
from crosscloud.store.open_store import open_store
from crosscloud_airflow.ui import serving_section

pytestmark = [pytest.mark.inference, pytest.mark.e2e, pytest.mark.slow]

TENANT, MODEL = "team-a", "crosscloud-team-a-byte-lm-tiny"
TRAIN = {"tenant": TENANT, "model_size": "tiny", "rounds": 1, "inner_steps": 4, "global_batch": 8, "seed": 5,
         "inner_lr": 3e-3}
CONF = {"tenant": TENANT, "model": MODEL, "alias": "champion", "clouds": [], "users_near": "beijing",
        "jurisdictions": ["CN"], "tokens_per_s": 300.0, "min_share": 0.1, "latency_goal_ms": 3000.0,
        "context_tokens": 8.0, "generated_tokens": 4.0, "router_port": 0}


def _ti(run, task_id: str):
    tis = [t for t in run.get_task_instances() if t.task_id == task_id]
    assert tis, f"no task {task_id}"
    return tis


PRICES = {"DE-LU": 140.0, "US-CAL-CISO": 45.0, "SG": 30.0}  # USD/MWh: singapore cheapest, but outside CN


@pytest.fixture(scope="module")
def prices(tmp_path_factory):
    """A year of hourly prices per region of the embedded federation, in a data folder of this module's own."""
    data = tmp_path_factory.mktemp("data")
    shutil.copytree(Path(os.environ["CROSSCLOUD_DATA_DIR"]) / "power", data / "power")
    write_flat_prices(data, PRICES)
    before = os.environ["CROSSCLOUD_DATA_DIR"]
    os.environ["CROSSCLOUD_DATA_DIR"] = str(data)
    yield data
    os.environ["CROSSCLOUD_DATA_DIR"] = before


@pytest.fixture(scope="module")
def served(dagbag, prices):
    """A registered champion, served by one run of inference_placement; every process stopped afterwards."""
    trained = dagbag.get_dag("retraining").test(run_conf=TRAIN)
    assert trained.state == "success"
    fleet = Fleet(TENANT, MODEL)
    try:
        run = dagbag.get_dag("inference_placement").test(run_conf=CONF)
        yield run, fleet
    finally:
        fleet.stop()


def test_the_run_serves_through_one_router_only_within_the_jurisdiction(served):
    run, fleet = served
    assert run.state == "success", [(t.task_id, t.state) for t in run.get_task_instances()]
    decision = fleet.decision
    assert decision["shares"]["singapore"] == 0 and decision["replicas"]["singapore"] == 0
    reason = next(c for c in decision["considered"] if c["cloud"] == "singapore")["reason"]
    assert "jurisdiction SG" in reason
    assert sum(decision["shares"].values()) == pytest.approx(1.0)
    answered = []
    with httpx.Client(timeout=30) as client:
        for i in range(120):  # beijing has the 0.1 standby share: 120 requests miss it with p < 1e-5
            r = client.post(f"{fleet.router().url}/v1/completions", json={"prompt": f"def f{i}", "max_tokens": 3})
            assert r.status_code == 200, r.text
            answered.append(r.headers[CLOUD_HEADER])
    assert set(answered) <= {"beijing", "shanghai"}
    assert set(answered) == {c for c, s in decision["shares"].items() if s > 0}  # min_share: both CN clouds serve


def test_a_cloud_gets_a_share_only_once_the_model_is_warm_there(served):
    run, fleet = served
    resolved = _ti(run, "resolve")[0].xcom_pull(task_ids="resolve")
    spec = ServeSpec(**resolved["spec"])
    fed = load_federation()
    serving = [c for c, s in fleet.decision["shares"].items() if s > 0]
    assert all(warm_clouds(fed, spec, serving).values())
    cold = set(_ti(run, "find_cold")[0].xcom_pull(task_ids="find_cold"))
    preheats = [t for t in _ti(run, "preheat") if t.state == "success"]
    assert len(preheats) == len(cold)  # every cloud cold at the start was preheated, and only those
    place = _ti(run, "place")[0]
    assert all(t.end_date <= place.start_date for t in preheats)
    assert "singapore" not in cold  # outside the requests' jurisdiction: nothing is sent there


def test_every_decision_is_kept_in_the_store_and_mlflow(served):
    from mlflow.tracking import MlflowClient

    run, fleet = served
    home = open_store(load_federation().local_cloud, TENANT)
    kept = [k for k in home.list(f"{TENANT}/serving/{MODEL}/decisions") if run.run_id.replace(":", "-").replace("+", "-") in k]
    assert len(kept) == 1
    assert json.loads(home.get(kept[0]))["shares"] == fleet.decision["shares"]
    rid = _ti(run, "record")[0].xcom_pull(task_ids="record")
    client = MlflowClient()
    hour = client.get_run(rid)
    assert hour.data.tags["crosscloud.level"] == "serving-decision"
    parent = client.get_run(hour.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["crosscloud.serving"] == f"{TENANT}/{MODEL}"
    assert hour.data.metrics["share.beijing"] == pytest.approx(fleet.decision["shares"]["beijing"])
    assert "usd_per_1k_tokens.shanghai" in hour.data.metrics
    assert "decision.txt" in [a.path for a in client.list_artifacts(rid)]


def test_status_shows_each_cloud_as_served(served, capsys):
    _, fleet = served
    with Load(fleet.router().url, clients=2) as load:
        phase(load, 3.0)
    assert not load.failures()
    rows = {r["cloud"]: r for r in fleet_status(fleet)["clouds"]}
    for cloud, share in fleet.decision["shares"].items():
        if share > 0:
            assert rows[cloud]["replicas"] >= 1 and rows[cloud]["tokens_per_s"] > 0 and rows[cloud]["p99_ms"] > 0
            assert rows[cloud]["usd_per_1k_tokens"] > 0
    assert cli(["serve", "status", "--tenant", TENANT, "--model", MODEL]) == 0
    out = capsys.readouterr().out
    assert "beijing" in out and "shanghai" in out and fleet.router().url in out
    page = serving_section([fleet_status(fleet)])  # the crosscloud page's serving table
    for cloud, row in rows.items():
        assert f"<td>{cloud}</td>" in page and f"{row['planned_share']:.2f}" in page
    assert fleet.router().url in page and "p99 ms" in page


def test_a_grid_request_cuts_the_cloud_and_its_traffic_returns_after(served, dagbag):
    _, fleet = served
    before = dict(fleet.decision["shares"])
    cloud = max(before, key=before.get)
    conf = {"cloud": cloud, "reduce_pct": 10, "within_s": 60, "duration_s": 0}
    with Load(fleet.router().url, clients=3) as load:
        phase(load, RECENT_S)  # steady traffic over the whole window the draw before the cut is measured on
        run = dagbag.get_dag("demand_response").test(run_conf=conf)
        after = phase(load, 3.0)
    assert not load.failures(), load.failures()[:3]
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert all(s == "success" for s in states.values()), states
    checked = next(t for t in run.get_task_instances() if t.task_id == "verify").xcom_pull(task_ids="verify")
    (shed,) = checked["serving"]
    assert shed["held"] and shed["shed_pct"] >= 10 and shed["power_after_w"] < shed["power_before_w"]
    assert shed["share_after"] < shed["share_before"] == pytest.approx(before[cloud])
    assert shed["time_to_shed_s"] < 60
    assert fleet.decision["shares"][cloud] == pytest.approx(before[cloud])  # restored
    assert fleet.decision["reason"] == f"grid request on {cloud} ended"
    assert after.get(cloud, 0) > 0  # requests reach it again
    assert fleet.cuts() == {}
    home = open_store(load_federation().local_cloud, TENANT)
    assert home.list(f"{TENANT}/serving/{MODEL}/demand_response")


def test_without_the_param_the_hour_is_sized_by_the_traffic_the_replicas_served(served, dagbag):
    run, fleet = served
    first = fleet.decision
    assert first["demand"]["override"] == 300.0 and first["request"]["tokens_per_s"] == 300.0
    with Load(fleet.router().url, clients=2) as load:
        phase(load, 2.0)
    assert not load.failures()
    again = dagbag.get_dag("inference_placement").test(run_conf={**CONF, "tokens_per_s": None})
    assert again.state == "success", [(t.task_id, t.state) for t in again.get_task_instances()]
    demand, measured = fleet.decision["demand"], Demand(open_store(load_federation().local_cloud, TENANT), TENANT,
                                                        MODEL).history()
    assert demand["override"] is None and demand["method"] == "last hour measured", demand
    assert measured and fleet.decision["request"]["tokens_per_s"] == pytest.approx(demand["forecast_tokens_per_s"])
    assert demand["forecast_tokens_per_s"] > 0  # the tests' requests, read from the replicas' own counters
    # the next hour is forecast too (from the last hour measured, one more hour on), and no cloud runs fewer
    # replicas than this hour's plan wants: what apply ran is the larger of the two hours' plans
    assert demand["next_hour_tokens_per_s"] >= demand["forecast_tokens_per_s"] * (1 - 1e-9)
    assert all(fleet.decision["replicas"][c] >= n for c, n in fleet.decision["replicas_this_hour"].items())
