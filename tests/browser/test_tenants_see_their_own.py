"""Tenants see only their own: users of two tenants, one of none and an admin, in a real browser.

``airflow standalone`` runs in Airflow's multi-team mode with the teams
``team-a`` and ``team-b`` (the federation's tenants); alice is a viewer in
team-a, bob a viewer in team-b, carol a viewer in no team, admin an Admin.
Each tenant holds a reservation in the server's ledger and has a run's plan in
its store. Chromium signs in as each through the SimpleAuthManager's login
form and reads the crosscloud page; the run tab of another tenant's run is
refused; ``crosscloud inventory --airflow`` shows each user what the page does.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from airflowstandalone import AirflowStandalone
from browserkit import SHOTS, sign_in, wait

USERS = {"alice": "viewer:team-a", "bob": "viewer:team-b", "carol": "viewer"}
RUNS = {"team-a": "alpha-run-7", "team-b": "bravo-run-9"}  # names no other text of the page contains
QUEUED = {"team-a": "alpha-waits-3", "team-b": "bravo-waits-5"}  # each tenant's run waiting in the queue
DEVICES = {"team-a": 3, "team-b": 1}  # on beijing
QUOTA = {"team-a": 4, "team-b": 2}  # on beijing, in the embedded federation
SEES = {"alice": ["team-a"], "bob": ["team-b"], "carol": [], "admin": ["team-a", "team-b"]}

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


def _seed(server) -> None:
    """Each tenant's reservation and run plan, where the server's engine finds them (its CROSSCLOUD_* env)."""
    from crosscloud.core.federation import load_federation
    from crosscloud.core.job import JobSpec
    from crosscloud.core.presets import preset
    from crosscloud.ledger import Ledger
    from crosscloud.run.plan import CloudAssignment, Plan
    from crosscloud.scheduler.admission import entry_for
    from crosscloud.scheduler.service import Queue
    from crosscloud.store.chunks import BlobRef
    from crosscloud.store.open_store import open_store

    with pytest.MonkeyPatch.context() as env:
        for key, value in server.env().items():
            if key.startswith("CROSSCLOUD_"):
                env.setenv(key, value)
        fed, ledger, blob = load_federation(), Ledger(), BlobRef(sha256="0" * 64, size=1)
        for tenant, run_id in RUNS.items():
            ledger.admit(tenant, run_id, lambda usage, n=DEVICES[tenant]: [("beijing", "cpu", n)],
                         capacity={("beijing", "cpu"): 4}, quota={"beijing": 4})
            spec = JobSpec(tenant=tenant, clouds=["beijing"])
            cloud = CloudAssignment(name="beijing", role="coordinator", method="local", accelerator="cpu",
                                    devices=DEVICES[tenant], throughput=1.0, share=spec.global_batch, shards=[0], image="-")
            Plan(tenant=tenant, run_id=run_id, federation=fed.name, federation_path="", job=spec, model=preset(spec.model_size),
                 outer=spec.outer, coordinator_cloud="beijing", clouds=[cloud], candidates=[], dataset=spec.dataset,
                 shards=[blob], held_out=blob, init=blob).save(open_store(fed.local_cloud, tenant))
            waits = JobSpec(tenant=tenant, clouds=["beijing"], devices_per_cloud=2)  # beijing is full: it waits
            Queue(fed, ledger).submit(entry_for(fed, waits, QUEUED[tenant], "byte-lm", 0, set(), 0.0))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    airflow = AirflowStandalone(tmp_path_factory.mktemp("tenants"), users=USERS, teams=("team-a", "team-b"))
    try:
        airflow.start()
        _seed(airflow)
        yield airflow
    finally:
        airflow.stop()


def _page_text(driver, url: str, ready: str) -> str:
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait(driver, lambda d: d.find_elements(By.ID, ready))
    return driver.find_element(By.TAG_NAME, "body").text


@pytest.mark.parametrize("user", list(SEES))
def test_the_page_shows_each_user_their_own_tenants(server, browser, user):
    from selenium.webdriver.common.by import By

    driver = sign_in(browser, server, user)
    driver.get(f"{server.url}/plugin/crosscloud")  # from the Airflow navigation, as a user gets there
    driver.switch_to.frame(wait(driver, lambda d: d.find_elements(By.TAG_NAME, "iframe"))[0])
    wait(driver, lambda d: d.find_elements(By.ID, "federation"))
    text = driver.find_element(By.TAG_NAME, "body").text
    driver.switch_to.default_content()
    driver.save_screenshot(str(SHOTS / f"tenants-{user}.png"))
    assert "cpu 4 4 0" in text  # beijing's pool: its total and use stay global, 3 + 1 of 4 devices in use
    for tenant, run_id in RUNS.items():
        if tenant in SEES[user]:
            assert f"{tenant} beijing {DEVICES[tenant]}/{QUOTA[tenant]}" in text and f"{run_id} ({tenant})" in text
            assert text.count(run_id) == 3  # holding devices on beijing, in the tenant's row, a recent run
            assert QUEUED[tenant] in text  # its run waiting in the queue
        else:
            assert run_id not in text and QUEUED[tenant] not in text
    if SEES[user]:
        assert f"signed in as {user}: tenants shown {', '.join(SEES[user])}" in text
        assert all(t in SEES[user] for t in RUNS if t in text)
    else:
        assert "in no crosscloud tenant's Airflow team" in text and "Ask an Airflow administrator" in text
        assert "no tenant shown" in text and "no runs yet" in text


@pytest.mark.parametrize("user", list(SEES))
def test_the_queue_api_shows_each_user_only_their_tenants_entries(server, user):
    r = httpx.get(f"{server.url}/crosscloud/api/queue", headers={"Authorization": f"Bearer {server.token(user)}"},
                  timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert sorted(e["run_id"] for e in got["entries"]) == sorted(QUEUED[t] for t in SEES[user])
    assert all(e["state"] == "queued" and e["tenant"] in SEES[user] for e in got["entries"])


@pytest.mark.parametrize("user", list(SEES))
def test_the_run_tab_of_another_tenant_is_refused(server, user):
    for tenant, run_id in RUNS.items():
        r = httpx.get(f"{server.url}/crosscloud/runs/cross_cloud_training/{quote(run_id, safe='')}",
                      headers={"Authorization": f"Bearer {server.token(user)}"}, timeout=60)
        if tenant in SEES[user]:
            assert r.status_code == 200 and f"tenant {tenant}" in r.text, r.text
        else:
            assert r.status_code == 403, r.text
            assert tenant not in r.text and "beijing" not in r.text


def test_the_run_tab_in_the_browser_shows_the_own_run_and_refuses_the_other(server, browser):
    from selenium.webdriver.common.by import By

    driver = sign_in(browser, server, "bob")
    text = _page_text(driver, f"{server.url}/crosscloud/runs/cross_cloud_training/{RUNS['team-b']}", "run-id")
    assert "tenant team-b" in text and f"beijing cpu {DEVICES['team-b']}" in text
    driver.get(f"{server.url}/crosscloud/runs/cross_cloud_training/{RUNS['team-a']}")
    text = wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").text)
    driver.save_screenshot(str(SHOTS / "tenants-run-of-another-tenant.png"))
    assert "whose Airflow team you are not in" in text and "team-a" not in text and "beijing" not in text


@pytest.mark.parametrize("user", list(SEES))
def test_inventory_command_through_airflow_shows_the_same(server, user, capsys, monkeypatch):
    from crosscloud import cli

    monkeypatch.delenv("AIRFLOW_API_TOKEN", raising=False)
    if user == "bob":  # a token of the auth manager instead of a password
        monkeypatch.setenv("AIRFLOW_API_TOKEN", server.token("bob"))
        args = []
    else:
        args = ["--user", user, f"--password={server.passwords[user]}"]  # a password may start with "-"
    assert cli.main(["inventory", "--airflow", server.url, "--json", *args]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert [t["name"] for t in got["tenants"]] == SEES[user] == got["shown_to"]["tenants"]
    assert {c["name"] for c in got["clouds"]} == {"beijing", "shanghai", "singapore"}
    assert ("in no crosscloud tenant's Airflow team" in err) == (not SEES[user])
    assert cli.main(["inventory", "--airflow", server.url, "--tenant", "team-b", *args]) == 0
    text = capsys.readouterr().out
    assert ("tenant team-b:" in text) == ("team-b" in SEES[user]) and "tenant team-a:" not in text
