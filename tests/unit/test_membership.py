"""Clouds join only after proving they work, drain without a restart, and leave without touching others."""

from __future__ import annotations

import json

import pytest
from federations import embedded

from crosscloud import cli
from crosscloud.core.job import JobSpec
from crosscloud.pool import membership
from crosscloud.scheduler.admission import admit
from crosscloud.pool.inventory import collect


def _clouds(fed, ledger, run_id):
    return {p.cloud for p in admit(fed, JobSpec(), run_id, "byte-lm", 0, {"beijing"}, ledger).parts}


def test_a_joining_cloud_is_used_after_its_probe_passes(ledger):
    def joining(raw):
        raw["clouds"][2]["state"] = "joining"

    fed = embedded(joining)
    assert "singapore" not in _clouds(fed, ledger, "before")
    ok, detail = membership.join(fed, "singapore", ledger)
    assert ok, detail
    assert "probe with torch" in detail and "store ok for team-a" in detail
    assert collect(fed, ledger).cloud("singapore").health.startswith("ok")
    assert "singapore" in _clouds(fed, ledger, "after")  # same process, same federation object: no restart


@pytest.mark.parametrize(
    ("mutate", "part"),
    [
        (lambda raw: raw["clouds"][2].update(access={"method": "ssh", "host": "127.0.0.1", "port": 1, "workdir": "/tmp/cc",
                                                     "python": "/usr/bin/python3"}),
         "launcher: cloud singapore: cannot reach 127.0.0.1 over SSH"),
        (lambda raw: raw["clouds"][2]["pools"][0].update(accelerator="hygon-k100"), "images: no adapted image registered for ['hygon-k100']"),
    ],
)
def test_a_failed_check_names_what_failed_and_keeps_work_away(ledger, mutate, part):
    fed = embedded(mutate)
    ok, detail = membership.join(fed, "singapore", ledger)
    assert not ok and part in detail
    assert "last join check failed" in collect(fed, ledger).cloud("singapore").refuses


def test_drain_and_activate_take_effect_at_the_next_placement(ledger):
    fed = embedded()
    membership.drain(fed, "shanghai", ledger)
    assert "shanghai" not in _clouds(fed, ledger, "a")
    membership.activate(fed, "shanghai", ledger)
    assert "shanghai" in _clouds(fed, ledger, "b")


def test_removing_a_cloud_affects_no_other(ledger):
    fed = embedded()
    assert _clouds(fed, ledger, "a") == {"beijing", "shanghai", "singapore"}

    def without_singapore(raw):
        raw["clouds"] = raw["clouds"][:2]
        raw["links"] = [link for link in raw["links"] if "singapore" not in (link["a"], link["b"])]
        raw["tenants"][0]["quotas"].pop("singapore")

    smaller = embedded(without_singapore)
    assert _clouds(smaller, ledger, "b") == {"beijing", "shanghai"}
    assert [c.name for c in collect(smaller, ledger).clouds] == ["beijing", "shanghai"]


def test_inventory_command_prints_json_for_a_tenant(capsys):
    assert cli.main(["inventory", "--json", "--tenant", "team-b"]) == 0
    inv = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in inv["clouds"]] == ["beijing", "shanghai", "singapore"]
    assert [t["name"] for t in inv["tenants"]] == ["team-b"]  # other tenants' runs are not shown
    pool = inv["clouds"][0]["pools"][0]
    assert pool["total"] == 4 and pool["free"] == pool["total"] - pool["in_use"]
