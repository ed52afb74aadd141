"""Helpers for tests that run DAGs with ``dag.test()``."""

from __future__ import annotations

import copy
from contextlib import contextmanager


@contextmanager
def params_restored(dag):
    """``dag.test(run_conf=...)`` writes the conf into the DAG's and its tasks' own Param objects (Airflow merges
    them in place): put them back, so later runs of the session's DAG get their defaults."""
    holders = [dag.params] + [t.params for t in dag.tasks if t.params]  # each task has Param objects of its own
    saved = [(h, {k: copy.deepcopy(h.get_param(k).value) for k in h.keys()}) for h in holders]
    try:
        yield dag
    finally:
        for h, values in saved:
            for k, v in values.items():
                h.get_param(k).value = v
