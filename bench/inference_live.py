"""The live figures of ``make bench-inference``: real requests through the real router to real serving processes.

A time-compressed slice of the replay (``--live-hours`` replay hours around the
grid request, ``--live-seconds-per-hour`` seconds each) is served on 127.0.0.1
by three local clouds named after replay clouds: the grid request's cloud and
the two others crosscloud loads most in the slice. Each has a file store in a
temporary folder (its own state folder and federation file). The model is a
byte_lm model: the final weights of the tenant's newest run in the state
folder if it trained one with the byte_lm program, else a freshly built tiny
one (random weights; the output says which). It is stored in the first
cloud's store and preheated to the second; the third is preheated and brought
up in the slice's hour 1 ("a cloud added after preheat"; for the second policy
it is already warm and up, and gets no share before hour 1).

Each policy (price-unaware, crosscloud) replays the same slice: requests at
``--live-rps`` (``max_tokens`` ``--live-max-tokens``) from a thread pool, and
at each hour's start the router's weights are that policy's shares of the
three live clouds, renormalised, and each cloud's replicas are that policy's:
crosscloud's are the replicas its plans ran each hour (sized ahead of a
rising forecast, as ``inference_placement`` sizes them), scaled so the
slice's largest count is ``--live-max-replicas`` (this machine's room) and
at least one; they are added (started, ready, past HAProxy's check, then given
the hour's share) and removed (out of the router once their requests
finished, then stopped) in the background while the hour's weights change on
time. The price-unaware baseline plans no replicas and runs the most
everywhere (the most capacity: its p99 is not hurt by fewer). At the grid request's hour those shares are
the shed: the policy solved that hour with the cut as a bound, so the grid
cloud keeps the traffic whose modelled draw is the asked share below its draw
without the request, not none. When the request ends, the next hour's shares
bring the traffic back.

Figures: ``failed_requests`` = answers not 200 or not received, both policies;
latency = client-side seconds per request; ``bytes_moved`` = bytes preheating
sent to warm clouds; ``time_to_shed_s`` = seconds from the weight change until
the last request the grid cloud had started before it was answered (in-flight
requests finish where they started); ``shed_pct`` = the fall of the grid
cloud's draw (crosscloud's run): the power model at the share of the live
requests the cloud actually answered once the shed held (x the hour's tokens/s
of the live clouds, the plan's replicas), against its modelled draw that hour
without the request.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import yaml
from crosscloud.artifacts.preheat import TransferReport, fetch
from crosscloud.core.federation import DEFAULT_FEDERATION, load_federation
from crosscloud.core.keys import RunKeys
from crosscloud.core.paths import state_dir
from crosscloud.core.ports import free_port
from crosscloud.run.plan import Plan
from crosscloud.serving.replica import ServeSpec, bring_up, replica_arg, start, stop, wait_ready
from crosscloud.serving.router import Endpoint, Router, router_address
from crosscloud.serving.server import CLOUD_HEADER
from crosscloud.serving.traffic import power_w
from crosscloud.store.chunks import put_blob
from crosscloud.store.commit import read_step
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import to_bytes
from crosscloud.training.program import load_program, program_source
from crosscloud.training.session import parameters

TENANT = "team-a"
PROGRAM = "examples/byte_lm/train.py"
TINY = {"seed": 26, "model_size": "tiny"}


def add_arguments(p) -> None:
    """The live part's command-line arguments."""
    p.add_argument("--no-live", action="store_true", help="skip the live part: the live figures are modelled")
    p.add_argument("--live-hours", type=int, default=6, help="replay hours served live")
    p.add_argument("--live-seconds-per-hour", type=float, default=5.0)
    p.add_argument("--live-rps", type=float, default=20.0, help="requests per second sent through the router")
    p.add_argument("--live-max-tokens", type=int, default=8)
    p.add_argument("--live-max-replicas", type=int, default=2,
                   help="replicas of the busiest live cloud: the plans' replica counts are scaled to this")
    p.add_argument("--no-live-ssh", action="store_true",
                   help="serve every live cloud locally, none through a replica started over SSH")
    p.add_argument("--no-live-distance", action="store_true",
                   help="live requests reach every replica at once, not through its cloud's round trip from the users")


