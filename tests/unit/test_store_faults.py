"""A cloud's folder store that runs out of room: a clear error naming the cloud, nothing half-written, resumable.

The disk fills for real in a child process: its file-size limit (RLIMIT_FSIZE)
makes the kernel fail the write part way through the object, as a full disk does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crosscloud.store.base import LocalStore
from crosscloud.store.commit import read_commit, read_step, write_step

pytestmark = pytest.mark.faults

STEP = "team-a/runs/r1/clouds/shanghai/0"
INCLUDE = Path(__file__).resolve().parents[2] / "include"

FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, {include!r})
from crosscloud.store.commit import write_step
from crosscloud.store.base import LocalStore, StoreError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with an error instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    write_step(LocalStore({root!r}, cloud="shanghai"), {step!r}, {{"delta.safetensors": bytes(4 << 20)}}, meta={{"round": 0}})
except StoreError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_full_disk_names_the_cloud_leaves_nothing_half_written_and_the_step_resumes(tmp_path):
    root = tmp_path / "shanghai"
    out = subprocess.run([sys.executable, "-c", FULL_DISK.format(include=str(INCLUDE), root=str(root), step=STEP)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr[-2000:]
    assert f"cloud shanghai: cannot write '{STEP}/delta.safetensors'" in out.stdout
    assert "File too large" in out.stdout
    store = LocalStore(root, cloud="shanghai")
    assert read_commit(store, STEP) is None
    assert [p for p in root.rglob("*") if p.is_file()] == []  # not even the temporary of the failed object
    write_step(store, STEP, {"delta.safetensors": bytes(4 << 20)}, meta={"round": 0})  # room again: it commits
    assert read_step(store, STEP)[1]["delta.safetensors"] == bytes(4 << 20)
