"""A short soak of the whole deployment under seeded random faults, so every CI run exercises the harness.

``make bench-soak`` at its defaults soaks for 30 minutes; here a few minutes of
the same harness (``bench/soak.py``), with a shorter lease so that a frozen
sub-task outlives it within the soak, and the checker's verdict over the whole
history: no violation of any invariant, and the runs completed.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.soak, pytest.mark.multihost, pytest.mark.slow, pytest.mark.e2e]


def test_a_short_seeded_soak_breaks_no_invariant(tmp_path, capsys):
    import os

    import soak

    saved = dict(os.environ)  # the harness sets the deployment's Connections for its own process
    try:
        code = soak.main(["--seed", "7", "--minutes", "2", "--fault-rate", "3", "--in-flight", "1", "--rounds", "4",
                          "--lease-s", "20", "--grace-s", "10", "--deferrable-share", "0", "--drain-minutes", "10",
                          "--out", str(tmp_path / "soak")])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in last.split())
    assert code == 0, out[-4000:]
    assert int(figures["invariant_violations"]) == 0 and int(figures["committed_bytes_lost"]) == 0, last
    assert int(figures["faults_injected"]) >= 1 and int(figures["runs_completed"]) >= 2, last