def newest_trained_model() -> tuple[bytes, dict, str] | None:
    """The final weights, program args and run id of the tenant's newest byte_lm run in the state folder, if any."""
    runs = sorted((state_dir() / "clouds").glob(f"*/{TENANT}/runs/*/final/COMMIT.json"), key=lambda p: p.stat().st_mtime)
    for commit in reversed(runs):
        run_id, cloud_root = commit.parent.parent.name, commit.parents[4]
        try:
            store = open_store(load_federation().cloud(cloud_root.name), TENANT)
            plan = Plan.load(store, TENANT, run_id)
            if plan.program is None or plan.program.family != "byte-lm":
                continue
            step = read_step(store, RunKeys(TENANT, run_id).final)
            if step and "model.safetensors" in step[1]:
                return step[1]["model.safetensors"], plan.spec.program_run_args(), run_id
        except Exception as exc:  # noqa: BLE001 - an unreadable run falls back to an older one, or a fresh model
            print(f"live part: run {run_id} not served: {type(exc).__name__}: {exc}", file=sys.stderr)
    return None


def model_weights() -> tuple[bytes, dict, str]:
    """The weights to serve, the program args that build their model, and where they came from."""
    found = newest_trained_model()
    if found:
        weights, args, run_id = found
        return weights, args, f"final weights of run {run_id}"
    module = load_program(program_source(PROGRAM), PROGRAM)
    weights = to_bytes({n: p.detach() for n, p in parameters(module.build_model(TINY)).items()})
    return weights, TINY, "a freshly built tiny byte_lm (random weights: no trained byte_lm run in the state folder)"


