"""The device a sub-task's rank trains on, and the process group backend that goes with it.

NVIDIA pools (and Hygon DCUs, whose ROCm build of torch answers as ``cuda``)
train on ``cuda:<LOCAL_RANK>`` with NCCL, Ascend pools on ``npu:<LOCAL_RANK>``
with HCCL through ``torch_npu``, and everything else on the CPU with gloo. A
pool whose runtime is not on the host (a local cloud that only models its
accelerators) trains on the CPU, and says so.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

CUDA_LIKE = ("nvidia", "hygon")


def _npu_available() -> bool:
    try:
        importlib.import_module("torch_npu")  # registers the npu device with torch
    except ImportError:
        return False
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def select_device(accelerator: str, local_rank: int, log: Callable[[str], None] = print) -> tuple[str, str]:
    """(device name, process group backend) for a rank on a pool of ``accelerator``.

    A name, not a ``torch.device``: ``npu`` is a device type only once ``torch_npu`` is imported.
    """
    kind = accelerator.split("-")[0]
    if kind in CUDA_LIKE and torch.cuda.is_available():
        return f"cuda:{local_rank}", "nccl"
    if kind == "ascend" and _npu_available():
        return f"npu:{local_rank}", "hccl"
    if kind != "cpu":
        log(f"pool accelerator {accelerator}: no {'CUDA' if kind in CUDA_LIKE else kind} runtime on this host; "
            "training on the CPU")
    return "cpu", "gloo"


def peak_memory_gb(device: torch.device) -> float:
    """The most memory this process has held on ``device``: the accelerator's allocator peak, or on the CPU the
    process's peak resident set (interpreter and framework included)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    if device.type == "npu" and hasattr(torch, "npu"):
        return torch.npu.max_memory_allocated(device) / 1e9
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
