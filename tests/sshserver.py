"""A real OpenSSH server on 127.0.0.1 for the tests: Debian's sshd with its own config, keys and port.

The host key and the user key are generated into a temporary folder; only key
authentication is allowed, as the current user. With ``CI=true`` a server that
cannot start fails the test; elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from s3servers import free_port

SSHD = Path("/usr/sbin/sshd")


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _keypair(path: Path) -> str:
    """An Ed25519 private key in OpenSSH format at ``path``; returns the public key line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


class SSHServer:
    def __init__(self, folder: Path):
        self.folder, self.port, self.user = folder, free_port(), getpass.getuser()
        self.key_file = folder / "id_ed25519"
        self.known_hosts = folder / "known_hosts"
        self.proc: subprocess.Popen | None = None
        self.host_key = ""

    def start(self) -> None:
        if not SSHD.exists():
            _unavailable(f"{SSHD} not found: install Debian's openssh-server (apt-get install -y openssh-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        self.host_key = _keypair(self.folder / "host_ed25519")
        (self.folder / "authorized_keys").write_text(_keypair(self.key_file) + "\n")
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_key}\n")
        sftp = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if Path(p).exists()),
                    "internal-sftp")
        config = self.folder / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.folder / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {self.folder / 'authorized_keys'}\nPidFile {self.folder / 'sshd.pid'}\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nLogLevel VERBOSE\n"
            f"Subsystem sftp {sftp}\n"
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        log = open(self.folder / "sshd.log", "w")
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _unavailable(f"sshd exited with {self.proc.returncode}: {(self.folder / 'sshd.log').read_text()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        _unavailable(f"sshd did not listen on 127.0.0.1:{self.port} within 20 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
