"""The commit protocol: only committed, intact objects are ever read as valid."""

from __future__ import annotations

import pytest
import torch

from crosscloud.core.keys import RunKeys, manifest_key
from crosscloud.store.base import LocalStore, StoreError
from crosscloud.store.commit import put_tensors, read_commit, read_step, write_step
from crosscloud.store.digest import IntegrityError, sha256
from crosscloud.store.tensors import TensorsReader, from_bytes, to_bytes


@pytest.fixture()
def store(tmp_path):
    return LocalStore(tmp_path, cloud="test")


def test_objects_without_commit_are_not_visible(store):
    store.put("run/0/delta.safetensors", b"x" * 10)
    assert read_commit(store, "run/0") is None
    assert read_step(store, "run/0") is None


def test_committed_step_round_trips(store):
    write_step(store, "run/0", {"a.bin": b"hello", "b.bin": b"world"}, meta={"round": 0})
    commit, objects = read_step(store, "run/0")
    assert objects == {"a.bin": b"hello", "b.bin": b"world"}
    assert commit["meta"] == {"round": 0}
    assert commit["objects"]["a.bin"]["size"] == 5


@pytest.mark.parametrize("damage", [b"hellO", b"hell", b"hello!"])
def test_corrupted_or_truncated_object_is_refused(store, damage):
    write_step(store, "run/0", {"a.bin": b"hello"})
    store.put("run/0/a.bin", damage)
    with pytest.raises(IntegrityError, match="does not match its commit"):
        read_step(store, "run/0")


def test_unreadable_commit_is_an_error_not_absent(store):
    store.put("run/0/COMMIT.json", b"{not json")
    with pytest.raises(IntegrityError, match="unreadable commit"):
        read_commit(store, "run/0")


def test_rewriting_a_step_is_idempotent(store):
    first = write_step(store, "run/0", {"a.bin": b"hello"}, meta={"k": 1})
    second = write_step(store, "run/0", {"a.bin": b"hello"}, meta={"k": 1})
    assert first == second
    assert store.list("run") == ["run/0/COMMIT.json", "run/0/a.bin"]


def test_names_cannot_escape_their_prefix(store):
    for bad in ("../other", "/abs", "a/b", "..", ""):
        with pytest.raises(ValueError, match="not allowed"):
            RunKeys("team-a", bad)
        with pytest.raises(ValueError, match="not allowed"):
            RunKeys(bad, "run")
    with pytest.raises(ValueError, match="sha256"):
        manifest_key("team-a", "../../etc/passwd")
    with pytest.raises(StoreError, match="escapes the store root"):
        store.put("../outside", b"x")


def test_tensors_are_written_as_safetensors_from_their_own_buffers(store):
    """The object streamed from the tensors is the safetensors file any reader loads, its entry names its size and
    sha256, and the stream can be sought (a retried upload sends it again from the start)."""
    tensors = {"b": torch.arange(5, dtype=torch.int8), "a": torch.randn(3, 4), "s": torch.tensor(2.5),
               "h": torch.randn(6).to(torch.bfloat16)}
    entry = put_tensors(store, "run/0/t.safetensors", tensors)
    data = store.get("run/0/t.safetensors")
    assert entry == {"key": "run/0/t.safetensors", "size": len(data), "sha256": sha256(data)}
    back = from_bytes(data)
    assert set(back) == set(tensors) and all(torch.equal(back[n], t) for n, t in tensors.items())
    assert len(data) <= len(to_bytes(tensors))  # no bigger than what safetensors itself writes
    reader = TensorsReader(tensors)
    reader.seek(10)
    assert reader.read(7) == data[10:17] and reader.tell() == 17
    reader.seek(0)
    assert reader.read() == data
