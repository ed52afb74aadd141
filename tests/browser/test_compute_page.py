"""The crosscloud page in a real browser: ``airflow standalone``, a finished run, headless Chromium.

One real ``cross_cloud_training`` run under the scheduler, then Debian's
Chromium (through chromedriver, driven by selenium) signs in on Airflow's
login form, opens the page from the Airflow navigation and the run's tab, and
the test reads what is rendered: cloud names and the numbers of that run.
Screenshots go to ``test-artifacts/browser/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from airflowstandalone import AirflowStandalone
from browserkit import SHOTS, sign_in, wait

CONF = {"rounds": 2, "inner_steps": 6, "model_size": "tiny", "global_batch": 12, "seed": 5}
CLOUDS = ("beijing", "shanghai", "singapore")
PRICE_BASE = {"DE-LU": 60.0, "US-CAL-CISO": 30.0, "SG": 90.0}  # the embedded clouds' grid regions


def price(region: str, hour: datetime) -> float:
    """The hand-made price of ``region`` at ``hour`` (USD/MWh): a base per region plus the hour of day."""
    return PRICE_BASE[region] + hour.hour


def _write_data(folder: Path) -> None:
    """Hand-made hourly prices for 2023 in the real files' format, and the tests' power-cap sweep."""
    (folder / "electricity" / "prices").mkdir(parents=True)
    start = datetime(2023, 1, 1, tzinfo=timezone.utc)
    for region in PRICE_BASE:
        rows = ["Datetime (UTC),Datetime (Local),Price (USD/MWh)"]
        for k in range(365 * 24):
            t = start + timedelta(hours=k)
            rows.append(f"{t:%Y-%m-%d %H:%M:%S}+00:00,{t:%Y-%m-%d %H:%M:%S}+00:00,{price(region, t)}")
        (folder / "electricity" / "prices" / f"{region}_2023.csv").write_text("\n".join(rows) + "\n")
    shutil.copytree(Path(os.environ["CROSSCLOUD_DATA_DIR"]) / "power", folder / "power")

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    airflow = AirflowStandalone(tmp_path_factory.mktemp("standalone"))
    _write_data(airflow.data)
    try:
        airflow.start()
        yield airflow
    finally:
        airflow.stop()


@pytest.fixture(scope="module")
def finished_run(server) -> dict:
    run = server.run_dag("cross_cloud_training", CONF)
    assert run["state"] == "success", f"run {run['dag_run_id']} ended {run['state']}; see {server.log}"
    return {"run_id": run["dag_run_id"], "summary": _run_object(server, run["dag_run_id"], "summary.json")}


def _run_object(server, run_id: str, name: str) -> dict:
    """An object of the run in the coordinator's (beijing's) store of the server's state folder."""
    return json.loads((server.state / "clouds" / "beijing" / "team-a" / "runs" / run_id / name).read_text())


@pytest.fixture(scope="module")
def signed_in(server, finished_run, browser):
    """The browser after signing in through Airflow's own login form."""
    return sign_in(browser, server)


def test_unauthenticated_request_gets_no_data(server, finished_run):
    run_path = f"/crosscloud/runs/cross_cloud_training/{quote(finished_run['run_id'], safe='')}"
    for path in ("/crosscloud/", run_path):
        anonymous = httpx.get(server.url + path, timeout=30)
        forged = httpx.get(server.url + path, headers={"Authorization": "Bearer not-a-token"}, timeout=30)
        assert anonymous.status_code == 401, anonymous.text
        assert forged.status_code == 403, forged.text
        for r in (anonymous, forged):
            assert not any(c in r.text for c in CLOUDS)
            assert finished_run["run_id"] not in r.text
    # the same routes answer with the data once authenticated
    r = httpx.get(server.url + run_path, headers={"Authorization": f"Bearer {server.token()}"}, timeout=30)
    assert r.status_code == 200 and all(c in r.text for c in CLOUDS)


