"""Tenants see only their own: the rule of the crosscloud page, its routes and ``crosscloud inventory --tenant``.

No server: the SimpleAuthManager answers for users built here, as it does for
the users of its config in a running Airflow (tests/browser has that too).
"""

from __future__ import annotations

import json

import pytest
from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import HTTPException

from crosscloud import cli
from crosscloud.core.federation import load_federation
from crosscloud_airflow import tenancy, ui

TENANTS = ["team-a", "team-b"]
ALICE = SimpleAuthManagerUser(username="alice", role="viewer", teams=["team-a"])
CAROL = SimpleAuthManagerUser(username="carol", role="viewer")
ADMIN = SimpleAuthManagerUser(username="admin", role="admin")


class NoTeams:
    """An auth manager that knows no teams: BaseAuthManager's own answer."""

    filter_authorized_teams = BaseAuthManager.filter_authorized_teams
    is_authorized_team = BaseAuthManager.is_authorized_team


@pytest.fixture()
def simple(monkeypatch):
    """The SimpleAuthManager as the one Airflow runs, for the routes."""
    manager = SimpleAuthManager()
    monkeypatch.setattr(tenancy, "get_auth_manager", lambda: manager)
    return manager


def test_a_user_sees_the_tenants_of_their_teams_and_an_admin_sees_all(simple):
    assert tenancy.visible_tenants(ALICE, TENANTS) == (["team-a"], "")
    assert tenancy.visible_tenants(ADMIN, reversed(TENANTS)) == (["team-b", "team-a"], "")  # in the federation's order
    assert tenancy.visible_tenants(SimpleAuthManagerUser(username="dan", role="op", teams=["team-a", "other"]),
                                   TENANTS)[0] == ["team-a"]


def test_a_user_of_no_tenant_is_told_why_and_whom_to_ask(simple):
    shown, note = tenancy.visible_tenants(CAROL, TENANTS)
    assert shown == [] and "carol" in note and "Airflow team named after your tenant (team-a, team-b)" in note
    shown, note = tenancy.visible_tenants(ADMIN, TENANTS, auth_manager=NoTeams())
    assert shown == [] and "the auth manager NoTeams knows no teams" in note


def test_the_run_of_another_tenant_is_refused_without_its_data(simple, monkeypatch):
    from crosscloud.tracking import run_report

    monkeypatch.setattr(run_report, "find_tenant", lambda fed, run_id: "team-b")
    with pytest.raises(HTTPException) as refused:
        ui.run_page("cross_cloud_training", "bravo-1", ALICE)
    assert refused.value.status_code == 403 and "team-b" not in refused.value.detail
    tenancy.require_tenant(ADMIN, "team-b")  # an admin may


def test_the_page_and_its_json_show_only_the_users_tenants(simple, ledger, monkeypatch):
    monkeypatch.setattr(ui, "_sources", lambda: (load_federation(), ledger))
    for tenant, run_id in (("team-a", "alpha-1"), ("team-b", "bravo-1")):
        ledger.admit(tenant, run_id, lambda usage: [("beijing", "cpu", 1)], capacity={("beijing", "cpu"): 4}, quota={"beijing": 2})
    page = ui.compute_page(ALICE).body.decode()
    assert "alpha-1 (team-a)" in page and "bravo-1" not in page and "team-b" not in page
    got = ui.inventory_api(ALICE)
    assert [t["name"] for t in got["tenants"]] == ["team-a"] and got["shown_to"] == {"user": "alice", "tenants": ["team-a"], "note": ""}
    assert got["clouds"][0]["pools"][0]["in_use"] == 2  # a pool's use stays global
    page = ui.compute_page(CAROL).body.decode()
    assert "id='no-tenant'" in page and "alpha-1" not in page and "bravo-1" not in page
    assert "alpha-1 (team-a)" in ui.compute_page(ADMIN).body.decode() and "bravo-1 (team-b)" in ui.compute_page(ADMIN).body.decode()


def test_inventory_command_shows_the_tenants_asked_for(capsys):
    assert cli.main(["inventory", "--json", "--tenant", "team-b", "--tenant", "team-a"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["tenants"]] == TENANTS
    with pytest.raises(SystemExit, match="unknown tenant"):
        cli.main(["inventory", "--tenant", "team-x"])
    with pytest.raises(SystemExit, match="AIRFLOW_API_TOKEN"):
        cli.main(["inventory", "--airflow", "http://127.0.0.1:9"])
