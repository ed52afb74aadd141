"""Screening and reducing a round's pseudo-gradients from local files, one fragment of one tensor at a time.

Every cloud runs the same operations in the same order on the same bytes
(clouds sorted by name, element-wise multiply and add, no fused or reordered
sums), so every cloud computes the same global bit for bit; norms for
screening are summed on the CPU in float64 for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from crosscloud.core.job import OuterConfig
from crosscloud.store.digest import IntegrityError
from crosscloud.training.compression import BLOCK
from crosscloud.training.exchange.tensorfile import TensorFile, TensorFileError, TensorFileWriter, fragments
from crosscloud.training.screening import outliers

FRAGMENT = 1024 * 1024  # elements per fragment (4 MiB of float32): what the reduce holds per cloud at once
Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


class Delta:
    """One cloud's committed pseudo-gradient in a local file, int8 blocks (``<name>.q``/``.scale``) or float32."""

    def __init__(self, cloud: str, path: Path):
        self.cloud, self.path = cloud, path
        try:
            self.file = TensorFile(path)
        except TensorFileError as exc:
            raise IntegrityError(f"cloud {cloud}: {exc}") from None
        self.int8 = any(n.endswith(".q") for n in self.file.entries)
        self.wait: Callable[[int], None] | None = None  # still downloading: until the file's first n bytes are in

    @classmethod
    def landing(cls, cloud: str, path: Path, wait: Callable[[int], None]) -> Delta:
        """A delta still downloading, opened once its header is in (``wait(n)``: until the first n bytes are)."""
        wait(8)
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
        wait(8 + n)
        delta = cls(cloud, path)
        delta.wait = wait
        return delta

    def close(self) -> None:
        self.file.close()

    def landed(self, name: str, stop: int) -> None:
        """Until the bytes of elements ``:stop`` of ``name`` are in the file (at once for a file downloaded whole)."""
        if self.wait is None:
            return
        if not self.int8:
            self.wait(self.file.end(name, stop))
        else:
            blocks = -(-stop // BLOCK)
            self.wait(max(self.file.end(f"{name}.q", blocks * BLOCK), self.file.end(f"{name}.scale", blocks)))

    def check(self, layout: Layout) -> None:
        """The file must hold exactly the model's tensors, in the shapes the encoding gives them."""
        want = {}
        for name, (_, shape) in layout.items():
            blocks = -(-numel(shape) // BLOCK)
            want.update({f"{name}.q": (torch.int8, (blocks, BLOCK)), f"{name}.scale": (torch.float32, (blocks,))}
                        if self.int8 else {name: (torch.float32, shape)})
        have = {n: (self.file.dtype(n), self.file.shape(n)) for n in self.file.entries}
        if set(have) != set(want):
            raise IntegrityError(f"cloud {self.cloud}: pseudo-gradient tensors {sorted(set(have) ^ set(want))[:5]} "
                                 "do not match the model")
        for n, (dtype, shape) in want.items():
            if have[n] != (dtype, shape):
                raise IntegrityError(f"cloud {self.cloud}: {n} is {have[n][1]}/{have[n][0]}, expected {shape}/{dtype}")

    def fragment(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Elements ``start:stop`` of the pseudo-gradient of ``name``, as float32 (``start`` a multiple of BLOCK)."""
        if not self.int8:
            return self.file.read(name, start, stop).float()
        b0, b1 = start // BLOCK, -(-stop // BLOCK)
        q = self.file.read(f"{name}.q", b0 * BLOCK, b1 * BLOCK).view(-1, BLOCK)
        scale = self.file.read(f"{name}.scale", b0, b1)
        return q.float().mul_(scale[:, None]).reshape(-1)[: stop - start]


def inspect(delta: Delta, layout: Layout) -> float:
    """A contribution's norm, once it is found to hold exactly the model's tensors, all finite; else IntegrityError."""
    delta.check(layout)
    sums = {}  # NaN or Inf anywhere in a tensor leaves its sum of squares not finite
    for name in sorted(layout):
        squares = 0.0
        for start, stop in fragments(numel(layout[name][1]), FRAGMENT):
            part = delta.fragment(name, start, stop)
            squares += float(part.mul_(part).sum(dtype=torch.float64))
        sums[name] = squares
    return norm_of(delta.cloud, sums, layout)


def screen(norms: dict[str, float], samples: dict[str, int]) -> dict[str, str]:
    """The well-formed contributions refused for their norm: far above the other clouds' (``screening.outliers``).

    Only clouds that trained (samples > 0) take part in the norm comparison: a
    cloud whose work moved away contributes zeros and says nothing about scale.
    """
    return outliers({c: n for c, n in norms.items() if samples.get(c, 0) > 0})


def reduce(deltas: dict[str, Delta], weights: dict[str, float], known: dict[str, torch.Tensor], cfg: OuterConfig,
           params_out: TensorFileWriter, momentum_in: TensorFile | None, momentum_out: TensorFileWriter | None,
           device: torch.device, after: Callable[[int], None] | None = None,
           squares: dict[str, dict[str, float]] | None = None) -> None:
    """The outer step, fragment by fragment: the weighted mean of ``deltas``, Nesterov momentum, the new global.

    ``known`` is the global the round started from; the new global goes to
    ``params_out`` and the momentum (when ``cfg`` has any) from ``momentum_in``
    to ``momentum_out``. Neither the mean nor the new global is ever held whole.
    ``after`` is told how many tensors are done after each one.

    Deltas still downloading (``Delta.landing``) are read behind their
    download, each fragment once its bytes are in. ``squares`` gathers each
    delta's sums of squares per tensor on the way, exactly as ``inspect`` sums
    them, so a streamed round needs no inspection pass of its own.
    """
    total = sum(weights[c] for c in deltas)
    for done, name in enumerate(sorted(known), start=1):
        flat = known[name].reshape(-1)
        for start, stop in fragments(flat.numel(), FRAGMENT):
            step = None
            for cloud in sorted(deltas):
                deltas[cloud].landed(name, stop)
                part = deltas[cloud].fragment(name, start, stop)
                if squares is not None:
                    sums = squares.setdefault(cloud, {})
                    sums[name] = sums.get(name, 0.0) + float(part.mul(part).sum(dtype=torch.float64))
                part = part.to(device).mul_(weights[cloud] / total)
                step = part if step is None else step.add_(part)
            if cfg.momentum:
                buf = (step.clone() if momentum_in is None
                       else momentum_in.read(name, start, stop).to(device).mul_(cfg.momentum).add_(step))
                momentum_out.write(name, start, buf)
                step = step.add_(buf.mul(cfg.momentum))
            params_out.write(name, start, flat[start:stop].to(device).sub(step.mul_(cfg.lr)))
        if after:
            after(done)


def norm_of(cloud: str, sums: dict[str, float], layout: Layout) -> float:
    """A delta's norm from its per-tensor sums of squares, as ``inspect`` makes it; IntegrityError if not finite."""
    total = 0.0
    for name in sorted(layout):
        if not math.isfinite(sums[name]):
            raise IntegrityError(f"cloud {cloud}: {name} holds NaN or Inf (or values too large to square)")
        total += sums[name]
    return math.sqrt(total)
