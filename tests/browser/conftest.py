"""The browser tests' headless Chromium, one per test module (``browserkit.chromium``)."""

from __future__ import annotations

import pytest
from browserkit import chromium


@pytest.fixture(scope="module")
def browser():
    yield from chromium()