def ssh_host(folder: Path):
    """A throwaway sshd on 127.0.0.1 (the tests' ``SSHServer``, key authentication as this user) standing for a
    bare-metal cloud's host; (None, why) where it cannot start (no openssh-server here)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import pytest
    from sshserver import SSHServer

    server = SSHServer(folder / "sshd")
    try:
        server.start()
    except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:  # how the tests' helper says why
        return None, f"{type(exc).__name__}: {exc}"
    return server, ""


def ssh_access(server, folder: Path) -> tuple[dict, dict]:
    """The access section of a cloud reached over SSH through ``server``, and the key settings it needs."""
    access = {"method": "ssh", "host": "127.0.0.1", "port": server.port, "user": server.user,
              "workdir": str(folder / "host"), "python": sys.executable,
              "env": {"CROSSCLOUD_STATE_DIR": str(folder), "OMP_NUM_THREADS": "1"}}
    return access, {"KEY_FILE": str(server.key_file), "KNOWN_HOSTS": str(server.known_hosts)}


def write_federation(folder: Path, clouds: list, access: dict | None = None) -> Path:
    """A federation of three clouds named and placed as the replay's, each with a file store in ``folder``: local
    ones, but for the clouds ``access`` reaches otherwise (over SSH)."""
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    template = raw["clouds"][0]
    raw["clouds"] = [{**template, "name": c.name, "role": "local" if i == 0 else "collaboration",
                      "jurisdiction": c.jurisdiction, "store": {"url": f"file://{folder / 'clouds' / c.name}"},
                      **({"access": access[c.name]} if c.name in (access or {}) else {})}
                     for i, c in enumerate(clouds)]
    raw["jurisdictions"] = {c.jurisdiction: {"exports": ["checkpoints", "pseudo_gradients", "data"]} for c in clouds}
    raw["links"] = [{"a": a.name, "b": b.name, "bandwidth_mbps": 1000, "latency_ms": 10}
                    for i, a in enumerate(clouds) for b in clouds[i + 1:]]
    raw["tenants"] = [{"name": TENANT, "quotas": {c.name: 4 for c in clouds}}]
    raw["datasets"] = [{**raw["datasets"][0], "home": clouds[0].name}]
    path = folder / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


class DelayLink:
    """An emulated network path to one replica: a TCP forwarder on 127.0.0.1 that delivers every chunk, each way,
    ``one_way_s`` after it arrived (a constant delay, as netem adds; throughput is not limited). The router reaches
    the cloud's replica through it, so a live request pays the cloud's round trip from the users."""

    def __init__(self, host: str, port: int, rtt_ms: float):
        self.target, self.one_way_s = (host, port), rtt_ms / 2000.0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _connection(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)

    async def _pump(self, reader, writer) -> None:
        """Copy one direction, each chunk written ``one_way_s`` after it was read, in order."""
        chunks: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while (item := await chunks.get()) is not None:
                await asyncio.sleep(max(0.0, item[0] + self.one_way_s - self.loop.time()))
                writer.write(item[1])
                await writer.drain()
            writer.close()

        sender = self.loop.create_task(deliver())
        try:
            while data := await reader.read(65536):
                chunks.put_nowait((self.loop.time(), data))
        except ConnectionError:  # the far end went away (a replica stopped, HAProxy closed a check): the path ends
            pass
        finally:
            chunks.put_nowait(None)
            await asyncio.gather(sender, return_exceptions=True)

    def close(self) -> None:
        """Stop listening, end every open path (their tasks finish, none left pending), then the loop."""
        async def shutdown() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@dataclass
class Live:
    """The live clouds, their stores, the router and the replicas: everything ``stop`` ends."""

    folder: Path
    names: list[str]
    spec: ServeSpec
    stores: dict
    router: Router
    handles: dict = field(default_factory=dict)  # (cloud, index) -> the replica's handle
    report: TransferReport = field(default_factory=TransferReport)
    ref: object = None
    weights: dict = field(default_factory=dict)  # the hour's weights: a replica brought up mid-hour gets them
    added_s: float = float("nan")  # seconds from the start of preheating the added cloud until it had its share
    rtt_ms: dict = field(default_factory=dict)  # per cloud, the emulated round trip from the users (none: 0)
    links: dict = field(default_factory=dict)  # (cloud, index) -> its DelayLink
    started: list = field(default_factory=list)  # the handle of every replica started, local and remote
    changes: list = field(default_factory=list)  # (policy, "added" | "removed", server), in order
    policy: str = ""
    no_ssh: str = ""  # why no cloud was reached over SSH, if none was

    def preheat(self, cloud: str) -> None:
        fetch(self.stores[cloud], [self.stores[self.names[0]]], TENANT, self.ref, self.report)

    def count(self, cloud: str) -> int:
        return sum(c == cloud for c, _ in self.handles)

    def up(self, cloud: str, index: int = 0) -> None:
        """Preheat, start replica ``index``, and put it behind the router through its cloud's emulated link (if any)."""
        if (cloud, index) in self.handles:
            return
        self.preheat(cloud)
        if not self.rtt_ms.get(cloud):
            handle = self.handles[(cloud, index)] = bring_up(self.router, self.spec, cloud, index)
            self.started.append(handle)
            return
        handle = self.handles[(cloud, index)] = start(self.spec, load_federation(self.spec.federation).cloud(cloud), index)
        self.started.append(handle)
        wait_ready(handle, 90)
        link = self.links[(cloud, index)] = DelayLink(replica_arg(handle, "--host"), int(replica_arg(handle, "--port")),
                                                      self.rtt_ms[cloud])
        self.router.add(Endpoint(cloud, index, "127.0.0.1", link.port))
        self.router.wait_healthy(f"{cloud}-{index}", 90)

    def down(self, cloud: str, index: int) -> None:
        """Out of the router once its in-flight requests finished, then stopped: no request fails."""
        self.router.remove(f"{cloud}-{index}")
        stop(self.handles.pop((cloud, index)), grace_s=5)
        if (link := self.links.pop((cloud, index), None)) is not None:
            link.close()

    def scale(self, target: dict[str, int | None]) -> None:
        """Each cloud to its target replica count (None: as it is), new ones given the hour's share once healthy."""
        for cloud, want in target.items():
            if want is None:
                continue
            while self.count(cloud) < want:
                index = next(i for i in range(want + 1) if (cloud, i) not in self.handles)
                add_cloud(self, cloud, index) if self.count(cloud) == 0 else self.up(cloud, index)
                self.router.set_weights(self.weights)
                self.changes.append((self.policy, "added", f"{cloud}-{index}"))
            while self.count(cloud) > want:
                index = max(i for c, i in self.handles if c == cloud)
                self.down(cloud, index)
                self.changes.append((self.policy, "removed", f"{cloud}-{index}"))

    def stop(self) -> None:
        for handle in self.handles.values():
            stop(handle, grace_s=5)
        self.router.stop(grace_s=5)
        for link in self.links.values():
            link.close()


