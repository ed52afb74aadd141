"""Training data every machine with Python has offline: the standard library's source.

A seeded selection of ``.py`` files is split into byte shards for training and a
held-out part for evaluation. The same seed gives the same bytes on the same
Python, so shard digests are stable and preheating can skip what is there.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

HELD_OUT_FRACTION = 0.1


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo"}
    return sorted(
        p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts) and p.stat().st_size > 2000
    )


def build_corpus(shards: int, seed: int, max_bytes: int = 4_000_000) -> tuple[list[bytes], bytes]:
    """Return ``shards`` training byte strings and one held-out byte string."""
    files = _stdlib_files()
    random.Random(seed).shuffle(files)
    chosen, total = [], 0
    for path in files:
        data = path.read_bytes()
        chosen.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    n_held = max(1, int(len(chosen) * HELD_OUT_FRACTION))
    held_out = b"\n".join(chosen[:n_held])
    train = chosen[n_held:]
    if len(train) < shards:
        raise ValueError(f"corpus has {len(train)} files, fewer than the {shards} shards asked for")
    return [b"\n".join(train[i::shards]) for i in range(shards)], held_out
