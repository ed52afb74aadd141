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
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from crosscloud.core.federation import load_federation
from crosscloud.core.paths import state_dir
from crosscloud.core.ports import free_port
from crosscloud.ledger import Ledger
from crosscloud.serving import kubernetes as kube
from crosscloud.serving.replica import ServeSpec, bring_up, endpoint_of, find, replica_arg, running, stop, take_down
from crosscloud.serving.router import Endpoint, Router, RouterError, router_address


class FleetError(RuntimeError):
    """A serving change that cannot be made; the message says which cloud and why."""


def _spec(record: dict) -> ServeSpec | None:
    raw = record.get("spec")
    return ServeSpec(**raw) if raw else None


def _in_force(cuts: dict | None, now: float) -> dict[str, dict]:
    return {c: cut for c, cut in (cuts or {}).items() if cut["until"] > now}


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

    def _record(self) -> dict:
        """The fleet's whole ledger record: read once per operation and handed down, not once per part."""
        return self.records.get(self.tenant, self.name)

    def _write(self, part: str, value) -> None:
        self.records.update(self.tenant, self.name, **{part: value})

    @property
    def spec(self) -> ServeSpec | None:
        return _spec(self._record())

    @property
    def decision(self) -> dict | None:
        """The decision in force: what the last placement (or grid request) set, with its inputs."""
        return self._record().get("decision")

    def save_decision(self, record: dict) -> None:
        self._write("decision", record)

    def cuts(self, now: float | None = None) -> dict[str, dict]:
        """Grid cuts in force, by cloud: each ``{reduce_pct, within_s, until}``; ended ones are dropped."""
        return _in_force(self._record().get("cuts"), time.time() if now is None else now)

    def set_cut(self, cloud: str, cut: dict | None) -> None:
        """Set (None: end) one cloud's cut; ended ones are dropped. One ledger transaction from read to write, so a
        host setting another cloud's cut at the same time keeps it."""
        now = time.time()

        def change(cuts: dict | None) -> dict:
            kept = _in_force(cuts, now)
            kept.pop(cloud, None) if cut is None else kept.__setitem__(cloud, cut)
            return kept

        self.records.update_part(self.tenant, self.name, "cuts", change)

    def router(self, record: dict | None = None) -> Router | None:
        """The fleet's router if its HAProxy runs and answers, on this host or another."""
        info = (self._record() if record is None else record).get("router")
        return Router.attach(info, self._save_router) if info and Router.reachable(info) else None

    def _save_router(self, info: dict) -> None:
        self._write("router", info)

    def open_router(self, jurisdictions: frozenset[str] | None, port: int = 0) -> Router:
        """The running router, or a new one bound to the tenant's jurisdictions: on ``port``, else on the port of
        the router this fleet had (its clients keep their URL), else a free one. A new router takes back every
        replica still running and the shares in force (``restore``)."""
        return self._open_router(jurisdictions, port, self._record())

    def _open_router(self, jurisdictions: frozenset[str] | None, port: int, record: dict) -> Router:
        router = self.router(record)
        if router is not None:
            if router.jurisdictions != jurisdictions:
                raise FleetError(f"the router of {self.tenant}/{self.name} serves requests that may go to "
                                 f"{sorted(router.jurisdictions or ['anywhere'])}, not {sorted(jurisdictions or ['anywhere'])}: "
                                 f"stop it first (crosscloud serve stop) to change the residency rule")
            return router
        port, address = port or (record.get("router") or {}).get("port", 0), router_address()
        router = Router(self.router_folder, port or free_port(address), jurisdictions=jurisdictions, address=address,
                        on_save=self._save_router)
        router.start()
        self._readmit(router, record)  # router.start wrote only the router part: the rest is as read
        return router

    def restore(self) -> Router:
        """The router again after its HAProxy died (a crash, the host restarted): the same port and residency rule,
        every replica still running behind it once HAProxy's own check passes, and the shares in force."""
        with self.records.changing(self.tenant, self.name):
            return self._restore()

    def _restore(self) -> Router:
        record = self._record()
        recorded = record.get("router")  # what the router last started recorded, running or not
        if recorded is None:
            raise FleetError(f"{self.tenant}/{self.name} never had a router here: the inference_placement DAG starts one")
        allowed = recorded.get("jurisdictions")
        return self._open_router(None if allowed is None else frozenset(allowed), 0, record)

    def _readmit(self, router: Router, record: dict) -> None:
        """Put the running replicas behind a new router, each given its share once healthy, as ``apply`` does."""
        live, spec = self.replicas(record), _spec(record)
        if not live:
            return
        fed = load_federation(spec.federation)
        for r in live:
            router.add(endpoint_of(r.handle, r.index, fed.cloud(r.cloud).jurisdiction))
        for r in live:
            router.wait_healthy(r.server)
        decision = record.get("decision") or {}
        router.set_weights({c: s for c, s in decision.get("shares", {}).items() if s > 0})

    def replicas(self, record: dict | None = None) -> list[Replica]:
        """Replicas the fleet started whose processes run, and the Kubernetes clouds where its pods are ready."""
        record = self._record() if record is None else record
        spec, out = _spec(record), []
        clouds = {c.name: c for c in load_federation(spec.federation).clouds} if spec else {}
        for cloud, index in record.get("replicas", []):
            handle = find(spec, clouds[cloud], index) if cloud in clouds else None
            if handle is not None and running(handle):
                out.append(Replica(cloud, index, handle))
        for cloud in record.get("kubernetes", {}):  # a Deployment: one replica at its Service, while a pod is ready
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
        record = self._record()  # read once; this change is the only writer of its parts meanwhile (``changing``)
        router = self._open_router(jurisdictions, port, record)
        fed = load_federation(spec.federation)
        pods = {c: n for c, n in replicas.items() if fed.cloud(c).access.method == "kubernetes"}
        replicas = {c: n for c, n in replicas.items() if c not in pods}
        every = self.replicas(record)
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
        started += self._pods_up(router, fed, spec, pods, record)
        wanted = {c: s for c, s in shares.items() if s > 0}
        router.set_weights(wanted)
        extra = [r for cloud, want in replicas.items()
                 for r in sorted((r for r in current if r.cloud == cloud), key=lambda r: r.index)[max(want, 0):]]
        extra += [r for r in current if r.cloud not in replicas]
        for replica in stale + extra:  # the router stops sending them requests; in-flight ones finish there
            take_down(router, replica.handle, replica.index)
        stopped = [r.server for r in stale + extra] + self._pods_down(router, fed, spec, pods, record)
        kept = [r for r in current if r not in extra]
        weights = router.set_weights(wanted)
        self._remember(spec, [(r.cloud, r.index) for r in kept])
        return {"router": router.url, "started": started, "stopped": stopped, "weights": weights}

    def _pods_up(self, router: Router, fed, spec: ServeSpec, pods: dict[str, int], record: dict) -> list[str]:
        """Each Kubernetes cloud's Deployment applied at its count, every pod ready and its Service behind the
        router; the clouds that were not serving before, as router servers."""
        before, started = record.get("kubernetes", {}), []
        serving = dict(before)
        for cloud, count in sorted(pods.items()):
            if count <= 0:
                continue
            serving[cloud] = count
            self.records.update(self.tenant, self.name, spec=spec.__dict__, kubernetes=dict(serving))
            try:
                kube.bring_up(router, fed, spec, fed.cloud(cloud), count)
            except (RouterError, RuntimeError) as e:
                raise FleetError(f"cloud {cloud}: the pods serving {spec.name} did not come up: {e}") from e
            started += [] if cloud in before else [f"{cloud}-0"]
        return started

    def _pods_down(self, router: Router | None, fed, spec: ServeSpec, pods: dict[str, int], record: dict) -> list[str]:
        """Kubernetes clouds that served and no longer should: out of the router, their objects removed. ``record``
        as the change began will do: ``_pods_up`` since added only clouds in ``pods``, which stay."""
        gone = [c for c in record.get("kubernetes", {}) if pods.get(c, 0) <= 0]
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
        record = self._record()
        spec, router, stopped = _spec(record), self.router(record), []
        for r in self.replicas(record):
            if r.handle["backend"] == "kubernetes":
                continue  # below, whether its pods are ready or not
            if router is not None and r.server in router.endpoints:
                take_down(router, r.handle, r.index)
            else:
                stop(r.handle, grace_s=10)
            stopped.append(r.server)
        if spec is not None:
            stopped += self._pods_down(router, load_federation(spec.federation), spec, {}, record)
        if router is not None:
            router.stop()
        if spec is not None:
            self._remember(spec, [])
        return stopped
