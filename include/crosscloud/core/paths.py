"""Where the embedded deployment keeps its state, and where the public data lies."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # include/crosscloud/core/paths.py -> the repository


def state_dir() -> Path:
    """The project-local folder holding the embedded clouds' stores, logs and DBs."""
    default = REPO / ".state"
    return Path(os.environ.get("CROSSCLOUD_STATE_DIR", default)).resolve()


def data_dir() -> Path:
    """Public data the benchmarks and feeds read: ``$CROSSCLOUD_DATA_DIR``, else ``../shared/data`` beside the repository."""
    return Path(os.environ.get("CROSSCLOUD_DATA_DIR") or REPO.parent / "shared" / "data")
