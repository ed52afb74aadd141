"""The embedded federation, optionally changed, for tests that need a variant of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, Federation, parse_federation


def embedded_raw(mutate: Callable[[dict], None] | None = None) -> dict:
    """The embedded federation file's raw YAML, after ``mutate`` edits it."""
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    if mutate:
        mutate(raw)
    return raw


def embedded(mutate: Callable[[dict], None] | None = None) -> Federation:
    """The embedded federation file, parsed after ``mutate`` edits its raw YAML."""
    return parse_federation(embedded_raw(mutate))


def embedded_file(path: Path, mutate: Callable[[dict], None] | None = None) -> Path:
    """The changed embedded federation written to ``path``, for stages that load a federation file."""
    path.write_text(yaml.safe_dump(embedded_raw(mutate)))
    return path