def test_compute_view_from_the_airflow_navigation(server, finished_run, signed_in):
    from selenium.webdriver.common.by import By

    driver = signed_in
    driver.get(f"{server.url}/plugin/crosscloud")
    frame = wait(driver, lambda d: d.find_elements(By.TAG_NAME, "iframe"))[0]
    driver.switch_to.frame(frame)
    wait(driver, lambda d: d.find_elements(By.ID, "federation"))
    text = driver.find_element(By.TAG_NAME, "body").text
    driver.switch_to.default_content()
    driver.save_screenshot(str(SHOTS / "compute-view-in-airflow.png"))
    assert "embedded-demo" in text
    for cloud in CLOUDS:
        assert cloud in text
    assert "team-a" in text and "beijing 0/4" in text  # the run finished: its devices were given back
    # electricity now (the hand-made prices at the data hour the page names) and the effective device-hour price
    from crosscloud.core.federation import load_federation
    from crosscloud.energy.power import effective_price

    hour = datetime.strptime(text.split("grid price at ")[1][:16], "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)
    for cloud in load_federation().clouds:
        pool, mwh = cloud.pools[0], price(cloud.grid.region, hour)
        eff = effective_price(pool.price_per_device_hour, pool.power_w, mwh, cloud.grid.pue)
        assert f"{cloud.name} {cloud.role} {cloud.jurisdiction} active" in text
        assert f"cpu {pool.count} 0 {pool.count} {pool.price_per_device_hour:.2f} {mwh:.1f} {eff:.4f}" in text
    assert finished_run["run_id"] in text
    gap = finished_run["summary"]["metrics"]["iteration_time_gap_pct"]
    assert f"{gap:+.1f} %" in text
    assert f"{CONF['rounds']}/{CONF['rounds']}" in text


def test_run_tab_shows_plan_timeline_gap_and_mlflow_link(server, finished_run, signed_in):
    from selenium.webdriver.common.by import By

    driver, run_id, summary = signed_in, finished_run["run_id"], finished_run["summary"]
    driver.get(f"{server.url}/dags/cross_cloud_training/runs/{quote(run_id, safe='')}/plugin/crosscloud-run")
    frame = wait(driver, lambda d: d.find_elements(By.TAG_NAME, "iframe"))[0]
    driver.switch_to.frame(frame)
    wait(driver, lambda d: d.find_elements(By.ID, "timeline"))
    driver.switch_to.default_content()
    driver.save_screenshot(str(SHOTS / "run-tab-in-airflow.png"))

    driver.get(f"{server.url}/crosscloud/runs/cross_cloud_training/{quote(run_id, safe='')}")
    wait(driver, lambda d: d.find_elements(By.ID, "timeline"))
    driver.save_screenshot(str(SHOTS / "run-page.png"))
    text = driver.find_element(By.TAG_NAME, "body").text
    m = summary["metrics"]
    assert driver.find_element(By.ID, "run-id").text == run_id
    assert driver.find_element(By.ID, "rounds-done").text == str(CONF["rounds"])
    assert driver.find_element(By.ID, "final-eval-loss").text == f"{m['final_eval_loss']:.4f}"
    assert driver.find_element(By.ID, "gap").text == f"{m['iteration_time_gap_pct']:+.2f} %"
    for cloud, c in summary["clouds"].items():
        assert f"{cloud} cpu {c['devices']} {c['share']}/{CONF['global_batch']}" in text  # the plan row
    assert text.count("chosen") >= len(CLOUDS)
    lanes = driver.find_elements(By.CSS_SELECTOR, "#timeline .lane")
    assert [lane.find_element(By.CLASS_NAME, "name").text for lane in lanes] == list(summary["clouds"])
    for lane in lanes:
        assert len(lane.find_elements(By.CLASS_NAME, "round")) == CONF["rounds"]
    for r in summary["history"]:
        for cloud, rec in r["clouds"].items():
            comm = rec["upload_s"] + rec["download_s"]
            assert f"{cloud} {r['round']} {rec['compute_s']:.2f} {comm:.2f} {rec['wait_s']:.2f}" in text
    link = driver.find_element(By.ID, "mlflow-link").get_attribute("href")
    assert link.endswith(f"/runs/{_run_object(server, run_id, 'plan.json')['tracking']['parent_run_id']}")


def test_run_logged_its_plots_and_registered_its_model(server, finished_run):
    """The same run in MLflow: three plots (prices were known) and a registered version with its lineage."""
    from mlflow.tracking import MlflowClient

    from crosscloud.tracking import registry

    client = MlflowClient(tracking_uri=f"sqlite:///{server.state / 'mlflow.db'}")
    run_id, plan = finished_run["run_id"], _run_object(server, finished_run["run_id"], "plan.json")
    parent = plan["tracking"]["parent_run_id"]
    plots = sorted(a.path for a in client.list_artifacts(parent, "plots"))
    assert plots == ["plots/eval_loss_vs_tokens.png", "plots/placement_vs_price.png", "plots/round_breakdown.png"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    for path in plots:  # kept beside the screenshots, to look at
        shutil.copy(client.download_artifacts(parent, path, str(server.root)), SHOTS / f"mlflow-{Path(path).name}")
    model = finished_run["summary"]["model"]
    assert model["name"] == registry.model_name("team-a", f"byte-lm-{CONF['model_size']}")
    version = client.get_model_version(model["name"], str(model["version"]))
    assert version.run_id == parent
    assert version.tags["airflow.run_id"] == run_id and version.tags["airflow.dag_id"] == "cross_cloud_training"
    assert version.tags["crosscloud.data_sha256"].split(",") == [s["sha256"] for s in plan["shards"]]
    assert version.tags["crosscloud.clouds"] == ",".join(f"{c['name']}:{c['share']}" for c in plan["clouds"])
