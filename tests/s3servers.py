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

from crosscloud.core.ports import free_port  # the tests' servers (here, pgserver, redisserver...) take their ports from it


class _Gate:
    """A TCP forwarder in front of a server: while closed it refuses every connection.

    Faults for the tests: ``cut`` drops the connections already open (clients
    keep pooled ones), ``flips`` damages that many responses in transit by
    flipping one bit of the body of the next ranged (206) responses, and while
    ``busy`` every request is answered 503 Slow Down, as a throttling store does.
    """

    def __init__(self, port: int, target: int):
        self.target, self.open, self.busy = target, True, False
        self.flips, self.flipped, self.refused = 0, 0, 0
        self.live: set[socket.socket] = set()
        self.sock = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.open:
                self.refused += 1
                client.close()
                continue
            if self.busy:
                threading.Thread(target=self._slow_down, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            self.live |= {client, upstream}
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _slow_down(self, client: socket.socket) -> None:
        """Answer each request on this connection 503 (S3's SlowDown) until the client closes it."""
        body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        answer = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nRetry-After: 1\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
        try:
            client.settimeout(30)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := client.recv(1 << 16)):
                data += chunk
            client.sendall(answer)
        except OSError:
            pass
        finally:
            client.close()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool = False) -> None:
        state = "idle"
        try:
            while data := src.recv(1 << 16):
                if downstream and self.flips:
                    data, state = self._flip(data, state)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self.live.discard(s)
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _flip(self, data: bytes, state: str) -> tuple[bytes, str]:
        """Flip one bit of the first body byte of a 206 response; ``state`` carries over between reads."""
        start = 0
        if state == "idle":
            start = data.find(b"HTTP/1.1 206")
            if start < 0:
                return data, "idle"
            state = "headers"
        if state == "headers":
            end = data.find(b"\r\n\r\n", start)
            if end < 0:
                return data, "headers"
            state, start = "body", end + 4
        if start >= len(data):
            return data, "body"
        damaged = bytearray(data)
        damaged[start] ^= 0x01
        self.flips, self.flipped = self.flips - 1, self.flipped + 1
        return bytes(damaged), "idle"

    def cut(self) -> None:
        for s in list(self.live):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def tenant_policy(bucket: str, prefix: str, tenant: str, actions: tuple[str, ...] = ("GetObject", "PutObject", "DeleteObject")) -> dict:
    """An IAM policy giving ``actions`` on the objects under ``<prefix>/<tenant>/`` only, and listing the bucket."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": [f"s3:{a}" for a in actions], "Resource": f"arn:aws:s3:::{bucket}/{prefix}/{tenant}/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}"},
    ]}


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

    def outage(self, down_s: float) -> None:
        """The server unreachable for ``down_s``, its objects kept: new connections refused, open ones dropped.

        Restartable servers only (they sit behind the gate); ``refused`` counts the connections turned away.
        """
        self._gate.open = False
        self._gate.cut()
        time.sleep(down_s)
        self._gate.open = True

    def slow_down(self, busy_s: float) -> None:
        """Every request answered 503 Slow Down for ``busy_s`` (open connections dropped first); restartable only."""
        self._gate.busy = True
        self._gate.cut()
        time.sleep(busy_s)
        self._gate.busy = False

    def flip_in_transit(self, responses: int = 1) -> None:
        """Damage the body of the next ``responses`` ranged reads on their way to the client (one bit each)."""
        self._gate.flips += responses

    @property
    def flipped(self) -> int:
        return self._gate.flipped

    @property
    def refused(self) -> int:
        return self._gate.refused

    def enforce_policies(self, policies: dict[str, dict]) -> dict[str, dict[str, str]]:
        """Turn on moto's IAM checks with one user per entry of ``policies``; returns each user's credentials.

        Once on, every request must be signed by a user whose policy allows it,
        as on a real cloud's store; set up buckets before.
        """
        import json
        import urllib.request

        import boto3

        iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{self._server_port}", region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        credentials = {}
        for user, policy in policies.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName=f"{user}-store", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            credentials[user] = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
        request = urllib.request.Request(f"http://127.0.0.1:{self._server_port}/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()
        return credentials

    def client(self, direct: bool = False):
        """A client of the endpoint (or, ``direct``, of the server behind the gate)."""
        import boto3

        url = f"http://127.0.0.1:{self._server_port}" if direct else self.endpoint
        return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def make_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)
