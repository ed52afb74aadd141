"""A program's model as tensor names, dtypes and shapes, built on the meta device: no memory, no values.

Admission learns what a run's model is (its architecture and size) this way
without holding it: a model of billions of parameters is described in
milliseconds by a process that never allocates it. Global 0 itself is built by
the home cloud's sub-task (``training.diloco``).
"""

from __future__ import annotations

from types import ModuleType

import torch

from crosscloud.store.header import Layout
from crosscloud.training.session import parameters

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}  # safetensors' names, as its headers write them


def tensors_layout(tensors: dict[str, torch.Tensor]) -> Layout:
    return [(name, DTYPES.get(t.dtype, str(t.dtype)), list(t.shape)) for name, t in tensors.items()]


def model_layout(module: ModuleType, args: dict) -> Layout | None:
    """The tensors ``build_model(args)`` makes, without making them; None for a program whose model cannot be
    built on the meta device (it reads values while building): its home cloud then checks it when it builds it."""
    try:
        with torch.device("meta"):
            model = module.build_model(args)
    except Exception:  # noqa: BLE001 - any failure here only means "not known before the cloud builds it"
        return None
    return tensors_layout(parameters(model))
