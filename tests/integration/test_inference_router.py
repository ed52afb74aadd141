"""Serving on several clouds behind one router, all real processes: byte_lm replicas and HAProxy on 127.0.0.1.

A tiny byte_lm model is built by its program, stored as a safetensors artifact
in beijing's store and preheated to shanghai; singapore starts cold. Client
threads send a steady stream of completions through the router while the tests
change weights, add a cloud after preheating it, and drain a cloud for a grid
request: no request may fail, and the split must follow the weights.
With ``CI=true`` a replica or router that cannot start fails the test.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
import time

import httpx
import pytest
from airflowstandalone import unavailable
from servingload import Load, phase
from s3servers import free_port

from crosscloud.artifacts.preheat import TransferReport, fetch
from crosscloud.core.federation import load_federation
from crosscloud.serving.replica import ReplicaError, ServeSpec, bring_up, find, start, stop, take_down, wait_ready
from crosscloud.serving.router import Endpoint, Router, RouterError
from crosscloud.serving.server import CLOUD_HEADER
from crosscloud.store.chunks import BlobRef, put_blob
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import to_bytes
from crosscloud.training.program import load_program, program_source
from crosscloud.training.session import parameters

pytestmark = pytest.mark.inference

TENANT = "team-a"
PROGRAM = "examples/byte_lm/train.py"
ARGS = {"seed": 26, "model_size": "tiny"}


@pytest.fixture(scope="module")
def model() -> BlobRef:
    """The tiny model as an artifact in beijing's store, preheated to shanghai; singapore stays cold."""
    fed = load_federation()
    module = load_program(program_source(PROGRAM), PROGRAM)
    weights = to_bytes({n: p.detach() for n, p in parameters(module.build_model(ARGS)).items()})
    home = open_store(fed.cloud("beijing"), TENANT)
    ref, _ = put_blob(home, TENANT, weights, kind="model")
    fetch(open_store(fed.cloud("shanghai"), TENANT), [home], TENANT, ref, TransferReport())
    return ref


@pytest.fixture(scope="module")
def serving(model, tmp_path_factory):
    """A router with a ready replica on beijing and on shanghai; torn down with every process it started."""
    spec = ServeSpec(tenant=TENANT, name="byte-lm-tiny", model=f"{model.sha256}:{model.size}", program=PROGRAM, args=ARGS)
    router, handles = Router(tmp_path_factory.mktemp("router"), free_port(), check_ms=200), {}
    try:
        try:
            router.start()
            for cloud in ("beijing", "shanghai"):
                handles[cloud] = bring_up(router, spec, cloud)
        except (RouterError, ReplicaError) as exc:
            unavailable(f"the serving processes did not start: {exc}")
        yield spec, router, handles
    finally:
        for handle in handles.values():
            stop(handle)
        router.stop()


def test_weight_changes_under_load_fail_no_request_and_the_split_follows(serving):
    _, router, _ = serving
    with Load(router.url) as load:
        router.set_weights({"beijing": 1, "shanghai": 1})
        even = phase(load, 2.0)
        router.set_weights({"beijing": 3, "shanghai": 1})
        skewed = phase(load, 2.0)
        router.set_weights({"beijing": 0, "shanghai": 1})
        shanghai_only = phase(load, 1.0)
        router.set_weights({"beijing": 1, "shanghai": 0})
        router.drain("shanghai")
        beijing_only = phase(load, 1.0)
        router.restore("shanghai")
        router.set_weights({"beijing": 1, "shanghai": 1})
        back = phase(load, 1.0)
    print(f"{len(load.records)} requests, split 1:1 {even}, 3:1 {skewed}, 0:1 {shanghai_only}, 1:drain {beijing_only}")
    assert load.failures() == [], load.failures()[:5]
    assert len(load.records) > 100, f"only {len(load.records)} requests went through"
    assert abs(even.get("beijing", 0) / sum(even.values()) - 0.5) < 0.1, even
    assert abs(skewed.get("beijing", 0) / sum(skewed.values()) - 0.75) < 0.1, skewed
    assert set(shanghai_only) == {"shanghai"} and set(beijing_only) == {"beijing"}, (shanghai_only, beijing_only)
    assert set(back) == {"beijing", "shanghai"}, back


