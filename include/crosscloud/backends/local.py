"""The local access method: a sub-task is a process tree on this machine.

The process runs in its own session, so it outlives the Airflow task that
started it (dispatch must not wait for training) and can be stopped as a whole
group. Its output goes to a log file beside a handle file, so that any later
task - the coordinator, a UI, a kill callback - can find, read and stop it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from crosscloud.backends.base import Backend, Handle, SubTaskError, SubTaskSpec
from crosscloud.core.deployment import require_single_host
from crosscloud.core.paths import state_dir
from crosscloud.core.ports import free_port


def _subtasks_root() -> Path:
    return state_dir() / "subtasks"


def _started_since_boot(pid: int) -> float:
    """When process ``pid`` started, in seconds since boot.

    Its wall-clock create time moves whenever the clock is stepped (NTP, a VM
    resumed from a snapshot), which made a running sub-task look like another
    process, lost; time since boot does not move. Read again if the clock
    stepped between the two reads.
    """
    while True:
        boot = psutil.boot_time()
        created = psutil.Process(pid).create_time()
        if psutil.boot_time() == boot:
            return created - boot


class LocalBackend(Backend):
    name = "local"

    def _command(self, spec: SubTaskSpec) -> list[str]:
        if spec.devices > 1:  # one process per device, ordinary data parallelism inside the cloud
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.devices}"]
            return [*launcher, "-m", spec.module, *spec.args]
        return [sys.executable, "-m", spec.module, *spec.args]

    def find(self, tenant: str, run_id: str, cloud: str, access: dict | None = None) -> Handle | None:
        handle_file = _subtasks_root() / tenant / run_id / cloud / "handle.json"
        return json.loads(handle_file.read_text()) if handle_file.exists() else None

    @staticmethod
    def check_environment(spec: SubTaskSpec) -> None:
        """A local cloud's "image" is this environment: the worker's module and torch must import here."""
        for module in (spec.module, "torch"):
            if importlib.util.find_spec(module) is None:
                raise SubTaskError(
                    f"cloud {spec.cloud}: the environment {sys.executable} lacks {module!r}; install the package there "
                    "(make install) before dispatching"
                )

    def start(self, spec: SubTaskSpec) -> Handle:
        require_single_host(f"cloud {spec.cloud}'s access method local", "reach the cloud by ssh or kubernetes")
        self.check_environment(spec)
        folder = _subtasks_root() / spec.tenant / spec.run_id / spec.cloud
        folder.mkdir(parents=True, exist_ok=True)
        handle = self.find(spec.tenant, spec.run_id, spec.cloud)
        if handle is not None and self.state(handle) == "running":
            return handle  # a retried dispatch must not start a second copy
        log, rc = folder / "subtask.log", folder / "rc"
        rc.unlink(missing_ok=True)
        command = self._command(spec)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **spec.env}
        script = f'"$@" >> {shlex.quote(str(log))} 2>&1; echo $? > {shlex.quote(str(rc))}.tmp; mv {shlex.quote(str(rc))}.tmp {shlex.quote(str(rc))}'
        try:
            proc = subprocess.Popen(
                ["bash", "-c", script, "crosscloud-subtask", *command],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise SubTaskError(f"cloud {spec.cloud}: cannot start sub-task {command[:3]}: {exc}") from exc
        handle = {
            "backend": self.name,
            "cloud": spec.cloud,
            "tenant": spec.tenant,
            "run_id": spec.run_id,
            "pid": proc.pid,
            "started_since_boot": _started_since_boot(proc.pid),
            "accelerator": spec.accelerator,
            "devices": spec.devices,
            "log": str(log),
            "rc": str(rc),
            "command": command,
            "started_at": time.time(),
        }
        (folder / "handle.json").write_text(json.dumps(handle, indent=2))
        return handle

    def _process(self, handle: Handle) -> psutil.Process | None:
        try:
            proc = psutil.Process(handle["pid"])
            # another process under a reused pid, or a handle of an older version (no start time since boot)
            if abs(_started_since_boot(proc.pid) - handle.get("started_since_boot", -1.0)) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.NoSuchProcess:
            return None

    def state(self, handle: Handle) -> str:
        alive = self._process(handle) is not None  # before rc: a sub-task ending in between has written its rc
        rc = Path(handle["rc"])
        if rc.exists():
            return "succeeded" if rc.read_text().strip() == "0" else "failed"
        return "running" if alive else "lost"

    def exit_code(self, handle: Handle) -> int | None:
        rc = Path(handle["rc"])
        return int(rc.read_text().strip()) if rc.exists() else None

    def logs(self, handle: Handle, offset: int = 0) -> tuple[str, int]:
        try:
            with open(handle["log"], "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return "", offset
        # hand out whole lines only, so a line is never split between two reads
        cut = data.rfind(b"\n") + 1
        return data[:cut].decode(errors="replace"), offset + cut

    def stop(self, handle: Handle, grace_s: float = 5.0) -> None:
        if self._process(handle) is None:
            return
        pgid = handle["pid"]  # start_new_session: the pid is the group id
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if self._process(handle) is None:
                    return
                time.sleep(0.1)

    def address(self, cloud: str, access: dict) -> str:
        return "127.0.0.1"

    def free_port(self, cloud: str, access: dict) -> int:
        return free_port(self.address(cloud, access))

    def used_devices(self) -> dict[str, dict[str, int]]:
        used: dict[str, dict[str, int]] = {}
        for handle_file in _subtasks_root().glob("*/*/*/handle.json"):
            handle = json.loads(handle_file.read_text())
            if self.state(handle) == "running":
                per_cloud = used.setdefault(handle["cloud"], {})
                per_cloud[handle["accelerator"]] = per_cloud.get(handle["accelerator"], 0) + handle["devices"]
        return used