class Scaler:
    """Applies the latest replica targets in the background, so an hour's weights change on time while replicas
    start (each takes seconds); a target set while one is being applied is applied after it."""

    def __init__(self, live: Live):
        self.live, self.target, self.busy = live, None, threading.Lock()
        self.wake, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def want(self, target: dict[str, int | None]) -> None:
        self.target = dict(target)
        self.wake.set()

    def _run(self) -> None:
        while not self.done.is_set():
            self.wake.wait(0.2)
            if not self.wake.is_set():
                continue
            self.wake.clear()
            with self.busy:
                self.live.scale(self.target)

    def settle(self, timeout_s: float = 180.0) -> None:
        """Wait until the latest target is applied."""
        deadline = time.monotonic() + timeout_s
        while (self.wake.is_set() or self.busy.locked()) and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        self.settle()
        self.done.set()
        self.thread.join(timeout=10)


def set_up(folder: Path, clouds: list, distance: bool = True, access: dict | None = None) -> tuple[Live, str]:
    """Stores, the model in the first cloud's, preheated to the second, a router, replicas on the two warm clouds;
    with ``distance``, each cloud reached through its round trip from the users (``rtt_ms``); ``access``: the
    clouds reached otherwise than locally (over SSH)."""
    fed_path = write_federation(folder, clouds, access)
    fed = load_federation(fed_path)
    weights, args, source = model_weights()
    stores = {c.name: open_store(fed.cloud(c.name), TENANT) for c in clouds}
    names = [c.name for c in clouds]
    ref, _ = put_blob(stores[names[0]], TENANT, weights, kind="model")
    spec = ServeSpec(tenant=TENANT, name="bench-live", model=ref.text, program=PROGRAM, args=args,
                     federation=str(fed_path))
    router = Router(folder / "router", free_port(router_address()), check_ms=200)
    live = Live(folder, names, spec, stores, router, ref=ref,
                rtt_ms={c.name: c.rtt_ms for c in clouds} if distance else {})
    return live, source


@dataclass
class Load:
    """Requests at a fixed rate through the router from a thread pool; each answer recorded."""

    url: str
    rps: float
    max_tokens: int
    records: list = field(default_factory=list)  # (policy, start, end, cloud, ok)
    policy: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)

    def one(self, client: httpx.Client, policy: str) -> None:
        start, cloud, ok = time.monotonic(), "", False
        try:
            r = client.post(f"{self.url}/v1/completions", json={"prompt": "def ", "max_tokens": self.max_tokens,
                                                               "temperature": 0})
            cloud, ok = r.headers.get(CLOUD_HEADER, ""), r.status_code == 200
        except httpx.HTTPError:
            pass
        self.records.append((policy, start, time.monotonic(), cloud, ok))

    def run(self) -> None:
        with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=64)) as client, \
                ThreadPoolExecutor(max_workers=32) as pool:
            t0, i = time.monotonic(), 0
            while not self._stop.is_set():
                i += 1
                time.sleep(max(0.0, t0 + i / self.rps - time.monotonic()))
                pool.submit(self.one, client, self.policy)

    def stop(self) -> None:
        self._stop.set()

    def share(self, policy: str, cloud: str, t0: float, t1: float) -> float:
        mine = [r for r in self.records if r[0] == policy and t0 <= r[1] < t1 and r[4]]
        return sum(r[3] == cloud for r in mine) / max(len(mine), 1)


