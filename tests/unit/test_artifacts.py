"""Chunked artifacts: deterministic chunks, per-tensor dedup, missing-only verified transfers, the warm check."""

from __future__ import annotations

import os

import pytest
import torch

from crosscloud.artifacts.preheat import TransferReport, fetch
from crosscloud.core.presets import preset
from crosscloud.store.base import LocalStore
from crosscloud.store.chunks import ChunkIndex, chunk_spans, load_manifest, put_blob, read_blob, warmth
from crosscloud.store.digest import IntegrityError
from crosscloud.store.tensors import to_bytes
from crosscloud.training.model import build_model

T = "team-a"


@pytest.fixture()
def stores(tmp_path):
    return {name: LocalStore(tmp_path / name, name) for name in ("near", "far", "target")}


def _model_bytes(seed: int = 0, touch: str | None = None) -> bytes:
    state = build_model(preset("small"), seed).state_dict()
    if touch:
        state[touch] = state[touch] + 0.01  # a fine-tune that changed one tensor
    return to_bytes(state)


def test_chunking_is_deterministic_and_local_edits_move_few_chunks():
    data = os.urandom(2 << 20)
    fmt, spans = chunk_spans(data)
    assert fmt == "raw" and chunk_spans(data) == (fmt, spans)
    assert sum(n for _, n, _ in spans) == len(data)
    edited = data[:1000] + b"inserted bytes" + data[1000:]
    before = {data[o : o + n] for o, n, _ in spans}
    after = {edited[o : o + n] for o, n, _ in chunk_spans(edited)[1]}
    assert len(after - before) <= 2  # content-defined: only the chunk around the edit is new


def test_safetensors_is_cut_at_tensors_and_unchanged_tensors_dedupe(stores):
    store = stores["target"]
    base = _model_bytes()
    name = next(iter(build_model(preset("small"), 0).state_dict()))
    tuned = _model_bytes(touch=name)
    ref, written = put_blob(store, T, base, kind="model")
    manifest = load_manifest(store, T, ref)
    assert manifest.format == "safetensors" and name in {c.label for c in manifest.chunks}
    tuned_ref, tuned_written = put_blob(store, T, tuned, kind="model")
    changed = sum(c.size for c in load_manifest(store, T, tuned_ref).chunks if c.label in (name, "__header__"))
    assert tuned_written <= changed < written / 4  # only the changed tensor (and the header) is new
    assert read_blob(store, T, tuned_ref) == tuned and read_blob(store, T, ref) == base


def test_transfer_sends_only_missing_chunks_from_the_nearest_holder(stores):
    near, far, target = stores["near"], stores["far"], stores["target"]
    name = next(iter(build_model(preset("small"), 0).state_dict()))
    base, tuned = _model_bytes(), _model_bytes(touch=name)
    base_ref, _ = put_blob(far, T, base)
    put_blob(near, T, base)
    tuned_ref, _ = put_blob(far, T, tuned)
    report = TransferReport()
    sent = fetch(target, [near, far], T, base_ref, report)
    assert sent == sum(load_manifest(far, T, base_ref).unique().values())
    assert report.sources == {"near": sent}  # all of it from the nearest holder
    sent_tuned = fetch(target, [near, far], T, tuned_ref, report)
    assert sent_tuned < len(tuned) / 4 and set(report.sources) == {"near", "far"}  # near lacks the changed tensor
    assert fetch(target, [near, far], T, tuned_ref, report) == 0
    assert read_blob(target, T, tuned_ref) == tuned


def test_a_corrupted_chunk_is_refused_and_never_stored(stores):
    src, target = stores["far"], stores["target"]
    ref, _ = put_blob(src, T, os.urandom(300_000))
    pack = next(k for k in src.list(f"{T}/packs") if not k.endswith(".idx"))
    body = bytearray(src.get(pack))
    body[-5] ^= 1
    src.put(pack, bytes(body))
    with pytest.raises(IntegrityError, match="no source holds an intact copy"):
        fetch(target, [src], T, ref, TransferReport())
    assert not ChunkIndex(target, T).where
    with pytest.raises(IntegrityError, match="corrupted"):
        read_blob(src, T, ref)


def test_warm_check_sees_missing_and_corrupted_chunks(stores):
    src, target = stores["far"], stores["target"]
    ref, _ = put_blob(src, T, os.urandom(500_000))
    cold = warmth(target, T, ref)
    assert not cold.warm and not cold.manifest and cold.missing_bytes == ref.size
    fetch(target, [src], T, ref, TransferReport())
    assert warmth(target, T, ref, verify=True).warm
    pack = next(k for k in target.list(f"{T}/packs") if not k.endswith(".idx"))
    body = bytearray(target.get(pack))
    body[10] ^= 1
    target.put(pack, bytes(body))
    assert warmth(target, T, ref).warm  # present by the index ...
    spoiled = warmth(target, T, ref, verify=True)  # ... but not intact when read
    assert not spoiled.warm and spoiled.corrupt_chunks == 1
    target.delete(pack + ".idx")
    assert warmth(target, T, ref).missing_bytes == ref.size


def test_tensors_round_trip_through_chunks(stores):
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    ref, _ = put_blob(stores["near"], T, to_bytes(state))
    assert read_blob(stores["near"], T, ref) == to_bytes(state)
