"""The exchange protocol over real S3-compatible servers (one moto server process per cloud)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from crosscloud.commit import IntegrityError, read_step, write_step
from crosscloud.names import blob_key
from crosscloud.plan import BlobRef
from crosscloud.preheat import TransferReport, copy_blob, put_blob
from crosscloud.s3 import S3Store
from crosscloud.storage import ObjectNotFound, StoreError, TenantStore

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


def test_cross_cloud_copy_streams_verifies_and_never_sends_twice(s3_servers):
    src, dst = store(s3_servers["beijing"]), store(s3_servers["singapore"])
    data = os.urandom(20 * 1024 * 1024 + 123)  # several multipart parts
    ref, _ = put_blob(src, "team-a", data)
    report = TransferReport()
    copy_blob(src, dst, "team-a", ref, report)
    copy_blob(src, dst, "team-a", ref, report)
    assert report.sent_bytes["singapore"] == len(data)
    assert report.skipped_bytes["singapore"] == len(data)
    assert hashlib.sha256(dst.get(blob_key("team-a", ref.sha256))).hexdigest() == ref.sha256


def test_corrupted_source_is_not_copied(s3_servers):
    src, dst = store(s3_servers["beijing"]), store(s3_servers["shanghai"])
    ref = BlobRef.of(b"the real content")
    src.put(blob_key("team-a", ref.sha256), b"the real c0ntent")
    with pytest.raises(IntegrityError, match="corrupted at the source"):
        copy_blob(src, dst, "team-a", ref, TransferReport())
    assert not dst.exists(blob_key("team-a", ref.sha256))


def test_transfer_survives_the_target_server_restarting(s3_servers, tmp_path):
    """moto keeps objects in memory, so the restarted server starts empty but for its bucket, which
    is re-created as a real server's would persist; the copy completes by sending again."""
    from s3servers import S3Server

    target = S3Server("restarting", tmp_path)
    target.start()
    target.make_bucket("crosscloud")
    src = store(s3_servers["beijing"])
    dst = store(target, retry_deadline_s=60)
    data = os.urandom(64 * 1024 * 1024)
    ref, _ = put_blob(src, "team-a", data)

    def restart():
        time.sleep(0.3)
        target.stop()
        time.sleep(1.0)
        target.start()
        target.make_bucket("crosscloud")

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        copy_blob(src, dst, "team-a", ref, TransferReport())
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
import io, sys
sys.path.insert(0, {include!r})
from crosscloud.s3 import S3Store
src = S3Store("a", "crosscloud", "big", endpoint_url={src!r}, credentials={creds!r})
block = bytes(range(256)) * 4096  # 1 MiB
class Source(io.RawIOBase):
    def __init__(self): self.left = {size}
    def readable(self): return True
    def readinto(self, b):
        n = min(len(b), self.left)
        for i in range(0, n, len(block)):
            m = min(len(block), n - i)
            b[i:i + m] = block[:m]
        self.left -= n
        return n
src.put_stream({key!r}, io.BufferedReader(Source(), 8 << 20))
"""

COPY = """
import json, sys, time
sys.path.insert(0, {include!r})
from crosscloud.plan import BlobRef
from crosscloud.preheat import TransferReport, copy_blob
from crosscloud.s3 import S3Store
src = S3Store("a", "crosscloud", "big", endpoint_url={src!r}, credentials={creds!r})
dst = S3Store("b", "crosscloud", "big", endpoint_url={dst!r}, credentials={creds!r})
def peak_mb():  # VmHWM: this process's own peak RSS (ru_maxrss would include the forking parent's)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
start = peak_mb()
t = time.time()
report = TransferReport()
copy_blob(src, dst, "t", BlobRef(sha256={digest!r}, size={size}), report)
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
    block = bytes(range(256)) * 4096
    digest = hashlib.sha256()
    for offset in range(0, size, len(block)):
        digest.update(block[: min(len(block), size - offset)])
    key = f"t/blobs/sha256/{digest.hexdigest()}"
    servers = {"src": s3_servers["beijing"].endpoint, "dst": s3_servers["shanghai"].endpoint, "creds": CREDS}
    _python(SETUP.format(include=include, size=size, key=key, **servers))  # the source, made by another process
    result = json.loads(_python(COPY.format(include=include, size=size, digest=digest.hexdigest(), **servers)).strip().splitlines()[-1])
    print(f"\n{size >> 20} MiB between two S3 servers: peak RSS {result['peak_rss_mb']:.0f} MB"
          f" ({result['rss_at_start_mb']:.0f} MB before the copy), {result['seconds']:.1f} s")
    (tmp_path / "big-transfer.json").write_text(json.dumps(result))
    assert result["sent"] == {"b": size}
    assert result["peak_rss_mb"] < 300
