"""Real S3-compatible server processes on 127.0.0.1 for the tests (moto's standalone server).

One process per cloud, so that cross-cloud transfers cross real HTTP connections.
With ``CI=true`` a server that cannot start fails the test; nothing is skipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Gate:
    """A TCP forwarder in front of a server: while closed it refuses every connection."""

    def __init__(self, port: int, target: int):
        self.target, self.open = target, True
        self.sock = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


class S3Server:
    def __init__(self, name: str, log_dir: Path, restartable: bool = False):
        self.name, self.port = name, free_port()
        self.log = log_dir / f"s3-{name}.log"
        self.proc: subprocess.Popen | None = None
        self._client = None
        # a restartable server sits behind a gate, so it can be re-provisioned before clients reach it
        self._gate = _Gate(self.port, free_port()) if restartable else None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _server_port(self) -> int:
        return self._gate.target if self._gate else self.port

    def start(self, timeout: float = 30.0) -> None:
        moto = Path(sys.executable).with_name("moto_server")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(self._server_port)], stdout=log, stderr=log)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self._server_port}", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        message = f"S3 server {self.name} did not start on {self.endpoint}; see {self.log}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self, down_s: float, buckets: list[str]) -> None:
        """Kill the server and bring up a new, empty one on the same endpoint after ``down_s``.

        moto keeps objects in memory, so the new server is empty but for
        ``buckets``, re-created (as a real server would have kept them) before the
        gate lets clients in again: no client ever sees a half-provisioned server.
        """
        self._gate.open = False
        self.stop()
        time.sleep(down_s)
        self.start()
        for bucket in buckets:
            self.client(direct=True).create_bucket(Bucket=bucket)
        self._gate.open = True

    def client(self, direct: bool = False):
        """A client of the endpoint (or, ``direct``, of the server behind the gate)."""
        import boto3

        url = f"http://127.0.0.1:{self._server_port}" if direct else self.endpoint
        return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def make_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)
