"""A benchmark's ``--arg K=V`` flags as a program's arguments (``bench-gap``, ``bench-sdk``)."""

from __future__ import annotations

import json


def program_args(pairs: list[str]) -> dict:
    """--arg K=V pairs as the program's arguments, values as JSON where they parse."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
