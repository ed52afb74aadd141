"""A collaboration cloud's object store cut off mid-run: every transfer retries with backoff and the run completes.

The three clouds keep their stores on three S3 server processes; shanghai's
sits behind a gate. Once the run has committed its first global round there,
the gate drops every open connection and refuses new ones for
``CROSSCLOUD_FAULT_OUTAGE_S`` seconds (default 5; the issue's scenario is 30),
while the sub-task and the coordinator are reading and writing it.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import yaml
from federations import embedded_raw
from s3servers import S3Server

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.keys import RunKeys
from crosscloud.pipeline.stages import run_job
from crosscloud.store.commit import read_commit
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.s3, pytest.mark.faults, pytest.mark.slow]

OUTAGE_S = float(os.environ.get("CROSSCLOUD_FAULT_OUTAGE_S", "5"))
SPEC = JobSpec(rounds=3, inner_steps=6, model_size="tiny", global_batch=12, seed=5)


def test_a_run_survives_its_collaboration_store_being_cut_off(s3_servers, tmp_path, monkeypatch):
    gated = S3Server("shanghai-gated", tmp_path, restartable=True)
    gated.start()
    try:
        gated.make_bucket("crosscloud")
        endpoints = {"beijing": s3_servers["beijing"].endpoint, "shanghai": gated.endpoint,
                     "singapore": s3_servers["singapore"].endpoint}

        def on_s3(raw):
            for cloud in raw["clouds"]:
                cloud["store"] = {"url": f"s3://crosscloud/outage/{cloud['name']}", "endpoint_url": endpoints[cloud["name"]],
                                  "addressing_style": "path", "retry_deadline_s": OUTAGE_S + 120, "retry_backoff_max_s": 2.0}

        fed_path = tmp_path / "federation.yaml"
        fed_path.write_text(yaml.safe_dump(embedded_raw(on_s3)))
        for cloud in endpoints:  # the sub-tasks inherit these
            monkeypatch.setenv(f"CROSSCLOUD_{cloud.upper()}_ACCESS_KEY_ID", "testing")
            monkeypatch.setenv(f"CROSSCLOUD_{cloud.upper()}_SECRET_ACCESS_KEY", "testing")
        fed = load_federation(fed_path)
        run_id = "store-outage"
        keys = RunKeys("team-a", run_id)
        shanghai = open_store(fed.cloud("shanghai"), "team-a")
        done = threading.Event()

        def cut_off_after_round_one():
            while not done.is_set() and read_commit(shanghai, keys.global_step(1)) is None:
                time.sleep(0.2)
            if not done.is_set():
                gated.outage(OUTAGE_S)

        saboteur = threading.Thread(target=cut_off_after_round_one)
        saboteur.start()
        try:
            summary = run_job(SPEC, run_id, str(fed_path), log=lambda m: None, compare_baseline=False)
        finally:
            done.set()
            saboteur.join()
        assert gated.refused > 0, "the outage turned no connection away: the fault was not injected"
        assert summary["rounds"] == SPEC.rounds and len(summary["history"]) == SPEC.rounds
        assert all(record["digests_agree"] for record in summary["history"])
        # every cloud made the last globals itself (older ones are gone by retention), the same bytes everywhere
        kept = range(SPEC.rounds + 1 - SPEC.keep_rounds, SPEC.rounds + 1)
        digests = {r: set() for r in kept}
        for cloud in fed.clouds:
            store = open_store(cloud, "team-a")
            for r in kept:
                commit = read_commit(store, keys.global_step(r))
                assert commit is not None, f"{cloud.name} lacks global round {r}"
                digests[r].add(commit["meta"]["digest"])
        assert all(len(d) == 1 for d in digests.values()), digests
    finally:
        gated.stop()
