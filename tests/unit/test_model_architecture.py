"""A program's registered name and its model's architecture: what the registry keeps one name per."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from crosscloud.store.header import HeaderError, architecture, parameters, read_header
from crosscloud.store.tensors import to_bytes
from crosscloud.training.program import ProgramError, program_model_name

pytestmark = pytest.mark.program

PATH = Path("/teams/a/gru_lm.py")


def _module(**attrs) -> types.ModuleType:
    module = types.ModuleType("program")
    module.__dict__.update(attrs)
    return module


def test_the_name_is_the_programs_own_else_its_stem_and_family():
    args = {"model_size": "tiny", "width": 64}
    assert program_model_name(_module(), PATH, "gru", args, "p") == "gru_lm-gru"
    assert program_model_name(_module(MODEL_NAME="my-lm"), PATH, "gru", args, "p") == "my-lm"
    named = _module(model_name=lambda a: f"gru-w{a['width']}")  # one name per architecture its args pick
    assert program_model_name(named, PATH, "gru", args, "p") == "gru-w64"


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "-dash-first", "x" * 101, 7])
def test_a_name_mlflow_cannot_hold_is_refused_saying_how_to_set_one(bad):
    with pytest.raises(ProgramError, match="is not a name: .*set MODEL_NAME"):
        program_model_name(_module(MODEL_NAME=bad), PATH, "gru", {}, "p")


def test_the_architecture_is_names_shapes_and_dtypes_not_values():
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4)
    b = torch.nn.Linear(8, 4)  # other values
    wide = torch.nn.Linear(8, 5)
    half = torch.nn.Linear(8, 4).to(torch.float16)
    fa, fb = (to_bytes(dict(m.named_parameters())) for m in (a, b))
    assert fa != fb and architecture(fa) == architecture(fb)
    assert architecture(to_bytes(dict(wide.named_parameters()))) != architecture(fa)
    assert architecture(to_bytes(dict(half.named_parameters()))) != architecture(fa)
    assert parameters(fa) == 8 * 4 + 4
    assert set(read_header(fa)) == {"weight", "bias"}


def test_the_header_is_read_from_the_first_bytes_only_and_garbage_is_refused():
    data = to_bytes({"w": torch.zeros(1000, 1000)})
    n = int.from_bytes(data[:8], "little") + 8
    assert architecture(data[:n]) == architecture(data)  # a store object's first bytes are enough
    with pytest.raises(HeaderError, match="only part"):
        architecture(data[: n - 1])
    with pytest.raises(HeaderError):
        architecture(b"\x80\x04\x95 pickle bytes, not safetensors")
