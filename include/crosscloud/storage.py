"""Object stores, one per cloud: the only way state moves between clouds.

The embedded default keeps each cloud's objects in a folder (``file://``);
writes are atomic (temporary file + rename) so a reader never sees half an
object. Other schemes register here under their URL scheme.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from crosscloud.federation import Cloud


class StoreError(RuntimeError):
    """A store operation that failed; the message names the cloud and key."""


class ObjectNotFound(StoreError):
    pass


class ObjectStore:
    """The few operations the exchange protocol needs from any object store."""

    cloud: str

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError


class LocalStore(ObjectStore):
    """A folder on this machine standing in for a cloud's object store."""

    def __init__(self, root: str | os.PathLike, cloud: str = "local"):
        self.root = Path(root)
        self.cloud = cloud

    def __repr__(self) -> str:
        return f"LocalStore({self.cloud!r}, {str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise StoreError(f"cloud {self.cloud}: key {key!r} escapes the store root")
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cloud {self.cloud}: cannot write {key!r} under {self.root}: {exc}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"cloud {self.cloud}: no object {key!r} under {self.root}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        root = self.root.resolve()
        return sorted(
            str(p.relative_to(root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def state_dir() -> Path:
    """The project-local folder holding the embedded clouds' stores, logs and DBs."""
    default = Path(__file__).resolve().parents[2] / ".state"
    return Path(os.environ.get("CROSSCLOUD_STATE_DIR", default)).resolve()


def open_store(cloud: Cloud) -> ObjectStore:
    """The object store of ``cloud``; relative ``file://`` paths live in the state folder."""
    url = cloud.store.url
    if url.startswith("file://"):
        path = Path(url.removeprefix("file://"))
        return LocalStore(path if path.is_absolute() else state_dir() / path, cloud=cloud.name)
    raise StoreError(f"cloud {cloud.name}: store scheme of {url!r} is not supported yet (file:// only)")
