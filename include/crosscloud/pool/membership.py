"""Clouds joining and leaving the federation while it runs.

A cloud receives work only when it has proved, by a tiny sub-task run on it,
that its store (with every tenant's credentials there), its launcher and its
environment work, and that an adapted image exists for its accelerators. The
result is recorded in the ledger, which placement reads each time: a joined
cloud is used by the next run with no restart, a drained one gets no new
sub-tasks while its running ones finish, and removing a cloud from the
federation file touches no other cloud.
"""

from __future__ import annotations

import json
import secrets
import time

from crosscloud.backends import SubTaskError, SubTaskSpec, get_backend
from crosscloud.core.federation import Federation
from crosscloud.ledger import Ledger
from crosscloud.store.base import StoreError
from crosscloud.store.credentials import credentials_env
from crosscloud.store.open_store import open_store


def _check(fed: Federation, name: str, timeout_s: float) -> str:
    """Run every check; returns what was proved, raises with what failed."""
    cloud = fed.cloud(name)
    unadapted = [p.accelerator for p in cloud.pools if not any(i.accelerator == p.accelerator for i in fed.images)]
    if unadapted:
        raise RuntimeError(f"images: no adapted image registered for {unadapted} (add one under images:)")
    tenants = [t.name for t in fed.tenants if t.quotas.get(name, 0) > 0]
    if not tenants:
        raise RuntimeError("tenants: no tenant has quota on this cloud")
    for tenant in tenants:  # each tenant reaches the store with its own credentials
        store = open_store(cloud, tenant)
        key = f"{tenant}/probe/store-{secrets.token_hex(4)}"
        try:
            store.put(key, b"probe")
            if store.get(key) != b"probe":
                raise RuntimeError(f"store: tenant {tenant} read back other bytes than it wrote")
            store.delete(key)
        except (StoreError, OSError) as exc:
            raise RuntimeError(f"store: tenant {tenant}: {exc}") from None
    tenant, nonce = tenants[0], secrets.token_hex(8)
    run_id = f"join-{int(time.time())}-{nonce[:6]}"
    store, key = open_store(cloud, tenant), f"{tenant}/probe/{run_id}"
    store.put(f"{key}/challenge.json", json.dumps({"nonce": nonce}).encode())
    pool = cloud.pools[0]
    image = next(i.image for i in fed.images if i.accelerator == pool.accelerator)
    spec = SubTaskSpec(tenant=tenant, run_id=run_id, cloud=name, image=image, accelerator=pool.accelerator, devices=1,
                       module="crosscloud.training.join_probe", args=["--tenant", tenant, "--cloud", name, "--key", key],
                       env=credentials_env(cloud, tenant), access=cloud.access.model_dump())
    try:
        backend = get_backend(cloud.access.method)
        handle = backend.start(spec)
    except SubTaskError as exc:
        raise RuntimeError(f"launcher: {exc}") from None
    deadline = time.monotonic() + timeout_s
    while backend.state(handle) == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    state = backend.state(handle)
    if state != "succeeded":
        backend.stop(handle)
        tail = backend.logs(handle)[0].strip().splitlines()[-3:]
        raise RuntimeError(f"launcher: probe sub-task {state} after {timeout_s:.0f} s at most: {' | '.join(tail) or 'no output'}")
    answer = json.loads(store.get(f"{key}/answer.json"))
    if answer.get("nonce") != nonce:
        raise RuntimeError("launcher: the probe answered another challenge")
    for suffix in ("challenge.json", "answer.json"):
        store.delete(f"{key}/{suffix}")
    return (f"store ok for {', '.join(tenants)}; {cloud.access.method} launcher ran a probe with torch {answer['torch']} "
            f"on {pool.accelerator}; images for {[p.accelerator for p in cloud.pools]}")


def join(fed: Federation, name: str, ledger: Ledger | None = None, timeout_s: float = 120.0) -> tuple[bool, str]:
    """Check ``name`` and record the result; a passing cloud takes work at the next placement."""
    ledger = ledger or Ledger()
    try:
        ok, detail = True, _check(fed, name, timeout_s)
    except Exception as exc:  # whatever broke, the cloud must not take work, and the ledger must say why
        ok, detail = False, f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc)
    ledger.record_check(name, ok, detail)
    return ok, detail


def drain(fed: Federation, name: str, ledger: Ledger | None = None) -> None:
    fed.cloud(name)
    (ledger or Ledger()).set_state(name, "draining")


def activate(fed: Federation, name: str, ledger: Ledger | None = None) -> None:
    fed.cloud(name)
    (ledger or Ledger()).set_state(name, "active")
