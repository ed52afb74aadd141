"""A tenant's served model across clouds, as it runs: its router, its replicas, the last decision and grid cuts.

Why one object: every task that changes serving (the hourly placement, a grid
request, its end, an operator stopping it) must see what the others left, and
they run in different processes, on different hosts under the CeleryExecutor.
The fleet's record is in the ledger's database (``serving_fleets``): the
replicas it started, the decision in force, the grid cuts in force, and where
its router runs (address, runtime API, jurisdictions). Changes take turns
(``FleetRecords.changing``) whichever host makes them. Replicas and HAProxy
are processes of their own sessions, so they outlive the task that started
them; the router's configuration and log stay in the state folder of the host
that runs it.

Changes never fail a request: new replicas come up and pass the router's own
health check before they get a share; a replica leaves only after the router
stopped sending it requests and its in-flight ones finished; a new model
version is brought up beside the old one before the old one is drained.
"""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from crosscloud.core.federation import load_federation
from crosscloud.core.paths import state_dir
from crosscloud.ledger import Ledger
from crosscloud.serving import kubernetes as kube
from crosscloud.serving.replica import ServeSpec, bring_up, endpoint_of, find, replica_arg, running, stop, take_down
from crosscloud.serving.router import Endpoint, Router, RouterError


class FleetError(RuntimeError):
    """A serving change that cannot be made; the message says which cloud and why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(replica: Replica) -> dict:
    """The replica's /health body (status, what it served), or ``{"status": "unreachable"}``. A Kubernetes cloud's
    pods are vLLM's, whose /health is empty: their readiness, as the API server counts it, and no meter."""
    if replica.handle["backend"] == "kubernetes":
        return {"status": "ready", "served": {}, "pods": f"{replica.handle['ready']}/{replica.handle['pods']}"}
    try:
        return httpx.get(f"{replica.handle['url']}/health", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {"status": "unreachable"}


@dataclass(frozen=True)
class Replica:
    cloud: str
    index: int
    handle: dict

    @property
    def model(self) -> str:
        return replica_arg(self.handle, "--model")

    @property
    def server(self) -> str:
        return Endpoint(self.cloud, self.index, "", 0).server


class Fleet:
    """The running deployment of one served model of one tenant (see the module docstring)."""

    def __init__(self, tenant: str, name: str, root: Path | None = None, ledger: Ledger | None = None):
        """``root``: where this host keeps a router it runs (``<state>/serving``); ``ledger``: the deployment's."""
        self.tenant, self.name = tenant, name
        self.folder = (root or state_dir() / "serving") / tenant / name
        self.router_folder = self.folder / "router"
        self.records = (ledger or Ledger()).fleets

    def _read(self, part: str, default):
        return self.records.get(self.tenant, self.name).get(part, default)

    def _write(self, part: str, value) -> None:
        self.records.update(self.tenant, self.name, **{part: value})

    @property
    def spec(self) -> ServeSpec | None:
        raw = self._read("spec", None)
        return ServeSpec(**raw) if raw else None

    @property
    def decision(self) -> dict | None:
        """The decision in force: what the last placement (or grid request) set, with its inputs."""
        return self._read("decision", None)

    def save_decision(self, record: dict) -> None:
        self._write("decision", record)

    def cuts(self, now: float | None = None) -> dict[str, dict]:
        """Grid cuts in force, by cloud: each ``{reduce_pct, within_s, until}``; ended ones are dropped."""
        now = time.time() if now is None else now
        return {c: cut for c, cut in self._read("cuts", {}).items() if cut["until"] > now}

    def set_cut(self, cloud: str, cut: dict | None) -> None:
        cuts = self.cuts()
        cuts.pop(cloud, None) if cut is None else cuts.__setitem__(cloud, cut)
        self._write("cuts", cuts)

    def router(self) -> Router | None:
        """The fleet's router if its HAProxy runs and answers, on this host or another."""
        info = self._recorded_router()
        return Router.attach(info, self._save_router) if info and Router.reachable(info) else None

    def _save_router(self, info: dict) -> None:
        self._write("router", info)

    def open_router(self, jurisdictions: frozenset[str] | None, port: int = 0) -> Router:
        """The running router, or a new one bound to the tenant's jurisdictions: on ``port``, else on the port of
        the router this fleet had (its clients keep their URL), else a free one. A new router takes back every
        replica still running and the shares in force (``restore``)."""
        router = self.router()
        if router is not None:
            if router.jurisdictions != jurisdictions:
                raise FleetError(f"the router of {self.tenant}/{self.name} serves requests that may go to "
                                 f"{sorted(router.jurisdictions or ['anywhere'])}, not {sorted(jurisdictions or ['anywhere'])}: "
                                 f"stop it first (crosscloud serve stop) to change the residency rule")
            return router
        port = port or (self._recorded_router() or {}).get("port", 0)
        router = Router(self.router_folder, port or free_port(), jurisdictions=jurisdictions, on_save=self._save_router)
        router.start()
        self._readmit(router)
        return router

    def restore(self) -> Router:
        """The router again after its HAProxy died (a crash, the host restarted): the same port and residency rule,
        every replica still running behind it once HAProxy's own check passes, and the shares in force."""
        with self.records.changing(self.tenant, self.name):
            return self._restore()

    def _restore(self) -> Router:
        recorded = self._recorded_router()
        if recorded is None:
            raise FleetError(f"{self.tenant}/{self.name} never had a router here: the inference_placement DAG starts one")
        allowed = recorded.get("jurisdictions")
        return self.open_router(None if allowed is None else frozenset(allowed))

    def _recorded_router(self) -> dict | None:
        """What the router this fleet last started recorded (addresses, residency rule), running or not."""
        return self._read("router", None)

    def _readmit(self, router: Router) -> None:
        """Put the running replicas behind a new router, each given its share once healthy, as ``apply`` does."""
        live, spec = self.replicas(), self.spec
        if not live:
            return
        fed = load_federation(spec.federation)
        for r in live:
            router.add(endpoint_of(r.handle, r.index, fed.cloud(r.cloud).jurisdiction))
        for r in live:
            router.wait_healthy(r.server)
        decision = self.decision or {}
        router.set_weights({c: s for c, s in decision.get("shares", {}).items() if s > 0})

    def replicas(self) -> list[Replica]:
        """Replicas the fleet started whose processes run, and the Kubernetes clouds where its pods are ready."""
        spec, out = self.spec, []
        clouds = {c.name: c for c in load_federation(spec.federation).clouds} if spec else {}
        for cloud, index in self._read("replicas", []):
            handle = find(spec, clouds[cloud], index) if cloud in clouds else None
            if handle is not None and running(handle):
                out.append(Replica(cloud, index, handle))
        for cloud in self._read("kubernetes", {}):  # a Deployment: one replica at its Service, while a pod is ready
            handle = kube.replica_handle(spec, clouds[cloud]) if cloud in clouds else None
            if handle is not None:
                out.append(Replica(cloud, 0, handle))
        return out

    def _remember(self, spec: ServeSpec, replicas: list[tuple[str, int]]) -> None:
        self.records.update(self.tenant, self.name, spec=spec.__dict__, replicas=sorted(set(map(tuple, replicas))))

    def _forget_dead(self, router: Router, live: list[Replica]) -> None:
        """Servers the router still lists whose process is gone: out of rotation, so no request tries them."""
        alive = {r.server for r in live}
        for server in [s for s in router.endpoints if s not in alive]:
            router.remove(server, timeout_s=5)

    def apply(self, spec: ServeSpec, shares: dict[str, float], replicas: dict[str, int],
              jurisdictions: frozenset[str] | None = None, port: int = 0, ready_timeout_s: float = 120.0) -> dict:
        """Make the fleet serve ``spec`` with these replicas per cloud and split new requests by ``shares``; one
        change at a time, from whichever host."""
        with self.records.changing(self.tenant, self.name):
            return self._apply(spec, shares, replicas, jurisdictions, port, ready_timeout_s)

    def _apply(self, spec: ServeSpec, shares: dict[str, float], replicas: dict[str, int],
               jurisdictions: frozenset[str] | None, port: int, ready_timeout_s: float) -> dict:
        router = self.open_router(jurisdictions, port)
        fed = load_federation(spec.federation)
        pods = {c: n for c, n in replicas.items() if fed.cloud(c).access.method == "kubernetes"}
        replicas = {c: n for c, n in replicas.items() if c not in pods}
        every = self.replicas()
        self._forget_dead(router, every)
        live = [r for r in every if r.handle["backend"] != "kubernetes"]
        current = [r for r in live if r.model == spec.model]
        stale = [r for r in live if r.model != spec.model]
        used = {(r.cloud, r.index) for r in live}
        started = []
        for cloud, want in sorted(replicas.items()):
            for _ in range(want - sum(r.cloud == cloud for r in current)):
                index = next(i for i in range(len(used) + 1) if (cloud, i) not in used)
                used.add((cloud, index))
                self._remember(spec, list(used))
                try:
                    handle = bring_up(router, spec, cloud, index, ready_timeout_s)
                except (RouterError, RuntimeError) as e:
                    raise FleetError(f"cloud {cloud}: replica {index} of {spec.name} did not come up: {e}") from e
                current.append(Replica(cloud, index, handle))
                started.append(f"{cloud}-{index}")
        started += self._pods_up(router, fed, spec, pods)
        wanted = {c: s for c, s in shares.items() if s > 0}
        router.set_weights(wanted)
        extra = [r for cloud, want in replicas.items()
                 for r in sorted((r for r in current if r.cloud == cloud), key=lambda r: r.index)[max(want, 0):]]
        extra += [r for r in current if r.cloud not in replicas]
        for replica in stale + extra:  # the router stops sending them requests; in-flight ones finish there
            take_down(router, replica.handle, replica.index)
        stopped = [r.server for r in stale + extra] + self._pods_down(router, fed, spec, pods)
        kept = [r for r in current if r not in extra]
        weights = router.set_weights(wanted)
        self._remember(spec, [(r.cloud, r.index) for r in kept])
        return {"router": router.url, "started": started, "stopped": stopped, "weights": weights}

    def _pods_up(self, router: Router, fed, spec: ServeSpec, pods: dict[str, int]) -> list[str]:
        """Each Kubernetes cloud's Deployment applied at its count, every pod ready and its Service behind the
        router; the clouds that were not serving before, as router servers."""
        before, started = self._read("kubernetes", {}), []
        for cloud, count in sorted(pods.items()):
            if count <= 0:
                continue
            self.records.update(self.tenant, self.name, spec=spec.__dict__,
                                kubernetes={**self._read("kubernetes", {}), cloud: count})
            try:
                kube.bring_up(router, fed, spec, fed.cloud(cloud), count)
            except (RouterError, RuntimeError) as e:
                raise FleetError(f"cloud {cloud}: the pods serving {spec.name} did not come up: {e}") from e
            started += [] if cloud in before else [f"{cloud}-0"]
        return started

    def _pods_down(self, router: Router | None, fed, spec: ServeSpec, pods: dict[str, int]) -> list[str]:
        """Kubernetes clouds that served and no longer should: out of the router, their objects removed."""
        gone = [c for c in self._read("kubernetes", {}) if pods.get(c, 0) <= 0]
        for cloud in gone:
            kube.take_down(router, spec, fed.cloud(cloud))
        self._write("kubernetes", {c: n for c, n in pods.items() if n > 0})
        return [f"{cloud}-0" for cloud in gone]

    def served(self) -> dict[str, list[dict]]:
        """Each running replica's own measure of what it served (its /health ``served``), by cloud."""
        out: dict[str, list[dict]] = {}
        for r in self.replicas():
            body = _health(r)
            out.setdefault(r.cloud, []).append({"replica": r.server, "status": body.get("status"), **body.get("served", {})})
        return out

    def token_counts(self) -> dict[str, int]:
        """Tokens each running replica answered since it started, by replica and start (a restart is a new one)."""
        out = {}
        for r in self.replicas():
            tokens = _health(r).get("served", {}).get("tokens")
            if tokens is not None:  # unreachable now: its tokens count at the next reading that reaches it
                out[f"{r.server}@{r.handle.get('started_at', 0)}"] = int(tokens)
        return out

    def stop(self) -> list[str]:
        """Stop every replica (each finishes its in-flight requests) and the router."""
        with self.records.changing(self.tenant, self.name):
            return self._stop()

    def forget(self) -> None:
        """Stop it and drop its record: it leaves ``crosscloud serve status`` and the page."""
        self.stop()
        self.records.delete(self.tenant, self.name)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _stop(self) -> list[str]:
        spec, router, stopped = self.spec, self.router(), []
        for r in self.replicas():
            if r.handle["backend"] == "kubernetes":
                continue  # below, whether its pods are ready or not
            if router is not None and r.server in router.endpoints:
                take_down(router, r.handle, r.index)
            else:
                stop(r.handle, grace_s=10)
            stopped.append(r.server)
        if spec is not None:
            stopped += self._pods_down(router, load_federation(spec.federation), spec, {})
        if router is not None:
            router.stop()
        if spec is not None:
            self._remember(spec, [])
        return stopped
