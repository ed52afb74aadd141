"""Whether crosscloud runs on one host or several, and what a multi-host deployment may not rely on.

Under Airflow's LocalExecutor (or ``airflow standalone``) every task runs on one
machine, so a SQLite ledger, processes started here and stores in a local
folder are shared by all of them. Under the CeleryExecutor, the
KubernetesExecutor or the EdgeExecutor, each task may run on another host:
anything one task leaves on its own disk is invisible to the next. The
Airflow plugin tells the engine the executor (``set_executor``); outside
Airflow, ``CROSSCLOUD_EXECUTOR`` or ``AIRFLOW__CORE__EXECUTOR`` says it.
"""

from __future__ import annotations

import os

# executors whose tasks run on hosts other than the scheduler's
MULTI_HOST_EXECUTORS = ("CeleryExecutor", "KubernetesExecutor", "EdgeExecutor", "CeleryKubernetesExecutor",
                        "LocalKubernetesExecutor")

_executor: str | None = None


class SingleHostOnly(RuntimeError):
    """Something that works on one host only, asked for in a deployment of several."""


def set_executor(name: str | None) -> None:
    """The executor Airflow's configuration names (one, or several comma-separated); None forgets it."""
    global _executor
    _executor = name


def executor() -> str:
    return _executor or os.environ.get("CROSSCLOUD_EXECUTOR") or os.environ.get("AIRFLOW__CORE__EXECUTOR") or ""


def multi_host() -> bool:
    """Whether a task may run on another host than the task before it."""
    names = [n.strip().rsplit(".", 1)[-1].split(":")[-1] for n in executor().split(",")]
    return any(n in MULTI_HOST_EXECUTORS for n in names)


def require_single_host(what: str, fix: str) -> None:
    """Refuse ``what`` under a multi-host executor, saying what to use instead."""
    if multi_host():
        raise SingleHostOnly(f"{what} works on one host only, and Airflow runs tasks on several ({executor()}): {fix}")
