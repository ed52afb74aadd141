"""Each tenant's runs are its team's alone in Airflow's own UI and REST API: multi-team mode with tenant bundles.

``airflow standalone`` runs in multi-team mode; each tenant of the federation
has its own ``cross_cloud_training__<tenant>`` in a bundle its team owns
(``crosscloud-airflow tenant-bundles``) and its own triggerer. alice (role user,
team-a) and bob (role user, team-b) each trigger their own DAG and the runs
train. Then, through the REST API and in Chromium, neither can read the other's
DAG, run, conf, task log or XCom, nor trigger the other's DAG, while each reads
their own and an admin reads both. There is no shared DAG to read them through.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from airflowstandalone import AirflowStandalone
from browserkit import SHOTS, sign_in, wait

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

USERS = {"alice": "user:team-a", "bob": "user:team-b"}
TENANT = {"alice": "team-a", "bob": "team-b"}
OTHER = {"alice": "bob", "bob": "alice"}
SEED = {"alice": 424242, "bob": 737373}  # in each run's conf; no other text of a page contains them


def dag_id(user: str) -> str:
    return f"cross_cloud_training__{TENANT[user]}"


def _api(server, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{server.url}/api/v2{path}", headers={"Authorization": f"Bearer {server.token(user)}"},
                         timeout=60, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from pricefiles import write_flat_prices

    airflow = AirflowStandalone(tmp_path_factory.mktemp("tenant-runs"), users=USERS, teams=("team-a", "team-b"),
                                tenant_bundles=True)
    write_flat_prices(airflow.data, {"DE-LU": 60.0, "US-CAL-CISO": 40.0, "SG": 50.0})
    shutil.copytree(Path(os.environ["CROSSCLOUD_DATA_DIR"]) / "power", airflow.data / "power")
    try:
        airflow.start()
        yield airflow
    finally:
        airflow.stop()


@pytest.fixture(scope="module")
def runs(server) -> dict[str, str]:
    """Each user's run of their own DAG, triggered as that user, trained to the end."""
    import time

    deadline, triggered = time.time() + 300, {}
    for user in USERS:
        while _api(server, user, "GET", f"/dags/{dag_id(user)}").status_code != 200:  # parsed from its bundle
            assert time.time() < deadline, f"{dag_id(user)} never appeared; see {server.log}"
            time.sleep(2)
        conf = {"tenant": TENANT[user], "clouds": ["beijing"], "rounds": 1, "inner_steps": 2, "model_size": "tiny",
                "global_batch": 8, "seed": SEED[user]}
        r = _api(server, user, "POST", f"/dags/{dag_id(user)}/dagRuns", json={"logical_date": None, "conf": conf})
        assert r.status_code == 200, r.text
        triggered[user] = r.json()["dag_run_id"]
    for user, run_id in triggered.items():
        state = server.wait(dag_id(user), run_id, timeout_s=900)["state"]
        assert state == "success", f"{user}'s run ended {state}; see {server.root}"
    return triggered


def _run_paths(user: str, run_id: str) -> dict[str, str]:
    base = f"/dags/{dag_id(user)}/dagRuns/{quote(run_id, safe='')}"
    return {"run": base, "log": f"{base}/taskInstances/admit/logs/1", "xcom": f"{base}/taskInstances/admit/xcomEntries",
            "tasks": f"{base}/taskInstances"}


@pytest.mark.parametrize("user", list(USERS))
def test_each_tenant_reads_its_own_run_and_none_of_the_others(server, runs, user):
    own, other = _run_paths(user, runs[user]), _run_paths(OTHER[user], runs[OTHER[user]])
    for what, path in own.items():
        r = _api(server, user, "GET", path)
        assert r.status_code == 200, (what, r.text)
    assert str(SEED[user]) in _api(server, user, "GET", own["run"]).text  # the run's conf
    for what, path in other.items():
        r = _api(server, user, "GET", path)
        assert r.status_code == 403, (what, r.status_code, r.text[:300])
        assert str(SEED[OTHER[user]]) not in r.text and runs[OTHER[user]] not in r.text
    refused = _api(server, user, "POST", f"/dags/{dag_id(OTHER[user])}/dagRuns", json={"logical_date": None, "conf": {}})
    assert refused.status_code == 403, refused.text


@pytest.mark.parametrize("user", list(USERS))
def test_lists_leave_the_other_tenant_out(server, runs, user):
    dags = {d["dag_id"] for d in _api(server, user, "GET", "/dags", params={"limit": 100}).json()["dags"]}
    assert dag_id(user) in dags and dag_id(OTHER[user]) not in dags
    assert "cross_cloud_training" not in dags  # no DAG of no team to read every tenant's runs through
    listed = {r["dag_run_id"] for r in _api(server, user, "GET", "/dags/~/dagRuns", params={"limit": 100}).json()["dag_runs"]}
    assert runs[user] in listed and runs[OTHER[user]] not in listed
    everyone = {r["dag_run_id"] for r in _api(server, "admin", "GET", "/dags/~/dagRuns", params={"limit": 100}).json()["dag_runs"]}
    assert set(runs.values()) <= everyone  # an admin reads both


def test_in_the_browser_the_other_tenants_run_and_log_show_nothing_of_it(server, runs, browser):
    from selenium.webdriver.common.by import By

    driver = sign_in(browser, server, "alice")
    own = f"{server.url}/dags/{dag_id('alice')}/runs/{quote(runs['alice'], safe='')}"
    driver.get(own)
    wait(driver, lambda d: "admit" in d.find_element(By.TAG_NAME, "body").text)
    for page in (f"{server.url}/dags/{dag_id('bob')}/runs/{quote(runs['bob'], safe='')}",
                 f"{server.url}/dags/{dag_id('bob')}/runs/{quote(runs['bob'], safe='')}/tasks/admit"):
        driver.get(page)
        # Airflow's own page says it is refused (its breadcrumbs, from the URL, come first)
        text = wait(driver, lambda d: (t := d.find_element(By.TAG_NAME, "body").text) and "Forbidden" in t and t)
        driver.save_screenshot(str(SHOTS / "tenant-runs-apart-other.png"))
        assert str(SEED["bob"]) not in text and "beijing" not in text, text[:1000]  # and shows nothing of it
    driver.get(f"{server.url}/dags")
    text = wait(driver, lambda d: (t := d.find_element(By.TAG_NAME, "body").text) and dag_id("alice") in t and t)
    assert dag_id("bob") not in text