def test_an_in_flight_request_finishes_where_it_started(serving):
    """A long request on beijing when beijing's weight drops to 0 and it is drained: it still answers, from beijing."""
    _, router, _ = serving
    router.set_weights({"beijing": 1, "shanghai": 0})
    answer: dict = {}

    def long_request() -> None:
        r = httpx.post(f"{router.url}/v1/completions", timeout=60,
                       json={"prompt": ["a"] * 8, "max_tokens": 256, "temperature": 0})
        answer.update(status=r.status_code, cloud=r.headers.get(CLOUD_HEADER))

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 10
    while router.stats()["beijing-0"]["scur"] == "0" and time.monotonic() < deadline:
        time.sleep(0.01)
    router.set_weights({"beijing": 0, "shanghai": 1})
    router.drain("beijing")
    in_flight = router.stats()["beijing-0"]["scur"]
    thread.join(timeout=60)
    router.restore("beijing")
    assert in_flight == "1", "the long request had finished before the weights changed: the test proved nothing"
    assert answer == {"status": 200, "cloud": "beijing"}


def test_a_completion_streams_through_the_router_as_server_sent_events(serving):
    _, router, _ = serving
    router.set_weights({"beijing": 1, "shanghai": 1})
    ask = {"prompt": "import ", "max_tokens": 24, "temperature": 0}
    whole = httpx.post(f"{router.url}/v1/completions", json=ask, timeout=30).json()["choices"][0]["text"]
    with httpx.stream("POST", f"{router.url}/v1/completions", json={**ask, "stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert len(chunks) > 2 and chunks[-1]["finish_reason"] == "length"
    assert "".join(c["text"] for c in chunks) == whole  # greedy: the same text, in pieces


def test_a_cloud_gets_traffic_only_once_its_model_is_warm(serving, model):
    """singapore is cold: its replica refuses to start, and the router gives it no share until, preheated, it is ready."""
    spec, router, handles = serving
    fed = load_federation()
    port = free_port()
    with pytest.raises(ReplicaError, match="not warm|no artifact"):
        wait_ready(start(spec, fed.cloud("singapore"), port=port), timeout_s=60)
    router.add(Endpoint("singapore", 0, "127.0.0.1", port))  # a slot for it, nothing answering yet
    with Load(router.url) as load:
        weights = router.set_weights({"beijing": 1, "shanghai": 1, "singapore": 2})
        cold = phase(load, 1.0)
        report = TransferReport()
        fetch(open_store(fed.cloud("singapore"), TENANT), [open_store(fed.cloud("beijing"), TENANT)], TENANT, model,
              report)
        handles["singapore"] = start(spec, fed.cloud("singapore"), port=port)
        wait_ready(handles["singapore"], timeout_s=90)
        router.wait_healthy("singapore-0")
        warm_weights = router.set_weights({"beijing": 1, "shanghai": 1, "singapore": 2})
        warm = phase(load, 1.5)
        take_down(router, handles.pop("singapore"))  # scaled down under load: its in-flight requests finish first
        gone = phase(load, 0.5)
    assert weights["singapore-0"] == 0 and "singapore" not in cold, (weights, cold)
    assert report.sent_bytes["singapore"] > 0
    assert warm_weights["singapore-0"] > 0 and warm.get("singapore", 0) > 0.3 * sum(warm.values()), warm
    assert "singapore" not in gone and "singapore-0" not in router.status(), gone
    assert load.failures() == [], load.failures()[:5]


def test_a_replica_whose_program_builds_another_model_says_so_at_once(serving):
    """Warm weights that the program's model cannot take (another size): /health fails with the reason, no waiting."""
    spec, _, _ = serving
    wrong = ServeSpec(tenant=TENANT, name="wrong-size", model=spec.model, program=PROGRAM, args={**ARGS, "model_size": "small"})
    handle = start(wrong, load_federation().cloud("beijing"))
    try:
        started = time.monotonic()
        with pytest.raises(ReplicaError, match=r"could not load its model: ProgramError: .* do not fit .*embed.weight is \(256, 64\) in them, \(256, 128\) here"):
            wait_ready(handle, timeout_s=60)
        assert time.monotonic() - started < 30
    finally:
        stop(handle)


def test_a_grid_request_drains_a_cloud_and_its_traffic_returns_afterwards(serving):
    """The grid request is answered as a DAG task would: through the router another process started."""
    _, started, _ = serving
    router = Router.attach(started.folder)
    assert router.endpoints == started.endpoints
    with Load(router.url) as load:
        router.set_weights({"beijing": 1, "shanghai": 1})
        before = phase(load, 1.0)
        router.drain("shanghai")
        shed = phase(load, 1.5)
        during = router.status()["shanghai-0"]
        router.restore("shanghai")
        after = phase(load, 1.0)
    assert load.failures() == [], load.failures()[:5]
    assert during["state"] == "drain" and during["healthy"] and during["weight"] > 0, during
    assert router.status()["shanghai-0"]["state"] == "ready"
    assert before.get("shanghai", 0) > 0 and "shanghai" not in shed and shed.get("beijing", 0) > 0, (before, shed)
    assert after.get("shanghai", 0) > 0.3 * sum(after.values()), after
    assert all(s["errors_5xx"] == 0 for s in router.status().values()), router.status()


def test_an_attached_router_stops_the_haproxy_another_process_started(tmp_path):
    started = Router(tmp_path / ("a" * 120), free_port())  # a folder longer than a unix socket path may be
    try:
        started.start()
    except RouterError as exc:
        unavailable(str(exc))
    assert started.proc.poll() is None and Router.running(started.folder)
    Router.attach(started.folder).stop(grace_s=5)
    assert started.proc.wait(timeout=5) is not None
    assert not Router.running(started.folder) and not Router.reachable(started.info())


def test_a_router_of_another_host_is_steered_through_its_runtime_api_and_stopped_only_there(tmp_path):
    """What a task on another host has is the fleet's record: the router's address, runtime API and node name."""
    started = Router(tmp_path / "host-a", free_port(), jurisdictions=frozenset({"CN"}))
    try:
        started.start()
    except RouterError as exc:
        unavailable(str(exc))
    try:
        record = {**started.info(), "folder": str(tmp_path / "host-b" / "router")}  # no such router on this "host"
        remote = Router.attach(record)
        assert remote.jurisdictions == frozenset({"CN"}) and remote.url == started.url
        remote.add(Endpoint("beijing", 0, "127.0.0.1", free_port(), "CN"))  # through the TCP runtime API
        assert "beijing-0" in started.servers()
        with pytest.raises(RouterError, match="runs on another host"):
            remote.stop(grace_s=1)
        assert started.proc.poll() is None
        assert not Router.reachable({**record, "node": "crosscloud-another"})  # the port taken by another router
    finally:
        started.stop(grace_s=5)


def test_a_router_bound_to_a_tenants_jurisdiction_never_takes_a_cloud_outside_it(tmp_path):
    """Residency: a CN tenant's router refuses singapore before any replica starts there, whatever the weights."""
    spec = ServeSpec(tenant=TENANT, name="resident", model="0" * 64, program=PROGRAM, args=ARGS)
    router = Router(tmp_path, free_port(), jurisdictions=frozenset({"CN"}))
    with pytest.raises(RouterError, match=r"singapore is in SG; .* only to \['CN'\]"):
        bring_up(router, spec, "singapore")
    assert find(spec, load_federation().cloud("singapore")) is None and router.endpoints == {}
    router.admits(Endpoint("beijing", 0, "127.0.0.1", 1, "CN"))


class _Flaky(http.server.BaseHTTPRequestHandler):
    """A replica's /health that answers 503 while the server's ``failing`` flag is set."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(503 if self.server.failing else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_one_failed_check_leaves_a_replica_healthy_until_haproxy_itself_marks_it_down(tmp_path):
    """An operator's 'healthy' is HAProxy's verdict (fall 3), not the last check: one slow answer is not an outage."""
    replica = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    replica.failing = False
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    router = Router(tmp_path, free_port(), check_ms=1000)
    try:
        try:
            router.start()
        except RouterError as exc:
            unavailable(str(exc))
        router.add(Endpoint("beijing", 0, "127.0.0.1", replica.server_address[1]))
        router.wait_healthy("beijing-0")
        replica.failing = True
        row = _wait_for(lambda r: r.get("srv_check_result") == "2", router)  # CHK_RES_FAILED: one check failed
        seen = router.status()["beijing-0"]  # two more checks (2 s) before HAProxy could mark it down
        assert row["srv_op_state"] == "2" and seen["healthy"], (row, seen)
        _wait_for(lambda r: r.get("srv_op_state") == "0", router)  # SRV_ST_STOPPED after three
        assert not router.status()["beijing-0"]["healthy"]
        replica.failing = False
        _wait_for(lambda r: r.get("srv_op_state") == "2", router)
        assert router.status()["beijing-0"]["healthy"]
    finally:
        router.stop(grace_s=5)
        replica.shutdown()


def _wait_for(condition, router: Router, timeout_s: float = 30.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while not condition(row := router.servers().get("beijing-0", {})):
        assert time.monotonic() < deadline, row
        time.sleep(0.02)
    return row


def test_a_router_that_died_is_restored_on_its_port_with_the_running_replicas_and_the_shares_in_force(model, capsys):
    """HAProxy killed (no clean stop): the replicas run on; ``crosscloud serve restore`` brings the router back."""
    from crosscloud.cli import main as cli
    from crosscloud.serving.fleet import Fleet

    spec = ServeSpec(tenant=TENANT, name="byte-lm-restore", model=model.text, program=PROGRAM, args=ARGS)
    fleet = Fleet(TENANT, spec.name)  # in the deployment's ledger, where the CLI finds served models
    try:
        done = fleet.apply(spec, {"beijing": 1, "shanghai": 1}, {"beijing": 1, "shanghai": 1})
        fleet.save_decision({"shares": {"beijing": 0.5, "shanghai": 0.5}})
        os.kill(json.loads((fleet.router_folder / "router.json").read_text())["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while fleet.router() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fleet.router() is None and {r.cloud for r in fleet.replicas()} == {"beijing", "shanghai"}
        assert cli(["serve", "restore", "--tenant", TENANT, "--model", spec.name]) == 0
        assert f"router {done['router']} with beijing-0, shanghai-0" in capsys.readouterr().out
        restored = fleet.router()
        assert restored is not None and restored.url == done["router"]  # its clients keep their URL
        with Load(restored.url) as load:
            split = phase(load, 1.5)
        assert load.failures() == [], load.failures()[:5]
        assert split.get("beijing", 0) > 0.3 * sum(split.values()) and split.get("shanghai", 0) > 0.3 * sum(split.values())
        assert fleet.restore().url == restored.url  # a router that runs is kept as it is
    finally:
        fleet.stop()
        fleet.forget()  # no served model left for later tests' listings


def test_two_hosts_change_one_fleet_in_turn_through_one_router(model, tmp_path):
    """Two hosts (their own state folders) over the deployment's ledger: one record, one router; two placements at
    once take turns, so the second finds the first's replica and starts none, and no request fails."""
    from concurrent.futures import ThreadPoolExecutor

    from crosscloud.serving.fleet import Fleet
    from crosscloud.serving.status import fleets

    spec = ServeSpec(tenant=TENANT, name="byte-lm-two-hosts", model=model.text, program=PROGRAM, args=ARGS)
    host_a, host_b = (Fleet(TENANT, spec.name, root=tmp_path / host) for host in ("host-a", "host-b"))
    both = {"beijing": 1, "shanghai": 1}
    try:
        first = host_a.apply(spec, {"beijing": 1}, {"beijing": 1})
        with Load(first["router"]) as load:
            with ThreadPoolExecutor(2) as pool:
                changes = [pool.submit(fleet.apply, spec, both, both) for fleet in (host_a, host_b)]
                done = [c.result(timeout=300) for c in changes]
            split = phase(load, 1.5)
        assert load.failures() == [], load.failures()[:5]
        assert sorted(d["started"] for d in done) == [[], ["shanghai-0"]], done  # in turn: never started twice
        assert {d["router"] for d in done} == {first["router"]}  # the router host-a started, steered from host-b
        assert sorted((r.cloud, r.index) for r in host_b.replicas()) == [("beijing", 0), ("shanghai", 0)]
        assert not (tmp_path / "host-b" / TENANT / spec.name / "router").exists()  # it runs on host-a only
        assert split.get("shanghai", 0) > 0.2 * sum(split.values()), split
        host_b.save_decision({"shares": both})
        assert host_a.decision == {"shares": both} and (TENANT, spec.name) in [(f.tenant, f.name) for f in fleets()]
    finally:
        host_b.forget()
    assert (TENANT, spec.name) not in [(f.tenant, f.name) for f in fleets()] and host_a.router() is None
