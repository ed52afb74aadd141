"""A tenant's served model across clouds, as it runs: its router, its replicas, the last decision and grid cuts.

Why one object: every task that changes serving (the hourly placement, a grid
request, its end, an operator stopping it) must see what the others left, and
they run in different processes. The fleet keeps that in one folder of the
state folder (``serving/<tenant>/<name>/``): the router's folder, the replicas
it started (``fleet.json``), the decision in force (``decision.json``) and the
grid cuts in force (``cuts.json``). Replicas and HAProxy are processes of their
own sessions, so they outlive the task that started them.

Changes never fail a request: new replicas come up and pass the router's own
health check before they get a share; a replica leaves only after the router
stopped sending it requests and its in-flight ones finished; a new model
version is brought up beside the old one before the old one is drained.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from crosscloud.core.federation import load_federation
from crosscloud.core.paths import state_dir
from crosscloud.serving.replica import ServeSpec, bring_up, endpoint_of, find, replica_arg, running, stop, take_down
from crosscloud.serving.router import Endpoint, Router, RouterError


class FleetError(RuntimeError):
    """A serving change that cannot be made; the message says which cloud and why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(replica: Replica) -> dict:
    """The replica's /health body (status, what it served), or ``{"status": "unreachable"}``."""
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

    def __init__(self, tenant: str, name: str, root: Path | None = None):
        self.tenant, self.name = tenant, name
        self.folder = (root or state_dir() / "serving") / tenant / name
        self.router_folder = self.folder / "router"

    def _read(self, file: str, default):
        path = self.folder / file
        return json.loads(path.read_text()) if path.exists() else default

    def _write(self, file: str, value) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{file}.tmp"
        tmp.write_text(json.dumps(value, indent=2))
        tmp.replace(self.folder / file)

    @property
    def spec(self) -> ServeSpec | None:
        raw = self._read("fleet.json", {}).get("spec")
        return ServeSpec(**raw) if raw else None

    @property
    def decision(self) -> dict | None:
        """The decision in force: what the last placement (or grid request) set, with its inputs."""
        return self._read("decision.json", None)

    def save_decision(self, record: dict) -> None:
        self._write("decision.json", record)

    def cuts(self, now: float | None = None) -> dict[str, dict]:
        """Grid cuts in force, by cloud: each ``{reduce_pct, within_s, until}``; ended ones are dropped."""
        now = time.time() if now is None else now
        return {c: cut for c, cut in self._read("cuts.json", {}).items() if cut["until"] > now}

    def set_cut(self, cloud: str, cut: dict | None) -> None:
        cuts = self.cuts()
        cuts.pop(cloud, None) if cut is None else cuts.__setitem__(cloud, cut)
        self._write("cuts.json", cuts)

    def router(self) -> Router | None:
        """The fleet's router if its HAProxy runs."""
        return Router.attach(self.router_folder) if Router.running(self.router_folder) else None

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
        router = Router(self.router_folder, port or free_port(), jurisdictions=jurisdictions)
        router.start()
        self._readmit(router)
        return router

    def restore(self) -> Router:
        """The router again after its HAProxy died (a crash, the host restarted): the same port and residency rule,
        every replica still running behind it once HAProxy's own check passes, and the shares in force."""
        recorded = self._recorded_router()
        if recorded is None:
            raise FleetError(f"{self.tenant}/{self.name} never had a router here: the inference_placement DAG starts one")
        allowed = recorded.get("jurisdictions")
        return self.open_router(None if allowed is None else frozenset(allowed))

    def _recorded_router(self) -> dict | None:
        """What the router this fleet last started recorded (port, residency rule), running or not."""
        path = self.router_folder / "router.json"
        return json.loads(path.read_text()) if path.exists() else None

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
        """Replicas the fleet started whose processes run."""
        spec, out = self.spec, []
        clouds = {c.name: c for c in load_federation(spec.federation).clouds} if spec else {}
        for cloud, index in self._read("fleet.json", {}).get("replicas", []):
            handle = find(spec, clouds[cloud], index) if cloud in clouds else None
            if handle is not None and running(handle):
                out.append(Replica(cloud, index, handle))
        return out

    def _remember(self, spec: ServeSpec, replicas: list[tuple[str, int]]) -> None:
        self._write("fleet.json", {"spec": spec.__dict__, "replicas": sorted(set(map(tuple, replicas)))})

    def _forget_dead(self, router: Router, live: list[Replica]) -> None:
        """Servers the router still lists whose process is gone: out of rotation, so no request tries them."""
        alive = {r.server for r in live}
        for server in [s for s in router.endpoints if s not in alive]:
            router.remove(server, timeout_s=5)

    def apply(self, spec: ServeSpec, shares: dict[str, float], replicas: dict[str, int],
              jurisdictions: frozenset[str] | None = None, port: int = 0, ready_timeout_s: float = 120.0) -> dict:
        """Make the fleet serve ``spec`` with these replicas per cloud and split new requests by ``shares``."""
        router = self.open_router(jurisdictions, port)
        live = self.replicas()
        self._forget_dead(router, live)
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
        wanted = {c: s for c, s in shares.items() if s > 0}
        router.set_weights(wanted)
        extra = [r for cloud, want in replicas.items()
                 for r in sorted((r for r in current if r.cloud == cloud), key=lambda r: r.index)[max(want, 0):]]
        extra += [r for r in current if r.cloud not in replicas]
        for replica in stale + extra:  # the router stops sending them requests; in-flight ones finish there
            take_down(router, replica.handle, replica.index)
        kept = [r for r in current if r not in extra]
        weights = router.set_weights(wanted)
        self._remember(spec, [(r.cloud, r.index) for r in kept])
        return {"router": router.url, "started": started, "stopped": [r.server for r in stale + extra],
                "weights": weights}

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
        router = self.router()
        stopped = []
        for r in self.replicas():
            if router is not None and r.server in router.endpoints:
                take_down(router, r.handle, r.index)
            else:
                stop(r.handle, grace_s=10)
            stopped.append(r.server)
        if router is not None:
            router.stop()
        spec = self.spec
        if spec is not None:
            self._remember(spec, [])
        return stopped
