"""The ssh access method: a sub-task is a process session on a bare-metal host reached over SSH.

The host holds a prepared environment (``access.python``, the interpreter of a
venv with this package installed) and a folder for sub-task files
(``access.workdir``). Starting copies the federation file and the sub-task's
secret environment there over SFTP (mode 0600, deleted once read), starts the
worker detached in its own session (``setsid``) so that it outlives the SSH
connection, and returns. State, output and stopping work from the handle alone:
the exit code file, the log file and the process group on the host.

The engine takes plain host, user and key (``SSHTarget``); inside Airflow the
plugin installs a connector that builds the client from the cloud's SSH
Connection (``set_connector``).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from crosscloud.backends.base import Backend, Handle, RemoteState, SubTaskError, SubTaskSpec

# run on the host before starting: torch and the sub-task's module must be found by the prepared interpreter
_CHECK = "import importlib.util, sys; import torch; sys.exit(importlib.util.find_spec(sys.argv[1]) is None and 'no module ' + sys.argv[1])"
REMOTE_POLL_S = 0.5  # the coordinator polls often; the host is asked at most this often per sub-task


@dataclass(frozen=True)
class SSHTarget:
    """Where to log in: host, port, user, and the private key file (None: ssh-agent and ~/.ssh keys)."""

    host: str
    user: str
    port: int = 22
    key_file: str | None = None
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts; an unknown host key is refused either way

    @classmethod
    def from_access(cls, cloud: str, access: dict) -> SSHTarget:
        """Outside Airflow: host, port and user from the access section, key from ``CROSSCLOUD_<CLOUD>_SSH_KEY_FILE``."""
        prefix = "CROSSCLOUD_" + re.sub(r"[^A-Za-z0-9]", "_", cloud).upper() + "_SSH_"
        if not access.get("host"):
            raise SubTaskError(f"clouds.{cloud}.access.host: no host to reach {cloud} over SSH (or run under Airflow "
                               "with access.connection_id naming an SSH Connection)")
        return cls(host=access["host"], port=int(access.get("port") or 22),
                   user=access.get("user") or os.environ.get("USER", "root"),
                   key_file=os.environ.get(prefix + "KEY_FILE"), known_hosts=os.environ.get(prefix + "KNOWN_HOSTS"))

    def connect(self):
        import paramiko

        client = paramiko.SSHClient()
        client.load_host_keys(self.known_hosts) if self.known_hosts else client.load_system_host_keys()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(self.host, port=self.port, username=self.user, key_filename=self.key_file,
                       look_for_keys=self.key_file is None, allow_agent=self.key_file is None, timeout=30)
        return client


Connector = Callable[[str, dict], object]  # (cloud, access section) -> a connected paramiko.SSHClient
_connector: Connector | None = None
_clients: dict[tuple[str, str], object] = {}  # (cloud, its access section): a changed host gets its own client
_lock = threading.Lock()


def set_connector(connector: Connector | None) -> None:
    """Install (or with None remove) what opens the SSH client of a cloud; open clients are closed."""
    global _connector
    with _lock:
        if connector is _connector:
            return
        _connector = connector
        for client in _clients.values():
            client.close()
        _clients.clear()


def _client(cloud: str, access: dict):
    """One open client per cloud, access section and process, reopened when its transport died."""
    key = (cloud, json.dumps(access, sort_keys=True, default=str))
    with _lock:
        client = _clients.get(key)
        if client is None or not (client.get_transport() and client.get_transport().is_active()):
            connect = _connector or (lambda c, a: SSHTarget.from_access(c, a).connect())
            try:
                client = _clients[key] = connect(cloud, access)
            except Exception as exc:  # paramiko's and socket's errors alike: name the cloud and the host
                raise SubTaskError(f"cloud {cloud}: cannot reach {access.get('host') or access.get('connection_id')} "
                                   f"over SSH: {type(exc).__name__}: {exc}") from exc
        return client


def _run(cloud: str, access: dict, command: str) -> tuple[int, str]:
    """Run ``command`` on the host; its exit status and output."""
    _, stdout, stderr = _client(cloud, access).exec_command(command, timeout=60)
    out = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
    return stdout.channel.recv_exit_status(), out


def _put(cloud: str, access: dict, folder: str, files: dict[str, str], copies: dict[str, str] | None = None) -> None:
    """Write ``files`` (name -> text, mode 0600: they may hold secrets) into ``folder`` and copy local files there."""
    sftp = _client(cloud, access).open_sftp()
    try:
        for local, remote in (copies or {}).items():
            sftp.put(local, remote)
        for name, text in files.items():
            with sftp.open(posixpath.join(folder, name), "w") as fh:
                fh.chmod(0o600)
                fh.write(text)
    finally:
        sftp.close()


def _folder(access: dict, tenant: str, run_id: str, cloud: str) -> str:
    return posixpath.join(access["workdir"], "subtasks", tenant, run_id, cloud)


class SSHBackend(Backend):
    name = "ssh"

    def __init__(self) -> None:
        self._remote = RemoteState(REMOTE_POLL_S)

    def start(self, spec: SubTaskSpec) -> Handle:
        access = spec.access
        if not access.get("workdir") or not access.get("python"):
            raise SubTaskError(f"clouds.{spec.cloud}.access: method ssh needs workdir and python (the prepared environment)")
        found = self.find(spec.tenant, spec.run_id, spec.cloud, access)
        if found is not None and self.state(found) == "running":
            return found  # a retried dispatch must not start a second copy
        folder = _folder(access, spec.tenant, spec.run_id, spec.cloud)
        self._check_environment(spec, folder)
        remote_federation = posixpath.join(folder, "federation.yaml")
        secret_env = {"PYTHONUNBUFFERED": "1", **access.get("env", {}), **spec.env}
        files = {"env": "".join(f"export {k}={shlex.quote(v)}\n" for k, v in secret_env.items())}
        _put(spec.cloud, access, folder, files, copies={spec.federation: remote_federation} if spec.federation else {})
        python = shlex.quote(access["python"])
        launcher = f"-m torch.distributed.run --standalone --nproc-per-node={spec.devices} " if spec.devices > 1 else ""
        args = " ".join(shlex.quote(a) for a in spec.args_with_federation(remote_federation))
        # the secret environment is read, then removed; the exit code lands in rc, written last
        inner = (f". ./env && rm -f ./env && {python} {launcher}-m {spec.module} {args} >> subtask.log 2>&1; "
                 "echo $? > rc.tmp && mv rc.tmp rc")
        code, out = _run(spec.cloud, access, f"cd {shlex.quote(folder)} || exit 1; setsid nohup bash -c {shlex.quote(inner)} "
                         "</dev/null >/dev/null 2>&1 & echo $!")
        if code != 0 or not out.strip().isdigit():
            raise SubTaskError(f"cloud {spec.cloud}: could not start the sub-task on the host: {out.strip()[-300:]}")
        handle = {"backend": self.name, "cloud": spec.cloud, "tenant": spec.tenant, "run_id": spec.run_id,
                  "pid": int(out.strip()), "folder": folder, "accelerator": spec.accelerator, "devices": spec.devices,
                  "access": access, "args": spec.args, "started_at": time.time()}  # args: no secrets, those are env
        _put(spec.cloud, access, folder, {"handle.json": json.dumps(handle)})
        return handle

    @staticmethod
    def _check_environment(spec: SubTaskSpec, folder: str) -> None:
        """The host's prepared interpreter must find torch and the sub-task's module; its folder is made ready."""
        access = spec.access
        python = shlex.quote(access["python"])
        settings = " ".join(shlex.quote(f"{k}={v}") for k, v in access.get("env", {}).items())  # not secrets
        code, out = _run(spec.cloud, access, f"mkdir -p {shlex.quote(folder)} && rm -f {shlex.quote(folder)}/rc && "
                         f"test -x {python} && env {settings} {python} -c {shlex.quote(_CHECK)} {shlex.quote(spec.module)}")
        if code != 0:
            raise SubTaskError(f"cloud {spec.cloud}: the prepared environment {access['python']} on the host cannot run "
                               f"{spec.module} (install the package there): {out.strip()[-300:]}")

    def find(self, tenant: str, run_id: str, cloud: str, access: dict | None = None) -> Handle | None:
        if not access:
            raise SubTaskError(f"cloud {cloud}: finding an ssh sub-task needs the cloud's access section")
        code, out = _run(cloud, access, f"cat {shlex.quote(_folder(access, tenant, run_id, cloud))}/handle.json")
        return json.loads(out) if code == 0 else None

    def state(self, handle: Handle) -> str:
        return self._remote.state(handle["folder"], lambda: self._ask_state(handle))

    @staticmethod
    def _ask_state(handle: Handle) -> str:
        folder, pid = shlex.quote(handle["folder"]), int(handle["pid"])
        # a finished sub-task's rc, else whether its process session was alive; alive is asked first, so
        # that a sub-task ending in between is read by its rc, never taken for lost
        _, out = _run(handle["cloud"], handle["access"],
                      f"kill -0 {pid} 2>/dev/null && s=running || s=lost; cat {folder}/rc 2>/dev/null || echo $s")
        out = out.strip()
        return out if out in ("running", "lost") else ("succeeded" if out == "0" else "failed")

    def exit_code(self, handle: Handle) -> int | None:
        code, out = _run(handle["cloud"], handle["access"], f"cat {shlex.quote(handle['folder'])}/rc 2>/dev/null")
        text = out.strip()
        return int(text) if code == 0 and text.lstrip("-").isdigit() else None

    def logs(self, handle: Handle, offset: int = 0) -> tuple[str, int]:
        return self._remote.logs(handle["folder"], offset, lambda: self._read_log(handle, offset))

    @staticmethod
    def _read_log(handle: Handle, offset: int) -> tuple[str, int]:
        sftp = _client(handle["cloud"], handle["access"]).open_sftp()
        try:
            with sftp.open(posixpath.join(handle["folder"], "subtask.log"), "r") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return "", offset
        finally:
            sftp.close()
        cut = data.rfind(b"\n") + 1  # whole lines only
        return data[:cut].decode(errors="replace"), offset + cut

    def stop(self, handle: Handle, grace_s: float = 5.0) -> None:
        """TERM to the sub-task's process group, KILL after ``grace_s``; nothing if it already ended."""
        pid = int(handle["pid"])
        script = (f"kill -TERM -- -{pid} 2>/dev/null || exit 0; "
                  f"for i in $(seq {int(grace_s * 10)}); do kill -0 -- -{pid} 2>/dev/null || exit 0; sleep 0.1; done; "
                  f"kill -KILL -- -{pid} 2>/dev/null; exit 0")
        _run(handle["cloud"], handle["access"], script)
        self._remote.forget(handle["folder"])

    def address(self, cloud: str, access: dict) -> str:
        """The host's address as the SSH connection reached it (``access.serve_host`` overrides it for replicas)."""
        return _client(cloud, access).get_transport().getpeername()[0]

    def free_port(self, cloud: str, access: dict) -> int:
        """A port free on the host now, asked of its prepared interpreter."""
        code, out = _run(cloud, access, f"{shlex.quote(access['python'])} -c " + shlex.quote(
            "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"))
        if code != 0 or not out.strip().isdigit():
            raise SubTaskError(f"cloud {cloud}: could not find a free port on the host: {out.strip()[-300:]}")
        return int(out.strip())

    def used_devices(self) -> dict[str, dict[str, int]]:
        raise SubTaskError("ssh clouds report their sub-tasks per cloud (find); the ledger holds their reservations")
