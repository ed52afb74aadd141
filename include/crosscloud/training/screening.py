"""Contributions from untrusted clouds: every pseudo-gradient is screened before it may move the global model.

A cloud's commit can be damaged (truncated or flipped bytes: refused by sha256,
see commit.py) or well-formed but wrong: tensors that do not fit the model,
NaN/Inf, or a norm far above the other clouds' (a poisoned or diverged
contribution). Commits are written once, so a refused contribution is not
re-asked: it is dropped from its round, the round completes with the others
(re-weighted by their samples) and the cloud is flagged in the run's record.
"""

from __future__ import annotations

import statistics

import torch

from crosscloud.store.base import ObjectStore
from crosscloud.store.commit import read_object
from crosscloud.store.digest import IntegrityError
from crosscloud.store.tensors import PayloadError, from_bytes
from crosscloud.training.compression import decode

# a contribution whose norm is above this many times the median of the other clouds' is refused: the
# median of the others is robust, one poisoned cloud cannot raise the bar it is measured against
NORM_FACTOR = 10.0


def read_delta(store: ObjectStore, cloud: str, commit: dict, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A cloud's verified pseudo-gradient, decompressed; anything malformed is refused."""
    if "delta.int8.safetensors" in commit["objects"]:
        try:
            delta = decode(from_bytes(read_object(store, commit, "delta.int8.safetensors")), params)
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"cloud {cloud}: {exc}") from None
    else:
        delta = from_bytes(read_object(store, commit, "delta.safetensors"))
    check_delta(cloud, delta, params)
    return delta


def check_delta(cloud: str, delta: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
    """A contribution must match the model exactly and be finite; anything else is refused."""
    if set(delta) != set(params):
        raise IntegrityError(f"cloud {cloud}: pseudo-gradient tensors {sorted(set(delta) ^ set(params))} do not match the model")
    for name, t in delta.items():
        if t.shape != params[name].shape or t.dtype != params[name].dtype:
            raise IntegrityError(f"cloud {cloud}: {name} is {tuple(t.shape)}/{t.dtype}, expected {tuple(params[name].shape)}/{params[name].dtype}")
        if not torch.isfinite(t).all():
            raise IntegrityError(f"cloud {cloud}: {name} holds NaN or Inf")


def norm(delta: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(t.float().pow(2).sum() for t in delta.values())))


def outliers(norms: dict[str, float], factor: float = NORM_FACTOR) -> dict[str, str]:
    """Clouds whose norm is above ``factor`` x the median of the others' norms, with why."""
    found = {}
    for cloud, n in norms.items():
        others = [v for c, v in norms.items() if c != cloud]
        bar = factor * statistics.median(others) if others else 0.0
        if bar > 0 and n > bar:
            found[cloud] = f"pseudo-gradient norm {n:.3g} is above {factor:g}x the median of the other clouds' ({bar / factor:.3g})"
    return found


def screen(stores: dict[str, ObjectStore], commits: dict[str, dict], params: dict[str, torch.Tensor],
           samples: dict[str, float]) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, str]]:
    """The round's accepted pseudo-gradients, and the refused clouds with why.

    Only clouds that trained (samples > 0) take part in the norm comparison: a
    cloud whose work moved away contributes zeros and says nothing about scale.
    """
    accepted, refused = {}, {}
    for cloud, commit in sorted(commits.items()):
        try:
            accepted[cloud] = read_delta(stores[cloud], cloud, commit, params)
        except (IntegrityError, PayloadError) as exc:
            refused[cloud] = str(exc)
    refused.update(outliers({c: norm(d) for c, d in accepted.items() if samples.get(c, 0) > 0}))
    return {c: d for c, d in accepted.items() if c not in refused}, refused