def live_shares(run, hours: list[int], idx: list[int]) -> np.ndarray:
    """The policy's shares of the live clouds each hour, renormalised to 1."""
    s = run.shares[np.ix_(hours, idx)]
    return s / np.maximum(s.sum(axis=1, keepdims=True), 1e-12)


def add_cloud(live: Live, cloud: str, index: int = 0) -> None:
    """Preheat ``cloud``, bring its first replica up, and give it the hour's share."""
    t = time.monotonic()
    live.up(cloud, index)
    live.router.set_weights(live.weights)
    if cloud == live.names[2] and np.isnan(live.added_s):
        live.added_s = time.monotonic() - t


def live_replicas(run, hours: list[int], names: list[str], most: int) -> list[dict[str, int]]:
    """Each slice hour's live replicas per live cloud: the policy's replicas as it placed them (sized ahead for a
    rising forecast, ``traffic.sized_ahead``), scaled so the slice's largest count is ``most`` (this machine's room),
    and at least one; a policy that plans no replicas runs ``most`` everywhere (the most capacity: conservative)."""
    if not run.replicas:
        return [dict.fromkeys(names, most) for _ in hours]
    counts = [[run.replicas[h].get(c, 0) for c in names] for h in hours]
    top = max(max(row) for row in counts) or 1
    return [{c: max(1, math.ceil(most * n / top)) for c, n in zip(names, row)} for row in counts]


def replay_policy(live: Live, load: Load, run, hours: list[int], idx: list[int], grid: tuple[int, int] | None,
                  seconds: float, scaler: Scaler, most: int) -> dict:
    """One policy over the slice: weights and replica targets each hour, the third cloud from hour 1; at the grid
    request's hour the policy's own shares (the cut as a bound) are the shed, and when it ends its shares bring the
    traffic back."""
    shares, third = live_shares(run, hours, idx), live.names[2]
    targets = live_replicas(run, hours, live.names, most)
    load.policy = live.policy = run.name
    out, starts = {"replicas": targets}, []
    for k in range(len(hours)):
        starts.append(time.monotonic())
        weights = dict(zip(live.names, shares[k]))
        if k == 0:
            weights[third] = 0.0
        live.weights = weights
        live.router.set_weights(weights)
        scaler.want({**targets[k], **({third: None} if k == 0 else {})})  # the third: brought up from hour 1
        if grid and k == grid[0]:
            out["grid"] = {"changed_at": starts[k], "hour": k}
        if grid and k == grid[0] + grid[1]:
            out["restore_at"] = starts[k]
        time.sleep(max(0.0, starts[k] + seconds - time.monotonic()))
    scaler.settle()
    out["end"] = time.monotonic()
    return out


