"""One entry point for clients in front of every cloud's serving replicas: HAProxy, steered at run time.

HAProxy (Debian's ``haproxy``, 2.6 or later) listens on the router address
(``CROSSCLOUD_ROUTER_ADDRESS``, 127.0.0.1 by default) with one
backend holding one server per cloud replica, health-checked on ``/health``;
each request picks a replica by weighted random, so shares follow the weights.
Nothing is ever reloaded: weights, drains and new replicas go through the
runtime API (a TCP stats socket at ``level admin`` on the same address, so a
task on any host of the deployment steers it). A weight change only steers
the next requests, so an in-flight request always finishes on the replica it
started on; ``drain`` takes a cloud out of rotation the same way. A replica is
added with ``add server`` at weight 0 and receives a share only once a health
check of HAProxy's own has passed, so a cloud whose model is not warm and
loaded never gets a request. Connection failures, empty responses and 503s
(a replica's queue full, or a replica stopping) are retried on another server.
A router bound to a tenant's jurisdictions refuses to add a replica outside
them, so its requests cannot reach such a cloud whatever the weights say.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from crosscloud.core.ports import free_port

BACKEND = "serving"
WEIGHT_MAX = 256  # HAProxy's largest server weight
CHECK_PASSED = ("3", "4")  # srv_check_result: CHK_RES_PASSED, CHK_RES_CONDPASS
RUNNING = "2"  # srv_op_state: SRV_ST_RUNNING
MAINT, DRAIN = 0x27, 0x18  # srv_admin_state masks: SRV_ADMF_{F,I,C,R}MAINT and SRV_ADMF_{F,I}DRAIN


class RouterError(RuntimeError):
    """HAProxy missing, not starting, or refusing a runtime command; the message says which and why."""


@dataclass(frozen=True)
class Endpoint:
    """One serving replica as the router knows it: HAProxy server ``<cloud>-<index>`` at host:port."""

    cloud: str
    index: int
    host: str
    port: int
    jurisdiction: str = ""  # the cloud's: a router bound to a tenant's jurisdictions refuses any other

    @property
    def server(self) -> str:
        return f"{self.cloud}-{self.index}"


def router_address() -> str:
    """Where the router listens, for clients and for the runtime API of tasks on other hosts
    (``CROSSCLOUD_ROUTER_ADDRESS``; 127.0.0.1: this host only)."""
    return os.environ.get("CROSSCLOUD_ROUTER_ADDRESS", "127.0.0.1")


def haproxy_config(address: str, port: int, admin_port: int, node: str, check_ms: int = 300) -> str:
    """The whole configuration: a frontend, an empty backend that replicas join at run time, the runtime API."""
    return f"""global
    # the runtime API on TCP: the hourly placement or a grid request changes the router from whichever host
    # runs it; keep this address's port to the deployment's hosts (docs/serving.md#the-fleet-in-shared-state)
    stats socket ipv4@{address}:{admin_port} level admin
    node {node}
    # 400 client connections need about 800 descriptors: within the 1024 a non-root haproxy may be held to
    maxconn 400

defaults
    mode http
    option http-buffer-request
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout queue 60s
    timeout check 2s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503

frontend clients
    bind {address}:{port}
    default_backend {BACKEND}

backend {BACKEND}
    # weighted random, one draw: no per-server position state to go stale when weights change at run time (with
    # roundrobin, HAProxy 2.6 starved a server whose weight went 256 -> 128 while another's went 0 -> 128)
    balance random(1)
    option httpchk GET /health
    http-check expect status 200
    # servers are added through the runtime API (add server), each with: check inter {check_ms} fall 3 rise 1
"""


def haproxy_binary() -> str:
    """The haproxy executable, 2.6 or later (its runtime API adds servers with health checks), or why not."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if not found:
        raise RouterError("haproxy not found: install Debian's haproxy (apt-get install -y haproxy), version 2.6 or later")
    version = subprocess.run([found, "-v"], check=False, capture_output=True, text=True).stdout
    match = re.search(r"version (\d+)\.(\d+)", version)
    if not match or (int(match[1]), int(match[2])) < (2, 6):
        raise RouterError(f"{found} is {version.splitlines()[0] if version else 'of unknown version'}: the router needs "
                          "HAProxy 2.6 or later (Debian 12's haproxy), whose runtime API adds servers with health checks")
    return found


