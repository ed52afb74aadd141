"""The trigger of the deferred ``sync_checkpoints``: it waits in the triggerer until the run's watcher has work.

The clouds exchange and reduce each round themselves; Airflow only watches.
``RoundTrigger`` holds no worker slot and loads no tensor: it polls the engine
watcher's read-only ``peek`` (the round records in the home store, the
sub-tasks' states) and fires once there is something to do - a round decided,
a sub-task ended, a cloud draining, the last round recorded, a stall - so that
``SyncCheckpointsOperator.resume`` acts on it on a worker for a moment. A store
that cannot be read is logged and read again: an outage never ends the trigger.
Only when nothing could be read for longer than the run's ``round_timeout_s``
(counted from the last round recorded) does it fire, so that the worker says
why the run stalled.

The triggerer imports this module by its classpath: the package is installed
with the project, and the plugins folder, where it lives, is on the
triggerer's ``sys.path`` as well.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

CLASSPATH = "crosscloud_airflow.triggers.RoundTrigger"


def _transient_errors() -> tuple[type[BaseException], ...]:
    """What a store or a backend raises while it is unreachable: retried, never the end of the watch."""
    from crosscloud.backends.base import SubTaskError
    from crosscloud.store.base import StoreError

    return StoreError, SubTaskError, OSError


class RoundTrigger(BaseTrigger):
    """Fires when the watcher of run ``run`` (a ``RunRef`` as a dict) has something to do; its payload says why.

    ``since`` is when the watch last saw progress (the start of the watch, then
    each round recorded; epoch seconds), so that a stall is measured across
    deferrals; ``delay`` is a pause before the first look, which the operator
    lengthens while its visits find nothing to record (a round decided whose
    global is still being reduced).
    """

    def __init__(self, run: dict, handles: list[dict], poll_interval: float = 2.0, since: float | None = None,
                 delay: float = 0.0):
        super().__init__()
        self.run_dict, self.handles = dict(run), [dict(h) for h in handles]  # not self.run: that is the coroutine
        self.poll_interval, self.since, self.delay = float(poll_interval), since, float(delay)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"run": self.run_dict, "handles": self.handles, "poll_interval": self.poll_interval,
                           "since": self.since, "delay": self.delay}

    def _watcher(self):
        """The engine's watcher of the run (blocking: store reads), its clock of progress carried over."""
        from crosscloud.pipeline.subtasks import watcher
        from crosscloud_airflow.operators import run_ref

        return watcher(run_ref(self.run_dict), self.handles, log=self.log.info, since=self.since)

    def _event(self, reason: str, since: float | None) -> TriggerEvent:
        return TriggerEvent({"reason": reason, "since": since, "delay": self.delay})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        transient = _transient_errors()
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        w, failing_since, logged_at = None, None, 0.0
        while True:
            try:
                if w is None:
                    w = await asyncio.to_thread(self._watcher)
                reason = await asyncio.to_thread(w.peek)
                failing_since = None
            except transient as exc:
                now = time.time()
                if failing_since is None or now - logged_at >= 60:  # once at the start, then once a minute
                    self.log.warning("run %s: the watch cannot read the run (%s) for %.0f s; trying again every %g s",
                                     self.run_dict.get("run_id"), exc, now - (failing_since or now), self.poll_interval)
                    logged_at = now
                failing_since = failing_since or now
                # a store out for longer than a round may take: the worker says what stalled
                if w is not None and time.time() - max(w.since, failing_since) > w.plan.spec.round_timeout_s:
                    reason = f"unreadable for {time.time() - failing_since:.0f} s: {exc}"
                else:
                    await asyncio.sleep(self.poll_interval)
                    continue
            if reason is not None:
                self.log.info("run %s: %s", self.run_dict.get("run_id"), reason)
                yield self._event(reason, w.since if w is not None else self.since)
                return
            await asyncio.sleep(self.poll_interval)


QUEUE_CLASSPATH = "crosscloud_airflow.triggers.QueueTrigger"


class QueueTrigger(BaseTrigger):
    """Fires when run ``run_id`` of ``tenant`` leaves the queue's waiting line (queued, or paused): started, refused
    or ended.

    It holds no worker slot: the triggerer looks every ``poll_interval``
    seconds. Each look keeps the entry alive (an entry nobody looks at
    expires) and runs a scheduling pass when one is due (one at a time across
    every host), and the log says each new position and reason.
    """

    def __init__(self, federation_path: str, tenant: str, run_id: str, poll_interval: float = 10.0):
        super().__init__()
        self.federation_path, self.tenant, self.run_id = federation_path, tenant, run_id
        self.poll_interval = float(poll_interval)
        self._queue = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return QUEUE_CLASSPATH, {"federation_path": self.federation_path, "tenant": self.tenant, "run_id": self.run_id,
                                 "poll_interval": self.poll_interval}

    def _look(self):
        """Keep the entry alive, run a pass if one is due, and read where the run stands (blocking: the ledger)."""
        if self._queue is None:
            from crosscloud.core.federation import load_federation
            from crosscloud.ledger import Ledger
            from crosscloud.scheduler.service import Queue
            from crosscloud_airflow.connections import use_airflow_connections

            use_airflow_connections()
            self._queue = Queue(load_federation(self.federation_path), Ledger())
        self._queue.touch(self.tenant, self.run_id)
        self._queue.run_pass()
        return self._queue.status(self.tenant, self.run_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from crosscloud.ledger.queue import WAITING  # queued, or paused: both wait for a pass to start them

        said = None
        while True:
            try:
                status = await asyncio.to_thread(self._look)
            except Exception as exc:  # noqa: BLE001 - the ledger restarting, whatever it raises: look again
                self.log.warning("run %s: the queue cannot be read now (%s); looking again in %g s", self.run_id, exc,
                                 self.poll_interval)
                await asyncio.sleep(self.poll_interval)
                continue
            decision = status.decision
            if status.state not in WAITING or (decision is not None and decision.kind == "never"):
                yield TriggerEvent({"state": status.state, "reason": status.explain()})
                return
            if status.explain() != said:
                said = status.explain()
                self.log.info("run %s queued at %s", self.run_id, said)
            await asyncio.sleep(self.poll_interval)
