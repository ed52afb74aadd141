"""What every access method offers: start, state, logs, stop and free capacity."""

from __future__ import annotations

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
    module: str = "crosscloud.worker"
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# A handle is a JSON-serialisable dict (it travels through Airflow XCom) with at
# least "backend", "cloud" and whatever the backend needs to find the sub-task.
Handle = dict

STATES = ("running", "succeeded", "failed", "lost")


class Backend:
    name: str

    def start(self, spec: SubTaskSpec) -> Handle:
        raise NotImplementedError

    def state(self, handle: Handle) -> str:
        """One of STATES."""
        raise NotImplementedError

    def logs(self, handle: Handle, offset: int = 0) -> tuple[str, int]:
        """Output written since ``offset``, and the offset to ask from next time."""
        raise NotImplementedError

    def stop(self, handle: Handle) -> None:
        raise NotImplementedError

    def find(self, tenant: str, run_id: str, cloud: str) -> Handle | None:
        """The handle of a run's sub-task on ``cloud``, if one was started."""
        raise NotImplementedError

    def used_devices(self) -> dict[str, dict[str, int]]:
        """Devices held by running sub-tasks: {cloud: {accelerator: n}}."""
        raise NotImplementedError
