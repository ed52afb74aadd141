"""The live progress line: rounds per cloud from a run's log, stage lines above it."""

from __future__ import annotations

import io

from crosscloud.tracking.progress import Progress

LOG = """\
2026-12-03T06:57:30.1Z [info     ] placement beijing/cpu: chosen - free [airflow.task] loc=x.py:1
[DAG TEST] end task task_id=preheat map_index=-1 run_start_date=x
[DAG TEST] end task task_id=dispatch_local map_index=1 run_start_date=x
2026-12-03T06:57:40.1Z [info     ] [beijing] round 0: loss 5.1 -> 3.2, 40.0 ms/step [airflow.task.operators.X] loc=coordinator.py:121
2026-12-03T06:57:41.1Z [info     ] [shanghai] round 0: loss 5.1 -> 3.3, 45.0 ms/step [airflow.task.operators.X] loc=coordinator.py:121
2026-12-03T06:57:42.1Z [info     ] round 0: eval loss 2.7842, wall 9.99 s [airflow.task.operators.X] loc=coordinator.py:230
2026-12-03T06:57:43.1Z [info     ] [beijing] round 1: loss 3.2 -> 2.9, 40.0 ms/step [airflow.task.operators.X] loc=coordinator.py:121
some other line that is not shown
baseline: none recorded for key abc; calibrating 2 single-cluster rounds on beijing
[beijing] round 0: loss 5.1 -> 3.0, 30.0 ms/step
"""


def _feed(live: bool) -> tuple[Progress, str]:
    out = io.StringIO()
    progress = Progress(rounds=4, out=out, live=live)
    for line in LOG.splitlines():
        progress.feed(line)
        if line.startswith("2026-12-03T06:57:43"):
            assert progress.status() == "training: round 1/4 | beijing ##.. 2/4 | shanghai #... 1/4 | eval loss 2.7842"
    progress.close()
    return progress, out.getvalue()


def test_rounds_per_cloud_and_stage_lines_in_a_log():
    progress, text = _feed(live=False)
    lines = text.splitlines()
    assert lines[:3] == ["placement beijing/cpu: chosen - free", "stage done: preheat", "stage done: dispatch_local [1]"]
    assert "training: round 1/4 | beijing ##.. 2/4 | shanghai #... 1/4 | eval loss 2.7842" in lines
    assert "some other line" not in text
    # the calibration of the baseline starts a new count with its own rounds
    assert lines[-2].startswith("baseline: none recorded")
    assert progress.status() == lines[-1] == "baseline: round 0/2 | beijing #. 1/2"


def test_on_a_terminal_the_line_is_redrawn_in_place():
    _, text = _feed(live=True)
    assert "\r\033[Ktraining: round 1/4 | beijing ##.. 2/4" in text
    assert "\r\033[Kbaseline: none recorded" in text  # a stage line first clears the live line
    assert text.endswith("baseline: round 0/2 | beijing #. 1/2\n")
