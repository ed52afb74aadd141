"""A real Redis server on 127.0.0.1 for the tests (Debian's redis-server): Celery's broker.

Own port and folder, nothing saved to disk. With ``CI=true`` a server that
cannot start fails the test; elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from airflowstandalone import unavailable
from s3servers import free_port


class RedisServer:
    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            unavailable("redis-server not found: install Debian's redis-server (apt-get install -y redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "redis.log", "wb") as log:
            self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                          "--appendonly", "no", "--dir", str(self.folder)], stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                unavailable(f"redis-server exited with {self.proc.returncode}: {(self.folder / 'redis.log').read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        unavailable(f"redis-server did not answer on 127.0.0.1:{self.port} within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
