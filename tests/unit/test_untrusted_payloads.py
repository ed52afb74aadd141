"""Tensors from other clouds are read only as safetensors: nothing from another cloud is unpickled or run."""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import pytest
import torch

from crosscloud.store.base import LocalStore
from crosscloud.store.commit import read_object, write_step
from crosscloud.store.tensors import PayloadError, from_bytes, to_bytes

ROOT = Path(__file__).resolve().parents[2]


class _Planted:
    """Unpickling this creates a file: the proof that a payload ran code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _payloads(marker: Path) -> dict[str, bytes]:
    archive = io.BytesIO()
    torch.save({"w": torch.ones(3), "hook": _Planted(marker)}, archive)
    good = to_bytes({"w": torch.ones(3)})
    return {
        "pickle": pickle.dumps({"w": _Planted(marker)}),
        "torch.save archive": archive.getvalue(),
        "truncated safetensors": good[:-4],
        "header that lies about its length": (10**9).to_bytes(8, "little") + good[8:],
        "empty": b"",
    }


def test_a_pickle_or_anything_but_safetensors_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "code-ran"
    for name, payload in _payloads(marker).items():
        with pytest.raises(PayloadError, match="not safetensors.*never pickle"):
            from_bytes(payload)
        assert not marker.exists(), f"{name} ran code"


def test_a_committed_pickle_from_another_cloud_is_refused_after_its_sha256_checks_out(tmp_path):
    """The commit vouches for bytes, not for their format: a well-committed pickle is still refused."""
    marker = tmp_path / "code-ran"
    store = LocalStore(tmp_path / "store", cloud="peer")
    commit = write_step(store, "t/runs/r/clouds/peer/0", {"delta.safetensors": pickle.dumps(_Planted(marker))})
    with pytest.raises(PayloadError):
        from_bytes(read_object(store, commit, "delta.safetensors"))
    assert not marker.exists()


def test_safetensors_round_trip():
    tensors = {"a": torch.randn(4, 3), "b": torch.arange(5, dtype=torch.int8)}
    back = from_bytes(to_bytes(tensors))
    assert set(back) == {"a", "b"} and all(torch.equal(back[k], tensors[k]) for k in tensors)


# ways to turn bytes into objects by running code: none may appear in code that handles other clouds' data
UNSAFE = re.compile(r"\bimport pickle\b|\bpickle\.|\bcloudpickle\b|\bdill\b|\bjoblib\b|\bmarshal\.|torch\.load\b"
                    r"|allow_pickle\s*=\s*True|\byaml\.load\(|\bUnsafeLoader\b|(?<![.\w])(eval|exec)\(")


def test_no_unpickling_or_code_loading_anywhere_in_the_package():
    found = []
    for folder in ("include", "plugins", "dags"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if UNSAFE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