def _ask(admin: tuple[str, int], line: str, timeout_s: float = 5.0) -> str:
    """One command to HAProxy's runtime API at ``admin``; its whole answer."""
    with socket.create_connection(admin, timeout=timeout_s) as s:
        s.sendall(line.encode() + b"\n")
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode()


def _recorded_haproxy(folder: Path) -> int | None:
    """The pid router.json records, if that process still runs haproxy on this folder's configuration."""
    try:
        pid = json.loads((folder / "router.json").read_text())["pid"]
        return pid if str(folder / "haproxy.cfg") in psutil.Process(pid).cmdline() else None
    except (OSError, KeyError, ValueError, psutil.Error):
        return None


def _alive(pid: int, proc: subprocess.Popen | None) -> bool:
    if proc is not None:
        return proc.poll() is None  # our child: reaped here, or it would linger as a zombie
    try:  # exited but not yet reaped by its starter (a zombie) counts as gone
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _passed(row: dict[str, str]) -> bool:
    """A ``show servers state`` row of a server that is up with a health check passed (not merely enabled)."""
    return row.get("srv_op_state") == RUNNING and row.get("srv_check_result") in CHECK_PASSED


def _up(row: dict[str, str], admitted: bool) -> bool:
    """HAProxy's own verdict on a replica that has passed once: one failed check is not down (``fall 3``)."""
    return _passed(row) or (admitted and row.get("srv_op_state") == RUNNING)


