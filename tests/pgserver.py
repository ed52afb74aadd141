"""A throwaway PostgreSQL server on 127.0.0.1 from Debian's binaries, for the tests and ``make bench-admission``.

``initdb`` and ``postgres`` refuse to run as root, so as root both run as the
``postgres`` system user that Debian's package creates (``runuser``), in a
temporary folder of that user's; elsewhere as the current user. Trust
authentication on 127.0.0.1 and a unix socket in the folder; the server
stops, and its folder goes, at ``stop``. The tests' fixture turns
``PostgresUnavailable`` into a skip, or a failure with ``CI=true``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from s3servers import free_port

BIN_GLOB = "/usr/lib/postgresql/*/bin"
INSTALL = "install Debian's postgresql package (apt-get install -y postgresql)"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries, or a server that would not start; the message says which."""


def binaries() -> Path:
    """The newest installed version's bin folder (``/usr/lib/postgresql/<version>/bin``)."""
    found = [Path(p) for p in glob.glob(BIN_GLOB) if (Path(p) / "initdb").exists() and (Path(p) / "pg_ctl").exists()]
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL server binaries in {BIN_GLOB}: {INSTALL}")
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


class PostgresServer:
    """One server: ``url(dbname)`` and ``create_database(name)`` give SQLAlchemy URLs; ``port`` its TCP port."""

    user = "postgres"  # the superuser initdb makes, trusted on 127.0.0.1

    def __init__(self, settings: dict[str, str] | None = None):
        self.port = free_port()
        self.settings = {"listen_addresses": "127.0.0.1", "max_connections": "200", **(settings or {})}
        self.folder: Path | None = None
        self._bin = Path()
        self._as: list[str] = []

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([*self._as, *args], capture_output=True, text=True, cwd=tempfile.gettempdir())
        if done.returncode != 0:
            output = (done.stderr or done.stdout)[-800:]
            raise PostgresUnavailable(f"{Path(args[0]).name} exited with {done.returncode}: {output}")
        return done

    def _own_folder(self) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="crosscloud-pg-"))
        if os.geteuid() == 0:  # initdb and postgres refuse root: run them as Debian's postgres user
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(f"running as root needs the postgres system user: {INSTALL}") from None
            os.chown(folder, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        return folder

    def start(self) -> PostgresServer:
        self._bin = bin_dir = binaries()
        self.folder = self._own_folder()
        data, log = self.folder / "data", self.folder / "server.log"
        self._run(str(bin_dir / "initdb"), "-D", str(data), "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-sync")
        try:
            self._start_server()
        except PostgresUnavailable as exc:
            tail = log.read_text()[-800:] if log.exists() else ""
            self.stop()
            raise PostgresUnavailable(f"{exc}\n{tail}") from None
        return self

    def _start_server(self) -> None:
        options = " ".join(f"-c {k}={v}" for k, v in
                           {**self.settings, "port": str(self.port), "unix_socket_directories": str(self.folder)}.items())
        self._run(str(self._bin / "pg_ctl"), "-D", str(self.folder / "data"), "-l", str(self.folder / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")

    def crash(self, down_s: float = 0.0) -> None:
        """Stop at once, as a crash of the server's processes would: what was not written from its WAL buffers is
        lost; then, ``down_s`` later, start it again on the same data and port."""
        self._run(str(self._bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        time.sleep(down_s)
        self._start_server()

    def stop(self) -> None:
        if self.folder is None:
            return
        if (self.folder / "data" / "postmaster.pid").exists():
            subprocess.run([*self._as, str(self._bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop"],
                           capture_output=True, cwd=tempfile.gettempdir())
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """A new empty database ``name`` (kept if it exists); returns its URL."""
        import psycopg2
        from psycopg2 import sql

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres")
        try:
            conn.autocommit = True  # CREATE DATABASE runs outside a transaction
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        finally:
            conn.close()
        return self.url(name)
