"""Object stores, one per cloud: the only way state moves between clouds.

The embedded default keeps each cloud's objects in a folder (``file://``);
writes are atomic (temporary file + rename) so a reader never sees half an
object. Other schemes register here under their URL scheme.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

CHUNK = 8 * 1024 * 1024


class StoreError(RuntimeError):
    """A store operation that failed; the message names the cloud and key."""


class ObjectNotFound(StoreError):
    pass


class ObjectStore:
    """The few operations the exchange protocol needs from any object store."""

    cloud: str
    jurisdiction: str | None = None  # the cloud's, set by open_store: where resident data may be copied to

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def put_stream(self, key: str, stream: BinaryIO) -> None:
        """Write an object read from ``stream`` without holding it whole in memory."""
        raise NotImplementedError

    def iter_chunks(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """An object's bytes, ``chunk`` at a time."""
        raise NotImplementedError

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of an object from ``start``: how chunks are read out of packs."""
        raise NotImplementedError

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if it does not exist; False if it already did."""
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
        self._top = os.path.abspath(root)  # keys are checked lexically: a call costs no system call

    def __repr__(self) -> str:
        return f"LocalStore({self.cloud!r}, {str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = os.path.normpath(os.path.join(self._top, key))
        if path != self._top and not path.startswith(self._top + os.sep):
            raise StoreError(f"cloud {self.cloud}: key {key!r} escapes the store root")
        return Path(path)

    def _staged(self, key: str, stream: BinaryIO) -> tuple[Path, str]:
        """Write ``stream`` to a temporary file beside ``key``'s path; returns (path, temporary)."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    shutil.copyfileobj(stream, fh, CHUNK)
            except BaseException:  # a full disk leaves no half-written temporary behind
                os.unlink(tmp)
                raise
        except OSError as exc:
            raise StoreError(f"cloud {self.cloud}: cannot write {key!r} under {self.root}: {exc}") from exc
        return path, tmp

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, io.BytesIO(data))

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"cloud {self.cloud}: no object {key!r} under {self.root}") from None

    def put_stream(self, key: str, stream: BinaryIO) -> None:
        path, tmp = self._staged(key, stream)
        os.replace(tmp, path)  # atomic: a reader sees the old object or the new one, never half

    def iter_chunks(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        try:
            fh = open(self._path(key), "rb")
        except FileNotFoundError:
            raise ObjectNotFound(f"cloud {self.cloud}: no object {key!r} under {self.root}") from None
        with fh:
            while data := fh.read(chunk):
                yield data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(start)
                return fh.read(length)
        except FileNotFoundError:
            raise ObjectNotFound(f"cloud {self.cloud}: no object {key!r} under {self.root}") from None

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path, tmp = self._staged(key, io.BytesIO(data))
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if the key exists
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self._top)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class TenantStore(ObjectStore):
    """A store seen through one tenant's eyes: every key must lie under ``<tenant>/``."""

    def __init__(self, inner: ObjectStore, tenant: str):
        self.inner, self.tenant, self.cloud, self.jurisdiction = inner, tenant, inner.cloud, inner.jurisdiction

    def __repr__(self) -> str:
        return f"TenantStore({self.tenant!r}, {self.inner!r})"

    def _check(self, key: str) -> str:
        parts = key.split("/")
        # no "..", "." or empty segment (which a file store would collapse), no control characters
        if (parts[0] != self.tenant or len(parts) < 2 or any(p in ("", ".", "..") for p in parts[1:])
                or any(ord(ch) < 32 or ch in "\\\x7f" for ch in key)):
            raise StoreError(f"cloud {self.cloud}: tenant {self.tenant} may not touch {key!r}")
        return key

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(self._check(key), data)

    def get(self, key: str) -> bytes:
        return self.inner.get(self._check(key))

    def put_stream(self, key: str, stream: BinaryIO) -> None:
        self.inner.put_stream(self._check(key), stream)

    def iter_chunks(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        return self.inner.iter_chunks(self._check(key), chunk)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(self._check(key), start, length)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(self._check(key), data)

    def exists(self, key: str) -> bool:
        return self.inner.exists(self._check(key))

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(self._check(prefix))

    def delete(self, key: str) -> None:
        self.inner.delete(self._check(key))