def choose(sc, runs: dict, cut, n_hours: int) -> tuple[list[int], list[int], tuple[int, int] | None]:
    """The slice's replay hours, the live clouds (grid cloud first) and the grid request's (slice hour, hours)."""
    g = cut.start_h if cut else sc.replay.hours // 2
    first = max(0, min(g - n_hours // 2, sc.replay.hours - n_hours))
    hours = list(range(first, first + n_hours))
    names = [c.name for c in sc.clouds]
    lead = names.index(cut.cut.cloud) if cut else int(np.argmax(runs["crosscloud"].shares[hours].sum(axis=0)))
    load = runs["crosscloud"].shares[hours].sum(axis=0)
    others = [i for i in np.argsort(-load) if i != lead][:2]
    return hours, [lead, *map(int, others)], ((g - first, cut.hours) if cut else None)


def held_after(load: Load, policy: str, cloud: str, changed_at: float) -> float:
    """Seconds from the weight change until the last request the cloud had started before it was answered."""
    ends = [r[2] for r in load.records if r[0] == policy and r[3] == cloud and r[1] < changed_at]
    return max(0.0, max(ends, default=changed_at) - changed_at)


def figures(load: Load, events: dict, cloud: str) -> dict:
    """Failed requests, latency per policy, and the grid cloud's share of requests around the request."""
    out = {"failed_requests": sum(not r[4] for r in load.records),
           "answered": {c: sum(r[3] == c for r in load.records) for c in sorted({r[3] for r in load.records if r[3]})}}
    for policy, ev in events.items():
        lat = np.array([r[2] - r[1] for r in load.records if r[0] == policy and r[4]]) * 1000
        out[policy] = {"requests": sum(r[0] == policy for r in load.records),
                       "p50_ms": float(np.quantile(lat, 0.5)) if len(lat) else float("nan"),
                       "p99_ms": float(np.quantile(lat, 0.99)) if len(lat) else float("nan")}
        if "grid" in ev:
            g = ev["grid"]
            hold = held_after(load, policy, cloud, g["changed_at"])
            out[policy].update(time_to_shed_s=hold, hour=g["hour"],
                               during=load.share(policy, cloud, g["changed_at"] + hold, ev.get("restore_at", ev["end"])))
    return out


def measured_shed(sc, run, hour: int, idx: list[int], during: float) -> dict:
    """The grid cloud's draw at the share of requests it actually answered, against its draw this hour without the
    request: the policy's plan gives the hour's tokens/s of the live clouds and the replicas; the power model, watts."""
    plan = run.plans[hour]
    (shed,) = [s for s in plan.sheds if s.cloud == sc.clouds[idx[0]].name]
    live_tps = sum(plan.tokens_per_s[sc.clouds[i].name] for i in idx)
    offer = next(o for o in sc.offers(hour, sc.seen(hour)) if o.name == shed.cloud)
    after_w = power_w(offer, shed.replicas_after, during * live_tps)
    return {"shed_pct": 100 * (1 - after_w / shed.before_w), "before_w": shed.before_w, "after_w": after_w,
            "modelled_pct": shed.achieved_pct, "asked_pct": shed.reduce_pct,
            "planned_share": plan.tokens_per_s[shed.cloud] / max(live_tps, 1e-12)}


def serve_slice(live: Live, sc, runs: dict, plan, args) -> dict:
    """Both policies over the slice under one steady load; the figures."""
    hours, idx, grid = plan
    live.router.start()
    first = live_replicas(runs["price-unaware"], hours, live.names, args.live_max_replicas)[0]
    live.scale({c: first[c] for c in live.names[:2]})  # up before the load starts
    load = Load(live.router.url, args.live_rps, args.live_max_tokens)
    sender = threading.Thread(target=load.run, daemon=True)
    sender.start()
    scaler = Scaler(live)
    try:
        events = {name: replay_policy(live, load, runs[name], hours, idx, grid, args.live_seconds_per_hour, scaler,
                                      args.live_max_replicas)
                  for name in ("price-unaware", "crosscloud")}
    finally:
        load.stop()
        sender.join(timeout=60)
        scaler.close()
        time.sleep(1.0)
    out = figures(load, events, live.names[0])
    for name, ev in events.items():
        out[name]["replicas"] = ev["replicas"]
        out[name]["added"] = sum(p == name and kind == "added" for p, kind, _ in live.changes)
        out[name]["removed"] = sum(p == name and kind == "removed" for p, kind, _ in live.changes)
    return out


def live_figures(sc, runs: dict, cut, args) -> dict:
    """The live figures (module docstring), in ``last_line``'s keys plus the details; every process stopped after."""
    plan = choose(sc, runs, cut, args.live_hours)
    clouds = [sc.clouds[i] for i in plan[1]]
    remote = clouds[1].name  # the second warm cloud is a bare-metal host reached over SSH
    prefix = "CROSSCLOUD_" + "".join(ch if ch.isalnum() else "_" for ch in remote).upper() + "_SSH_"
    saved = {k: os.environ.get(k) for k in ("CROSSCLOUD_STATE_DIR", "CROSSCLOUD_FEDERATION", prefix + "KEY_FILE",
                                            prefix + "KNOWN_HOSTS")}
    with tempfile.TemporaryDirectory(prefix="crosscloud-live-") as tmp:
        folder, live, sshd, why = Path(tmp), None, None, "--no-live-ssh"
        try:
            if not args.no_live_ssh:
                sshd, why = ssh_host(folder)
            access, keys = ssh_access(sshd, folder) if sshd else (None, {})
            os.environ.update({prefix + k: v for k, v in keys.items()})
            live, source = set_up(folder, clouds, not args.no_live_distance, {remote: access} if access else None)
            live.no_ssh = why
            os.environ.update(CROSSCLOUD_STATE_DIR=str(folder), CROSSCLOUD_FEDERATION=live.spec.federation)
            out = serve_slice(live, sc, runs, plan, args)
        finally:
            if live is not None:
                live.stop()
            if sshd is not None:
                sshd.stop()
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    base, mine = out["price-unaware"], out["crosscloud"]
    if "hour" in mine:
        mine.update(measured_shed(sc, runs["crosscloud"], plan[0][mine["hour"]], plan[1], mine["during"]))
    return {"failed_requests": out["failed_requests"], "time_to_shed_s": mine.get("time_to_shed_s", 0.0),
            "shed_pct": mine.get("shed_pct", 0.0), "p99_latency_ratio": mine["p99_ms"] / base["p99_ms"],
            "bytes_moved": sum(live.report.sent_bytes.values()), "details": out, "model": source,
            "remote_replicas": sum(h["backend"] == "ssh" for h in live.started),
            "clouds": live.names, "hours": plan[0], "source": describe(out, live, source, plan)}


def describe(out: dict, live: Live, source: str, plan) -> str:
    hours, _, grid = plan
    pol = "; ".join(f"{p} {out[p]['requests']} requests p50 {out[p]['p50_ms']:.0f} ms p99 {out[p]['p99_ms']:.0f} ms, "
                    f"replicas added {out[p]['added']} removed {out[p]['removed']}"
                    for p in ("price-unaware", "crosscloud"))
    pol += ("; crosscloud's live replicas per hour (its plans' counts, sized ahead, scaled to this machine): "
            + " | ".join(",".join(str(t[c]) for c in live.names) for t in out["crosscloud"]["replicas"]))
    mine = out["crosscloud"]
    cut = (f"; grid request -{mine['asked_pct']:g}% on {live.names[0]}: share of the live requests planned "
           f"{mine['planned_share']:.3f}, answered {mine['during']:.3f} once the requests in flight finished "
           f"({mine['time_to_shed_s']:.2f} s), draw {mine['before_w'] / 1000:.2f} -> {mine['after_w'] / 1000:.2f} kW "
           f"(modelled {mine['modelled_pct']:.1f}%, measured split {mine['shed_pct']:.1f}%)") if "shed_pct" in mine else ""
    remote = [h["cloud"] for h in live.started if h["backend"] == "ssh"]
    ssh = (f", {len(remote)} replica(s) started over SSH on {sorted(set(remote))}" if remote
           else f", no replica over SSH ({live.no_ssh or 'none started'})")
    rtt = ssh + (", each through its round trip from the users (" + ", ".join(f"{c} {live.rtt_ms[c]:g} ms" for c in live.names)
           + ")" if live.rtt_ms else ", no network distance")
    return (f"LIVE on 127.0.0.1{rtt}: replay hours {hours[0]}..{hours[-1]} on {', '.join(live.names)} (grid request on "
            f"{live.names[0]} at slice hour {grid[0] if grid else '-'}, {live.names[2]} preheated and added at hour 1 in "
            f"{live.added_s:.1f} s); answered by cloud {out['answered']}; model: "
            f"{source}; {sum(live.report.sent_bytes.values())} bytes preheated {dict(live.report.sent_bytes)}; {pol}"
            f"{cut}; failed {out['failed_requests']}")
