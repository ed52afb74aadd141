"""The exchange protocol over real S3-compatible servers (one moto server process per cloud)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from crosscloud.artifacts.preheat import RateCap, TransferReport, fetch
from crosscloud.core.keys import manifest_key
from crosscloud.store.base import ObjectNotFound, StoreError, TenantStore
from crosscloud.store.chunks import ChunkIndex, put_blob, read_blob
from crosscloud.store.commit import read_step, write_step
from crosscloud.store.digest import IntegrityError
from crosscloud.store.s3 import S3Store

pytestmark = pytest.mark.s3

CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def store(server, bucket="crosscloud", prefix="exchange", **kw) -> S3Store:
    return S3Store(server.name, bucket, prefix, endpoint_url=server.endpoint, credentials=CREDS, **kw)


def test_objects_round_trip_with_prefix_and_listing(s3_servers):
    s = store(s3_servers["beijing"])
    s.put("team-a/runs/r1/a.bin", b"hello")
    s.put("team-a/runs/r1/sub/b.bin", b"world")
    assert s.get("team-a/runs/r1/a.bin") == b"hello"
    assert s.list("team-a/runs/r1") == ["team-a/runs/r1/a.bin", "team-a/runs/r1/sub/b.bin"]
    assert s3_servers["beijing"].client().head_object(Bucket="crosscloud", Key="exchange/team-a/runs/r1/a.bin")
    s.delete("team-a/runs/r1/a.bin")
    assert not s.exists("team-a/runs/r1/a.bin")
    with pytest.raises(ObjectNotFound, match="cloud beijing: s3://crosscloud/exchange/team-a/runs/r1/a.bin"):
        s.get("team-a/runs/r1/a.bin")


def test_commit_protocol_over_s3_and_corruption_refused(s3_servers):
    s = store(s3_servers["shanghai"])
    write_step(s, "t/runs/r/clouds/c/0", {"delta.safetensors": b"x" * 1000}, meta={"round": 0})
    write_step(s, "t/runs/r/clouds/c/0", {"delta.safetensors": b"x" * 1000}, meta={"round": 0})  # a retry
    _, objects = read_step(s, "t/runs/r/clouds/c/0")
    assert objects["delta.safetensors"] == b"x" * 1000
    with pytest.raises(IntegrityError, match="already committed with other content"):
        write_step(s, "t/runs/r/clouds/c/0", {"delta.safetensors": b"y" * 1000}, meta={"round": 0})
    # a flipped byte behind the commit's back is detected, never used
    s3_servers["shanghai"].client().put_object(Bucket="crosscloud", Key="exchange/t/runs/r/clouds/c/0/delta.safetensors",
                                               Body=b"x" * 999 + b"y")
    with pytest.raises(IntegrityError, match="does not match its commit"):
        read_step(s, "t/runs/r/clouds/c/0")


def test_permanent_errors_fail_at_once_naming_cloud_bucket_and_key(s3_servers):
    s = store(s3_servers["beijing"], bucket="no-such-bucket", retry_deadline_s=60)
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"cloud beijing: s3://no-such-bucket/exchange/k: upload refused: NoSuchBucket"):
        s.put("k", b"data")
    assert time.monotonic() - started < 30  # not retried until the deadline


def test_unreachable_store_is_retried_until_its_deadline(s3_servers):
    s = S3Store("nowhere", "crosscloud", "", endpoint_url="http://127.0.0.1:9", credentials=CREDS, retry_deadline_s=2)
    with pytest.raises(StoreError, match="cloud nowhere: .* still failing after 2 s"):
        s.get("k")


def test_cross_cloud_transfer_verifies_and_never_sends_twice(s3_servers):
    src, dst = store(s3_servers["beijing"]), store(s3_servers["singapore"])
    data = os.urandom(20 * 1024 * 1024 + 123)
    ref, _ = put_blob(src, "team-a", data)
    report = TransferReport()
    assert fetch(dst, [src], "team-a", ref, report) == len(data)
    assert fetch(dst, [src], "team-a", ref, report) == 0
    assert report.sent_bytes["singapore"] == len(data)
    assert report.sources == {"beijing": len(data)}
    assert read_blob(dst, "team-a", ref) == data


def test_corrupted_chunk_at_the_nearest_source_is_read_from_the_next(s3_servers):
    near, far, dst = (store(s3_servers[name], prefix="flipped") for name in ("beijing", "shanghai", "singapore"))
    data = os.urandom(3 * 1024 * 1024)
    ref, _ = put_blob(near, "team-a", data)
    put_blob(far, "team-a", data)
    pack = next(k for k in near.list("team-a/packs") if not k.endswith(".idx"))
    body = bytearray(near.get(pack))
    body[100] ^= 0xFF  # one flipped bit in the first chunk at the nearest source
    near.put(pack, bytes(body))
    report = TransferReport()
    fetch(dst, [near, far], "team-a", ref, report)
    assert report.sources["shanghai"] > 0  # the bad chunk came from the next source
    assert read_blob(dst, "team-a", ref) == data


def test_corrupted_source_is_never_stored(s3_servers):
    src, dst = store(s3_servers["beijing"], prefix="bad"), store(s3_servers["shanghai"], prefix="bad")
    ref, _ = put_blob(src, "team-a", b"the real content")
    pack = next(k for k in src.list("team-a/packs") if not k.endswith(".idx"))
    src.put(pack, b"the real c0ntent")
    with pytest.raises(IntegrityError, match="no source holds an intact copy"):
        fetch(dst, [src], "team-a", ref, TransferReport())
    assert not dst.exists(manifest_key("team-a", ref.sha256))
    assert not ChunkIndex(dst, "team-a").where


def test_transfer_survives_the_target_server_restarting(s3_servers, tmp_path):
    """The target refuses connections for a while and comes back empty but for its bucket (moto keeps
    objects in memory); the transfer retries and completes. A rate cap puts the outage in its middle."""
    from s3servers import S3Server

    target = S3Server("restarting", tmp_path, restartable=True)
    target.start()
    target.make_bucket("crosscloud")
    src = store(s3_servers["beijing"], prefix="restart")
    dst = store(target, retry_deadline_s=60)
    data = os.urandom(48 * 1024 * 1024)
    ref, _ = put_blob(src, "team-a", data)

    def restart():
        time.sleep(1.0)
        target.restart(down_s=1.0, buckets=["crosscloud"])

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        fetch(dst, [src], "team-a", ref, TransferReport(), rate=RateCap(16 * 1024 * 1024))
        assert read_blob(dst, "team-a", ref) == data
    finally:
        thread.join()
        target.stop()


def test_tenants_cannot_read_each_others_runs(s3_servers):
    raw = store(s3_servers["beijing"])
    a, b = TenantStore(raw, "team-a"), TenantStore(raw, "team-b")
    write_step(a, "team-a/runs/r1/global/0", {"params.safetensors": b"secret weights"})
    for key in ("team-a/runs/r1/global/0/COMMIT.json", "team-a/runs/r1/global/0/params.safetensors"):
        with pytest.raises(StoreError, match="tenant team-b may not touch"):
            b.get(key)
    with pytest.raises(StoreError, match="tenant team-b may not touch"):
        b.list("team-a/runs")
    with pytest.raises(StoreError, match="tenant team-b may not touch"):
        b.put("team-b/../team-a/runs/r1/x", b"overwrite")
    assert b.list("team-b/runs") == []


SETUP = """
import json, os, sys
sys.path.insert(0, {include!r})
from crosscloud.store.chunks import put_blob
from crosscloud.store.s3 import S3Store
src = S3Store("a", "crosscloud", "big", endpoint_url={src!r}, credentials={creds!r})
ref, _ = put_blob(src, "t", os.urandom({size}))  # incompressible: nothing dedupes
print(json.dumps(ref.model_dump()))
"""

COPY = """
import json, sys, time
sys.path.insert(0, {include!r})
from crosscloud.run.plan import BlobRef
from crosscloud.artifacts.preheat import TransferReport, fetch
from crosscloud.store.s3 import S3Store
src = S3Store("a", "crosscloud", "big", endpoint_url={src!r}, credentials={creds!r})
dst = S3Store("b", "crosscloud", "big", endpoint_url={dst!r}, credentials={creds!r})
def peak_mb():  # VmHWM: this process's own peak RSS (ru_maxrss would include the forking parent's)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
start = peak_mb()
t = time.time()
report = TransferReport()
fetch(dst, [src], "t", BlobRef(sha256={digest!r}, size={size}), report)
print(json.dumps({{"peak_rss_mb": peak_mb(), "rss_at_start_mb": start,
                  "seconds": time.time() - t, "sent": report.sent_bytes}}))
"""


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_one_gib_transfer_between_two_servers_in_bounded_memory(s3_servers, tmp_path):
    size = int(os.environ.get("CROSSCLOUD_BIG_TRANSFER_MB", "1024")) * 1024 * 1024
    from pathlib import Path

    include = str(Path(__file__).resolve().parents[2] / "include")
    servers = {"src": s3_servers["beijing"].endpoint, "dst": s3_servers["shanghai"].endpoint, "creds": CREDS}
    made = _python(SETUP.format(include=include, size=size, **servers))  # the source, made by another process
    digest = json.loads(made.strip().splitlines()[-1])["sha256"]
    result = json.loads(_python(COPY.format(include=include, size=size, digest=digest, **servers)).strip().splitlines()[-1])
    print(f"\n{size >> 20} MiB between two S3 servers: peak RSS {result['peak_rss_mb']:.0f} MB"
          f" ({result['rss_at_start_mb']:.0f} MB before the copy), {result['seconds']:.1f} s")
    (tmp_path / "big-transfer.json").write_text(json.dumps(result))
    assert result["sent"] == {"b": size}
    assert result["peak_rss_mb"] < 300
