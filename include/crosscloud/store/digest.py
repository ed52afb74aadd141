"""Content digests, and the error for bytes that do not match the digest they were promised under."""

from __future__ import annotations

import hashlib

from crosscloud.store.base import StoreError


class IntegrityError(StoreError):
    """An object that does not match what its commit or manifest promised."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
