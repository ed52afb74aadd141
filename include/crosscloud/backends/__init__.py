"""Access methods: how a sub-task is started, watched and stopped on a cloud.

Each method is one module with one ``Backend`` class, registered here by the
name a federation file uses under ``access.method``.
"""

from __future__ import annotations

from crosscloud.backends.base import Backend, Handle, SubTaskError, SubTaskSpec
from crosscloud.backends.kubernetes import KubernetesBackend
from crosscloud.backends.local import LocalBackend
from crosscloud.backends.ssh import SSHBackend

BACKENDS: dict[str, type[Backend]] = {"local": LocalBackend, "kubernetes": KubernetesBackend, "ssh": SSHBackend}


def get_backend(method: str) -> Backend:
    try:
        return BACKENDS[method]()
    except KeyError:
        raise SubTaskError(
            f"no engine backend for access method {method!r}; available: {sorted(BACKENDS)}"
        ) from None


__all__ = ["BACKENDS", "Backend", "Handle", "SubTaskError", "SubTaskSpec", "get_backend"]
