"""The embedded federation, optionally changed, for tests that need a variant of it."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from crosscloud.federation import DEFAULT_FEDERATION, Federation, parse_federation


def embedded(mutate: Callable[[dict], None] | None = None) -> Federation:
    """The embedded federation file, parsed after ``mutate`` edits its raw YAML."""
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    if mutate:
        mutate(raw)
    return parse_federation(raw)
