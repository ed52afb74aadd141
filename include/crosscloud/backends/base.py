"""What every access method offers: start, state, logs, stop and free capacity."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


class SubTaskError(RuntimeError):
    """A sub-task that could not be started or that failed."""


@dataclass(frozen=True)
class SubTaskSpec:
    """What to run for one cloud's sub-task; a backend decides how."""

    tenant: str
    run_id: str
    cloud: str
    image: str
    accelerator: str
    devices: int
    module: str = "crosscloud.training.worker"
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    access: dict = field(default_factory=dict)  # the cloud's federation ``access`` section: where and how to start
    retries: int = 0  # a backend that restarts sub-tasks itself (Kubernetes' backoffLimit) does so this many times
    peers: list[str] = field(default_factory=list)  # the run's other clouds, whose stores the sub-task reads deltas from

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def federation(self) -> str | None:
        """The federation file named by ``--federation``, if the arguments name one."""
        return self.args[self.args.index("--federation") + 1] if "--federation" in self.args else None

    def args_with_federation(self, path: str) -> list[str]:
        """The arguments with ``--federation`` pointing at ``path``: the file's copy where the sub-task runs."""
        args = list(self.args)
        if "--federation" in args:
            args[args.index("--federation") + 1] = path
        return args


# A handle is a JSON-serialisable dict (it travels through Airflow XCom) with at
# least "backend", "cloud" and whatever the backend needs to find the sub-task.
Handle = dict

STATES = ("running", "succeeded", "failed", "lost")


# the worker's exit codes that running it again cannot cure: the run was stopped, the program failed
STOPPED, PROGRAM_FAILED, EXCHANGE_FAILED, PAUSED = 3, 4, 5, 6


class Backend:
    name: str
    restarts_itself = False  # True: a sub-task that died is started again by the backend, not by the coordinator

    def start(self, spec: SubTaskSpec) -> Handle:
        raise NotImplementedError

    def state(self, handle: Handle) -> str:
        """One of STATES."""
        raise NotImplementedError

    def logs(self, handle: Handle, offset: int = 0) -> tuple[str, int]:
        """Output written since ``offset``, and the offset to ask from next time."""
        raise NotImplementedError

    def exit_code(self, handle: Handle) -> int | None:
        """The ended sub-task's exit code, where the backend can tell it (None: running, or not known)."""
        return None

    def stop(self, handle: Handle) -> None:
        raise NotImplementedError

    def find(self, tenant: str, run_id: str, cloud: str, access: dict | None = None) -> Handle | None:
        """The handle of a run's sub-task on ``cloud`` (reached through its ``access`` section), if one was started."""
        raise NotImplementedError

    def used_devices(self) -> dict[str, dict[str, int]]:
        """Devices held by running sub-tasks: {cloud: {accelerator: n}}."""
        raise NotImplementedError

    def address(self, cloud: str, access: dict) -> str:
        """The address at which this host reaches a process the backend starts on ``cloud`` (a serving replica)."""
        raise SubTaskError(f"cloud {cloud}: the {self.name} access method starts no process this host can reach")

    def free_port(self, cloud: str, access: dict) -> int:
        """A TCP port free now where the backend starts processes on ``cloud``."""
        raise SubTaskError(f"cloud {cloud}: the {self.name} access method starts no process this host can reach")


class RemoteState:
    """A remote sub-task's state and output, asked at most every ``interval_s``.

    The coordinator polls every few tens of milliseconds; a host over SSH or a
    Kubernetes API server is asked far less often. A finished state is final.
    """

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._asked: dict[tuple[str, str], float] = {}
        self._state: dict[str, str] = {}

    def _due(self, key: str, what: str) -> bool:
        now = time.monotonic()
        if now - self._asked.get((key, what), float("-inf")) < self.interval_s:
            return False
        self._asked[(key, what)] = now
        return True

    def state(self, key: str, ask: Callable[[], str]) -> str:
        known = self._state.get(key)
        if known in (None, "running") and (self._due(key, "state") or known is None):
            self._state[key] = known = ask()
        return known

    def logs(self, key: str, offset: int, ask: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        """New output; once the sub-task is known to have ended, its last lines at once."""
        ended = self._state.get(key, "running") != "running"
        return ask() if ended or self._due(key, "logs") else ("", offset)

    def forget(self, key: str) -> None:
        self._state.pop(key, None)
