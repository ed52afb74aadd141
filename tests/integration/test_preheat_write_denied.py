"""A cloud's store denying writes during preheat: the error names the cloud, nothing is published, preheat resumes.

singapore's store is a real S3 server checking IAM policies; the tenant's keys
there may first only read. Preheat fails on singapore, naming it, and nothing
of the run is there; once the keys may write, the same preheat completes,
sends only what is still missing, and every cloud holds what its sub-task
reads (a fresh run's global 0 is built by its home cloud's sub-task).
"""

from __future__ import annotations

import json

import boto3
import pytest
import yaml
from federations import embedded_raw
from s3servers import S3Server, tenant_policy

from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import admit_stage, preheat_stage, release_stage
from crosscloud.store.base import StoreError
from crosscloud.store.chunks import warmth
from crosscloud.store.open_store import open_store

pytestmark = [pytest.mark.s3, pytest.mark.faults]

ADMIN = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def test_preheat_names_the_cloud_denying_writes_publishes_nothing_and_resumes(s3_servers, tmp_path, monkeypatch):
    policed = S3Server("singapore-policed", tmp_path)
    policed.start()
    try:
        policed.make_bucket("crosscloud")
        keys = policed.enforce_policies({
            "admin": ADMIN, "team-a": tenant_policy("crosscloud", "denied/singapore", "team-a", actions=("GetObject",))})
        endpoints = {"beijing": s3_servers["beijing"].endpoint, "shanghai": s3_servers["shanghai"].endpoint,
                     "singapore": policed.endpoint}

        def on_s3(raw):
            for cloud in raw["clouds"]:
                cloud["store"] = {"url": f"s3://crosscloud/denied/{cloud['name']}", "endpoint_url": endpoints[cloud["name"]],
                                  "addressing_style": "path"}

        fed_path = tmp_path / "federation.yaml"
        fed_path.write_text(yaml.safe_dump(embedded_raw(on_s3)))
        for cloud in ("beijing", "shanghai"):
            monkeypatch.setenv(f"CROSSCLOUD_{cloud.upper()}_ACCESS_KEY_ID", "testing")
            monkeypatch.setenv(f"CROSSCLOUD_{cloud.upper()}_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("CROSSCLOUD_SINGAPORE_TEAM_A_ACCESS_KEY_ID", keys["team-a"]["aws_access_key_id"])
        monkeypatch.setenv("CROSSCLOUD_SINGAPORE_TEAM_A_SECRET_ACCESS_KEY", keys["team-a"]["aws_secret_access_key"])

        ref = admit_stage(JobSpec(rounds=1, inner_steps=1, model_size="tiny"), "write-denied", str(fed_path))
        try:
            fed, plan = ref.load()
            assert {c.name for c in plan.clouds} == {"beijing", "shanghai", "singapore"}
            with pytest.raises(StoreError, match=r"to singapore: cloud singapore: s3://crosscloud/denied/singapore/team-a/.*refused: AccessDenied"):
                preheat_stage(ref)
            stores = {c.name: open_store(c, "team-a") for c in fed.clouds}
            assert not stores["singapore"].exists(f"team-a/artifacts/{plan.program.code.sha256}.json")

            iam = boto3.client("iam", endpoint_url=policed.endpoint, region_name="us-east-1", **keys["admin"])
            iam.put_user_policy(UserName="team-a", PolicyName="team-a-store",
                                PolicyDocument=json.dumps(tenant_policy("crosscloud", "denied/singapore", "team-a")))
            report = preheat_stage(ref)  # the same task again, once the store takes writes
            assert report["sent_bytes"]["shanghai"] == 0 and report["sent_bytes"]["singapore"] > 0
            assert all(warmth(stores[c.name], "team-a", r).warm for c in plan.clouds for r in plan.needs(c.name))
        finally:
            release_stage(ref)
    finally:
        policed.stop()