class Router:
    """A real HAProxy process and its runtime API: the only way traffic shares change."""

    def __init__(self, folder: Path, port: int, check_ms: int = 300, jurisdictions: frozenset[str] | None = None,
                 address: str | None = None, on_save: Callable[[dict], None] | None = None):
        self.folder, self.port, self.check_ms = Path(folder).resolve(), port, check_ms
        self.jurisdictions = frozenset(jurisdictions) if jurisdictions is not None else None  # None: anywhere
        self.address = address or router_address()
        self.admin_port, self.node, self.pid = 0, "", None
        self.on_save = on_save  # also told every change of what attaching needs (the fleet's shared record)
        self.log = self.folder / "haproxy.log"
        self.proc: subprocess.Popen | None = None
        self.endpoints: dict[str, Endpoint] = {}
        self.admitted: set[str] = set()  # replicas whose health check has passed since they were added

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @staticmethod
    def reachable(info: dict) -> bool:
        """Whether the router a record describes answers on its runtime API, and is that router (its node name),
        not another process that took the port since."""
        try:
            answer = _ask((info["address"], info["admin_port"]), "show info", timeout_s=2)
        except (OSError, KeyError):
            return False
        return f"node: {info.get('node')}\n" in answer

    @staticmethod
    def running(folder: Path) -> bool:
        """Whether the router whose record is in ``folder`` (router.json) still answers."""
        path = Path(folder) / "router.json"
        return path.exists() and Router.reachable(json.loads(path.read_text()))

    @classmethod
    def attach(cls, source: Path | dict, on_save: Callable[[dict], None] | None = None) -> Router:
        """The router another task started, from its record (or the folder holding router.json), on this host or
        another: its replicas read from HAProxy itself."""
        info = json.loads((Path(source) / "router.json").read_text()) if isinstance(source, (str, Path)) else source
        allowed = info.get("jurisdictions")
        router = cls(Path(info["folder"]), info["port"], info["check_ms"],
                     None if allowed is None else frozenset(allowed), info["address"], on_save)
        router.admin_port, router.node, router.pid = info["admin_port"], info["node"], info.get("pid")
        places = info.get("places", {})
        for name, row in router.servers().items():
            cloud, _, index = name.rpartition("-")
            router.endpoints[name] = Endpoint(cloud, int(index), row["srv_addr"], int(row["srv_port"]), places.get(name, ""))
        return router

    def info(self) -> dict:
        """What another task, on any host, needs to attach: addresses, check interval, jurisdictions, replicas'."""
        return {"port": self.port, "check_ms": self.check_ms, "url": self.url, "address": self.address,
                "admin_port": self.admin_port, "node": self.node, "pid": self.pid, "folder": str(self.folder),
                "jurisdictions": None if self.jurisdictions is None else sorted(self.jurisdictions),
                "places": {name: ep.jurisdiction for name, ep in self.endpoints.items()}}

    def _save(self) -> None:
        info = self.info()
        if self.proc is not None or _recorded_haproxy(self.folder) == self.pid:  # this host's router: its folder
            (self.folder / "router.json").write_text(json.dumps(info))
        if self.on_save is not None:
            self.on_save(info)

    def start(self, timeout_s: float = 10.0) -> None:
        """Write the configuration, check it, start haproxy in the foreground and wait for its runtime API."""
        binary = haproxy_binary()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.admin_port, self.node = free_port(self.address), f"crosscloud-{os.urandom(6).hex()}"
        config = self.folder / "haproxy.cfg"
        config.write_text(haproxy_config(self.address, self.port, self.admin_port, self.node, self.check_ms))
        checked = subprocess.run([binary, "-c", "-q", "-f", str(config)], check=False, capture_output=True, text=True)
        if checked.returncode:
            raise RouterError(f"haproxy refused {config}: {checked.stderr.strip() or checked.stdout.strip()}")
        with open(self.log, "ab") as log:  # its own session: it outlives the task that started it, like a sub-task
            self.proc = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RouterError(f"haproxy exited with {self.proc.returncode}: {self.log.read_text()[-800:]}")
            try:
                self.command("show info")
                self._save()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RouterError(f"haproxy's runtime API {self.address}:{self.admin_port} did not answer within {timeout_s:.0f} s")

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop haproxy softly (SIGUSR1: no new connections, in-flight requests finish), then for good after ``grace_s``.

        Only on the host that runs it: an attached router stops the process its
        starter recorded there, if that is still this folder's haproxy.
        """
        pid = self.proc.pid if self.proc else _recorded_haproxy(self.folder)
        if pid is None and self.reachable(self.info()):
            raise RouterError(f"the router at {self.url} runs on another host (its folder {self.folder} there): "
                              "stop it on that host (crosscloud serve stop)")
        for sig, wait in ((signal.SIGUSR1, grace_s), (signal.SIGKILL, 5.0)):
            if pid is None or not _alive(pid, self.proc):
                return
            os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while _alive(pid, self.proc) and time.monotonic() < deadline:
                time.sleep(0.05)

    def command(self, line: str) -> str:
        """One runtime API command; its answer as text (the connection closes after each answer)."""
        return _ask((self.address, self.admin_port), line)

    def _expect(self, line: str, bad: tuple[str, ...] = ("No such", "Require", "Unknown", "not ", "failed", "error")) -> str:
        answer = self.command(line).strip()
        if any(word.lower() in answer.lower() for word in bad):
            raise RouterError(f"haproxy refused {line!r}: {answer}")
        return answer

    def admits(self, endpoint: Endpoint) -> None:
        """Refuse a replica outside the jurisdictions this router's requests may go to."""
        if self.jurisdictions is not None and endpoint.jurisdiction not in self.jurisdictions:
            raise RouterError(f"cloud {endpoint.cloud} is in {endpoint.jurisdiction or 'no declared jurisdiction'}; this "
                              f"router serves requests that may go only to {sorted(self.jurisdictions)}: not added")

    def add(self, endpoint: Endpoint) -> None:
        """Put a replica behind the router at weight 0; it takes traffic once healthy and given a share."""
        self.admits(endpoint)
        name = f"{BACKEND}/{endpoint.server}"
        self._expect(f"add server {name} {endpoint.host}:{endpoint.port} weight 0 "
                     f"check inter {self.check_ms} fall 3 rise 1", bad=("No such", "Require", "Unknown", "error"))
        self._expect(f"enable health {name}")
        self._expect(f"enable server {name}")
        self.endpoints[endpoint.server] = endpoint
        self._save()

    def remove(self, server: str, timeout_s: float = 60.0) -> None:
        """Take a replica out for good: no new requests, wait until its in-flight ones finished, delete it."""
        name = f"{BACKEND}/{server}"
        self._expect(f"set server {name} state drain")
        deadline = time.monotonic() + timeout_s
        while self.stats().get(server, {}).get("scur", "0") not in ("0", "") and time.monotonic() < deadline:
            time.sleep(0.05)
        self._expect(f"set server {name} state maint")
        self._expect(f"del server {name}")
        self.endpoints.pop(server, None)
        self.admitted.discard(server)
        self._save()

    def servers(self) -> dict[str, dict[str, str]]:
        """``show servers state`` of the backend, by server name: op and admin state, weight, check result."""
        lines = self.command(f"show servers state {BACKEND}").splitlines()
        header = next((line[2:].split() for line in lines if line.startswith("# be_id")), None)
        if header is None:
            return {}
        rows = [dict(zip(header, line.split())) for line in lines if len(line.split()) == len(header)]  # not the version
        return {row["srv_name"]: row for row in rows}

    def stats(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the backend's servers, by name: sessions now (scur) and in all (stot), status, weight."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",") if lines else []
        rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line.startswith(f"{BACKEND},")]
        return {row["svname"]: row for row in rows if row["svname"] not in ("BACKEND", "FRONTEND")}

    def status(self) -> dict[str, dict]:
        """Per replica: its cloud, weight, admin state, health, requests in flight and answered: what an operator sees."""
        states, stats = self.servers(), self.stats()
        self._admit(states)
        out = {}
        for name, ep in self.endpoints.items():
            row, stat = states.get(name, {}), stats.get(name, {})
            admin = int(row.get("srv_admin_state", "0") or 0)
            out[name] = {"cloud": ep.cloud, "address": f"{ep.host}:{ep.port}", "weight": int(row.get("srv_uweight", 0)),
                         "state": "maint" if admin & MAINT else ("drain" if admin & DRAIN else "ready"),
                         "healthy": _up(row, name in self.admitted),
                         "in_flight": int(stat.get("scur") or 0), "requests": int(stat.get("stot") or 0),
                         "errors_5xx": int(stat.get("hrsp_5xx") or 0)}
        return out

    def healthy(self, server: str) -> bool:
        """Whether HAProxy's own health check of the replica has passed (not merely that it was enabled)."""
        return _passed(self.servers().get(server, {}))

    def wait_healthy(self, server: str, timeout_s: float = 30.0) -> None:
        """Block until HAProxy's own check of the replica passed: from then on set_weights may give it a share."""
        deadline = time.monotonic() + timeout_s
        while not self.healthy(server):
            if time.monotonic() > deadline:
                raise RouterError(f"replica {server} did not pass haproxy's health check within {timeout_s:.0f} s")
            time.sleep(0.05)
        self.admitted.add(server)

    def set_weights(self, shares: dict[str, float]) -> dict[str, int]:
        """Give each cloud its share of new requests, split over its healthy replicas; returns the server weights.

        A cloud left out, or whose replicas have never passed a health check,
        gets weight 0. A replica that passed once keeps its share while a check
        fails: HAProxy itself sends nothing to a server it marked down, and gives
        it back its weight when it is up again. Shares are relative (any positive
        scale); a positive share never rounds down to 0. The largest share gets
        weight 256: HAProxy's weighted random gives a server one point on its ring
        per unit of weight, so larger weights split closer to the shares.
        """
        self._admit(self.servers())
        by_cloud: dict[str, list[str]] = {}
        for name, ep in self.endpoints.items():
            if name not in self.admitted:
                continue
            by_cloud.setdefault(ep.cloud, []).append(name)
        per_replica = {c: max(0.0, shares.get(c, 0.0)) / len(names) for c, names in by_cloud.items()}
        top = max(per_replica.values(), default=0.0)
        weights = {name: 0 for name in self.endpoints}
        for cloud, names in by_cloud.items():
            if per_replica[cloud] > 0:  # the busiest replica at 256: weighted random's ring has the most points
                for name in names:
                    weights[name] = max(1, round(WEIGHT_MAX * per_replica[cloud] / top))
        for name, weight in weights.items():
            self._expect(f"set weight {BACKEND}/{name} {weight}")
        return weights

    def _admit(self, states: dict[str, dict[str, str]]) -> None:
        """Note the replicas that have passed a check, seen now or by the weight given to them (only ever after a pass)."""
        for name in self.endpoints:
            row = states.get(name, {})
            if _passed(row) or int(row.get("srv_uweight", 0)) > 0:
                self.admitted.add(name)

    def _set_state(self, cloud: str, state: str) -> list[str]:
        names = [name for name, ep in self.endpoints.items() if ep.cloud == cloud]
        for name in names:
            self._expect(f"set server {BACKEND}/{name} state {state}")
        return names

    def drain(self, cloud: str) -> list[str]:
        """A grid request: no new requests to the cloud's replicas, in-flight ones finish there; weights are kept."""
        return self._set_state(cloud, "drain")

    def restore(self, cloud: str) -> list[str]:
        """The grid request ended: the cloud's replicas take their weights' share again."""
        return self._set_state(cloud, "ready")
