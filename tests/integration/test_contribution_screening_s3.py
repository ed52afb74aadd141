"""The coordinator's screening over real S3 servers: each cloud's contribution read from its own store.

shanghai's delta is damaged at rest in its server (its bytes replaced, the
commit kept) or poisoned (replaced with a commit that vouches for it); the
screening refuses it and keeps beijing's and singapore's.
"""

from __future__ import annotations

import json

import pytest
import torch

from crosscloud.store.commit import write_step
from crosscloud.store.digest import sha256
from crosscloud.store.s3 import S3Store
from crosscloud.store.tensors import to_bytes
from crosscloud.training.screening import screen

pytestmark = [pytest.mark.s3, pytest.mark.faults]

CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
PARAMS = {"w": torch.zeros(64, 32), "b": torch.zeros(32)}


def _contributions(s3_servers, prefix: str) -> tuple[dict, dict]:
    stores, commits = {}, {}
    for i, cloud in enumerate(("beijing", "shanghai", "singapore")):
        stores[cloud] = S3Store(cloud, "crosscloud", prefix, endpoint_url=s3_servers[cloud].endpoint, credentials=CREDS)
        delta = {n: torch.full_like(t, 0.01 * (i + 1)) for n, t in PARAMS.items()}
        commits[cloud] = write_step(stores[cloud], f"run/clouds/{cloud}/0", {"delta.safetensors": to_bytes(delta)}, meta={})
    return stores, commits


@pytest.mark.parametrize("damage, says", [("flip", "does not match its commit"), ("truncate", "does not match its commit"),
                                          ("poison", "above 10x the median")])
def test_a_damaged_or_poisoned_delta_on_s3_is_refused_and_the_others_kept(s3_servers, damage, says):
    stores, commits = _contributions(s3_servers, f"screening-{damage}")
    entry = commits["shanghai"]["objects"]["delta.safetensors"]
    data = bytearray(stores["shanghai"].get(entry["key"]))
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        del data[len(data) // 2:]
    else:  # shanghai lies: a well-formed delta 1000x the others', and a commit that vouches for it
        data = bytearray(to_bytes({n: torch.full_like(t, 20.0) for n, t in PARAMS.items()}))
        commits["shanghai"] = {**commits["shanghai"], "objects": {"delta.safetensors": {**entry, "size": len(data), "sha256": sha256(bytes(data))}}}
        stores["shanghai"].put("run/clouds/shanghai/0/COMMIT.json", json.dumps(commits["shanghai"], sort_keys=True).encode())
    stores["shanghai"].put(entry["key"], bytes(data))
    accepted, refused = screen(stores, commits, PARAMS, {"beijing": 4, "shanghai": 4, "singapore": 4})
    assert sorted(accepted) == ["beijing", "singapore"] and list(refused) == ["shanghai"]
    assert says in refused["shanghai"]
    assert torch.equal(accepted["singapore"]["w"], torch.full((64, 32), 0.03))
