"""A files dataset: put as a whole, read as streams, stored as the same content-addressed blobs."""

from __future__ import annotations

import random
import resource

import pytest

from crosscloud.core.job import JobSpec
from crosscloud.pipeline.inputs import dataset_files, upload_dataset
from crosscloud.store.chunks import BlobRef, ChunkIndex, chunk_spans, load_manifest, put_blob_stream, read_blob
from crosscloud.store.open_store import open_store
from federations import embedded

pytestmark = pytest.mark.program

MINE = {"name": "mine", "source": "files", "home": "beijing", "prefix": "datasets/mine/train/",
        "eval_prefix": "datasets/mine/val/"}


@pytest.fixture
def fed():
    return embedded(lambda raw: raw["datasets"].append(dict(MINE)))


def _folder(root, train: dict[str, bytes], val: dict[str, bytes]):
    for sub, files in (("train", train), ("val", val)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (root / sub / name).write_bytes(data)
    return root


def test_a_put_replaces_the_dataset_as_a_whole(fed, tmp_path):
    old = _folder(tmp_path / "old", {"a.bin": b"a" * 10, "b.bin": b"b" * 10}, {"v.bin": b"v"})
    new = _folder(tmp_path / "new", {"a.bin": b"A" * 20, "c.bin": b"c" * 5}, {"w.bin": b"w"})
    assert upload_dataset(fed, "team-a", "mine", old)["removed"] == 0
    sent = upload_dataset(fed, "team-a", "mine", new)
    assert sent == {"cloud": "beijing", "files": 3, "bytes": 26, "removed": 2}  # b.bin and v.bin were left over
    train, held = dataset_files(fed, JobSpec(dataset="mine"))
    assert [f.name for f in train] == ["a.bin", "c.bin"] and [f.name for f in held] == ["w.bin"]
    assert b"".join(train[0].blocks()) == b"A" * 20


def test_a_streamed_file_is_the_blob_a_whole_read_makes_in_bounded_memory(tmp_path):
    store = open_store(embedded().cloud("beijing"), "team-a")
    data = random.Random(1).randbytes(48 << 20)
    store.put("team-a/datasets/big/train/big.bin", data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ref, _ = put_blob_stream(store, "team-a", store.iter_chunks("team-a/datasets/big/train/big.bin"), kind="dataset")
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
    assert grew < 40 << 10, f"streaming a 48 MiB file raised the peak by {grew >> 10} MiB"
    assert ref == BlobRef.of(data)
    manifest = load_manifest(store, "team-a", ref)
    assert [c.size for c in manifest.chunks] == [n for _, n, _ in chunk_spans(data)[1]]  # the same cuts: dedup holds
    assert read_blob(store, "team-a", ref) == data
    assert ChunkIndex(store, "team-a").missing(manifest.unique()) == {}
