"""Failpoints: named places where a benchmark or a test makes a sub-task die, at exactly that place.

``CROSSCLOUD_FAILPOINTS="shanghai:reduce:2,beijing:publish:1"`` kills (SIGKILL)
the sub-task of cloud shanghai when its exchange of round 2 is halfway through
its reduce, and beijing's between writing global 2 and committing it. Each
fires once: a marker file is left in ``folder`` (the cloud's spool, which a
restarted sub-task on the same host finds), so the restarted one goes on.
Unset, nothing ever fires.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "CROSSCLOUD_FAILPOINTS"


def armed(point: str, cloud: str, round_: int) -> bool:
    """Whether ``point`` is set for ``cloud`` at ``round_``."""
    wanted = {tuple(item.strip().split(":")) for item in os.environ.get(ENV, "").split(",") if item.strip()}
    return (cloud, point, str(round_)) in wanted


def hit(point: str, cloud: str, round_: int, folder: Path) -> None:
    """Die here, once, if ``point`` is armed for ``cloud`` at ``round_``."""
    if not armed(point, cloud, round_):
        return
    marker = Path(folder) / f"failpoint-{point}-{round_}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{cloud} killed at {point} of round {round_}\n")
    print(f"failpoint: cloud {cloud} killed at {point} of round {round_}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
