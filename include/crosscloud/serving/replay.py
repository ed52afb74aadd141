"""An offline replay of inference traffic: a real trace hour repeated over days under a daily profile.

Why repeat one hour: the public Azure LLM inference traces (Splitwise, ISCA
2024) cover one hour each, with real arrival times and context and generated
tokens per request. Each replayed hour takes ``round(peak x profile[local
hour])`` of those requests, evenly spread over the trace in time order (a
different starting point each hour), and keeps their offsets within the
hour and their tokens; more requests than the trace has repeat it. The
daily profile (``daily_profile``) is an assumption, stated in
``docs/serving.md``: a one-hour trace cannot give it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml


class ReplayError(ValueError):
    pass


@dataclass(frozen=True)
class Trace:
    """One hour of requests (several trace files merged), in arrival order."""

    offset_s: np.ndarray  # seconds after the first request, within [0, 3600)
    context: np.ndarray
    generated: np.ndarray
    sources: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.offset_s)


def read_azure_trace(paths: list[str | os.PathLike]) -> Trace:
    """Read ``TIMESTAMP,ContextTokens,GeneratedTokens`` files (CRLF) into one hour of requests."""
    stamps, ctx, gen = [], [], []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ReplayError(f"{path}: cannot read the trace: {e} (set CROSSCLOUD_DATA_DIR or pass --trace)") from None
        if not lines or lines[0].strip().split(",") != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ReplayError(f"{path}: expected the header TIMESTAMP,ContextTokens,GeneratedTokens")
        for n, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                t, c, g = line.strip().split(",")
                stamps.append(datetime.fromisoformat(t[:26]).replace(tzinfo=timezone.utc).timestamp())
                ctx.append(int(c))
                gen.append(int(g))
            except ValueError:
                raise ReplayError(f"{path}:{n}: cannot read {line!r}") from None
    if not stamps:
        raise ReplayError(f"no requests in {[str(p) for p in paths]}")
    t = np.asarray(stamps)
    order = np.argsort(t, kind="stable")
    offset = np.mod(t[order] - t.min(), 3600.0)
    return Trace(offset, np.asarray(ctx)[order], np.asarray(gen)[order], tuple(str(p) for p in paths))


def daily_profile(trough: float = 0.35, peak_hour: float = 15.0) -> np.ndarray:
    """Requests in each local hour as a fraction of the peak hour: a raised cosine from ``trough`` to 1."""
    h = np.arange(24)
    return trough + (1 - trough) * (1 + np.cos(2 * math.pi * (h - peak_hour) / 24)) / 2


@dataclass(frozen=True)
class Replay:
    """Requests of ``hours`` consecutive hours from hour index ``t0``, sorted by hour."""

    t0: int
    hours: int
    hour: np.ndarray  # replay hour of each request
    offset_s: np.ndarray
    context: np.ndarray
    generated: np.ndarray

    def __len__(self) -> int:
        return len(self.hour)

    def per_hour(self, values: np.ndarray) -> np.ndarray:
        """Sum of ``values`` over each hour's requests."""
        return np.bincount(self.hour, weights=values, minlength=self.hours)

    @property
    def tokens(self) -> np.ndarray:
        return self.context + self.generated


def build_replay(trace: Trace, t0: int, hours: int, peak_per_hour: float, profile: np.ndarray,
                 utc_offset_h: int = 0) -> Replay:
    """Repeat ``trace``'s hour ``hours`` times, ``peak_per_hour x profile[local hour]`` requests each."""
    if len(profile) != 24:
        raise ReplayError(f"the daily profile needs 24 values, got {len(profile)}")
    n_trace = len(trace)
    parts = []
    for h in range(hours):
        local = (t0 + h + utc_offset_h) % 24
        n = int(round(peak_per_hour * profile[local]))
        if n <= 0:
            continue
        shift = (h * 7919) % n_trace  # a different part of the trace each hour
        idx = (np.floor(np.arange(n) * n_trace / n).astype(np.int64) + shift) % n_trace
        idx = idx[np.argsort(trace.offset_s[idx], kind="stable")]
        parts.append((np.full(n, h), idx))
    hour = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    idx = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    return Replay(t0, hours, hour.astype(np.int64), trace.offset_s[idx], trace.context[idx], trace.generated[idx])


@dataclass(frozen=True)
class ReplayCloud:
    """A cloud of the replay: where it draws power, what it serves with, how far the tenant's users are."""

    name: str
    region: str  # electricity price region
    jurisdiction: str
    accelerator: str
    devices: int
    pue: float
    rtt_ms: float
    power_w: float | None = None  # full power of one device; default the accelerator's
    price_per_device_hour: float | None = None  # default: set by the caller (e.g. per unit of throughput)
    warm_from_h: int = 0  # replay hour from which the model is warm there (preheated)


def read_clouds(path: str | os.PathLike) -> list[ReplayCloud]:
    """The clouds of a replay from a YAML file with a ``clouds:`` list (see ``bench/inference_clouds.yaml``)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ReplayError(f"{path}: cannot read the clouds file: {e}") from None
    rows = (data or {}).get("clouds") if isinstance(data, dict) else None
    if not rows:
        raise ReplayError(f"{path}: expected a 'clouds:' list")
    fields = set(ReplayCloud.__dataclass_fields__)
    out = []
    for i, row in enumerate(rows):
        extra = set(row) - fields
        if extra:
            raise ReplayError(f"{path}: clouds.{i}: unknown field(s) {sorted(extra)}; known: {sorted(fields)}")
        try:
            out.append(ReplayCloud(**row))
        except TypeError as e:
            raise ReplayError(f"{path}: clouds.{i}: {e}") from None
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ReplayError(f"{path}: duplicate cloud names in {names}")
    return out
