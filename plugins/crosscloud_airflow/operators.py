"""Operators of the ``cross_cloud_training`` stages that need more than ``@task``.

``LocalSubTaskOperator`` starts one cloud's sub-task through the local access
method and returns its handle at once; a further access method is a further
operator here. ``SyncCheckpointsOperator`` runs the coordinator and stops the
sub-tasks when it is killed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


def _handles(handles: Any) -> list[dict]:
    """The mapped dispatch tasks' handles as a list (indexing, so no lookup past the end)."""
    return [handles[i] for i in range(len(handles))]


def run_ref(run: dict):
    """The engine's handle on a run, with store credentials taken from Airflow Connections."""
    from crosscloud.pipeline import RunRef
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    return RunRef(**run)


class LocalSubTaskOperator(BaseOperator):
    """Start the sub-task of ``cloud`` as processes on this machine; returns its handle."""

    template_fields: Sequence[str] = ("run", "cloud")
    ui_color = "#d9ead3"

    def __init__(self, *, run: Any, cloud: str, **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.cloud = cloud

    def execute(self, context) -> dict:
        from crosscloud.pipeline import dispatch_stage

        handle = dispatch_stage(run_ref(self.run), self.cloud)
        self.log.info("cloud %s: sub-task started, pid %s, log %s", self.cloud, handle["pid"], handle["log"])
        return handle


class SyncCheckpointsOperator(BaseOperator):
    """The coordinator: one outer step per round until the last; relays sub-task logs."""

    template_fields: Sequence[str] = ("run", "handles")
    ui_color = "#cfe2f3"

    def __init__(self, *, run: Any, handles: Any, **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.handles = handles

    def execute(self, context) -> list[dict]:
        from crosscloud.pipeline import sync_stage

        history = sync_stage(run_ref(self.run), _handles(self.handles), log=self.log.info)
        return [{k: v for k, v in r.items() if k not in ("clouds", "shares", "next_shares")} for r in history]

    def on_kill(self) -> None:
        from crosscloud.pipeline import release_stage, stop_run

        self.log.info("coordinator killed: stopping every sub-task of the run and releasing its devices")
        ref = run_ref(self.run)
        try:
            stop_run(ref, _handles(self.handles))
        finally:
            release_stage(ref)
