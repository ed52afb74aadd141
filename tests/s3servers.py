"""Real S3-compatible server processes on 127.0.0.1 for the tests (moto's standalone server).

One process per cloud, so that cross-cloud transfers cross real HTTP connections.
With ``CI=true`` a server that cannot start fails the test; nothing is skipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, name: str, log_dir: Path):
        self.name, self.port = name, free_port()
        self.log = log_dir / f"s3-{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        moto = Path(sys.executable).with_name("moto_server")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(self.port)], stdout=log, stderr=log)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
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

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def make_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)
