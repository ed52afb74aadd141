"""The clouds' own round exchange: every cloud makes the same global, refuses the same contributions, and keeps little."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from crosscloud.core.job import JobSpec, OuterConfig
from crosscloud.core.presets import preset
from crosscloud.run.plan import CloudAssignment, Plan
from crosscloud.store.base import LocalStore
from crosscloud.store.chunks import BlobRef
from crosscloud.store.commit import put_object, read_commit, write_step
from crosscloud.store.tensors import to_bytes
from crosscloud.training.compression import ErrorFeedback, decode
from crosscloud.training.exchange.cloud import CloudExchange
from crosscloud.training.exchange.members import read_members
from crosscloud.training.exchange.reduce import Delta, reduce
from crosscloud.training.exchange.tensorfile import TensorFile, TensorFileWriter
from crosscloud.training.outer import outer_step, weighted_mean
from crosscloud.training.stopped import Stopped
from crosscloud.training.watcher import Watcher

CLOUDS = ("beijing", "shanghai", "singapore")


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(64, 16, generator=g), "block.w": torch.randn(16, 48, generator=g),
            "block.b": torch.randn(48, generator=g), "norm": torch.randn(5, generator=g)}


def _plan(tmp_path, spec: JobSpec) -> tuple[Plan, dict[str, LocalStore]]:
    stores = {c: LocalStore(tmp_path / c, c) for c in CLOUDS}
    plan = Plan(tenant=spec.tenant, run_id="ex", federation="test", federation_path="", job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud="beijing",
                clouds=[CloudAssignment(name=c, role="local", method="local", accelerator="cpu", devices=1,
                                        throughput=1.0, share=4, shards=[], image="") for c in CLOUDS],
                candidates=[], dataset="python-stdlib", shards=[], held_out=[], init=BlobRef(sha256="0" * 64, size=1),
                program=None, created_at=time.time())
    return plan, stores


def _commit_delta(plan: Plan, store: LocalStore, cloud: str, r: int, delta: dict[str, torch.Tensor], int8: bool = True,
                  name: str | None = None) -> None:
    payload = ErrorFeedback().compress(delta) if int8 else delta
    name = name or ("delta.int8.safetensors" if int8 else "delta.safetensors")
    step = plan.keys.cloud_step(cloud, r)
    entry = put_object(store, f"{step}/{name}", to_bytes(payload))
    write_step(store, step, {}, refs={name: entry}, meta={"round": r, "cloud": cloud, "samples": 40, "step_s": [0.1],
                                                          "losses": [1.0], "started_at": time.time()})


def _deltas(r: int) -> dict[str, dict[str, torch.Tensor]]:
    return {c: {n: 0.01 * t for n, t in _model(100 * r + i + 1).items()} for i, c in enumerate(CLOUDS)}


def _round(exchange: CloudExchange, r: int, known: dict[str, torch.Tensor]):
    """One cloud's whole exchange of round ``r``: its global made, then committed in its store."""
    result = exchange.round(r, known)
    exchange.publish(result)
    return result


def _exchanges(plan, stores, tmp_path) -> dict[str, CloudExchange]:
    return {c: CloudExchange(plan, c, stores, tmp_path / "spool" / c, log=lambda m: None) for c in CLOUDS}


def test_a_tensor_file_written_in_fragments_is_a_safetensors_file_and_the_same_bytes_everywhere(tmp_path):
    tensors = _model()
    layout = {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}
    for name in ("a", "b"):
        out = TensorFileWriter(tmp_path / f"{name}.safetensors", layout)
        for n, t in sorted(tensors.items(), reverse=name == "b"):  # any order of fragments
            flat = t.reshape(-1)
            for start in range(0, flat.numel(), 100):
                out.write(n, start, flat[start:start + 100])
        out.close()
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    loaded = load_file(tmp_path / "a.safetensors")
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())
    with TensorFile(tmp_path / "a.safetensors") as f:
        assert torch.equal(f.read("embed", 100, 300), tensors["embed"].reshape(-1)[100:300])


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_streamed_reduce_is_the_outer_step_bit_for_bit(tmp_path, momentum):
    known, cfg = _model(), OuterConfig(lr=0.7, momentum=momentum)
    layout = {n: (torch.float32, tuple(t.shape)) for n, t in known.items()}
    deltas, files, buf = _deltas(0), {}, None
    for c, d in deltas.items():
        (tmp_path / f"{c}.st").write_bytes(to_bytes(ErrorFeedback().compress(d)))
        files[c] = Delta(c, tmp_path / f"{c}.st")
        deltas[c] = decode(ErrorFeedback().compress(d), known)  # what the clouds committed, decoded whole
    weights = {"beijing": 4.0, "shanghai": 8.0, "singapore": 4.0}
    expected, buf = outer_step(known, weighted_mean(deltas, weights), None, cfg)
    params = TensorFileWriter(tmp_path / "g.st", layout)
    mom = TensorFileWriter(tmp_path / "m.st", layout) if momentum else None
    reduce(files, weights, known, cfg, params, None, mom, torch.device("cpu"))
    params.close()
    got = load_file(tmp_path / "g.st")
    assert all(torch.equal(got[n], expected[n]) for n in known)
    if momentum:
        mom.close()
        assert all(torch.equal(load_file(tmp_path / "m.st")[n], buf[n]) for n in known)


def test_every_cloud_makes_the_same_global_and_drops_the_same_poisoned_and_damaged_contributions(tmp_path):
    plan, stores = _plan(tmp_path, JobSpec(rounds=3, compression="int8"))
    deltas = _deltas(0)
    deltas["singapore"] = {n: 1000.0 * t for n, t in deltas["singapore"].items()}  # poisoned: well-formed, huge
    for c, d in deltas.items():
        _commit_delta(plan, stores[c], c, 0, d)
    exchanges, known = _exchanges(plan, stores, tmp_path), _model()
    results = {}
    threads = [threading.Thread(target=lambda c=c: results.__setitem__(c, _round(exchanges[c], 0, dict(known))))
               for c in CLOUDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    digests = {c: read_commit(stores[c], plan.keys.global_step(1))["meta"]["digest"] for c in CLOUDS}
    assert len(set(digests.values())) == 1 and {r.digest for r in results.values()} == set(digests.values())
    assert all(set(r.refused) == {"singapore"} and "norm" in r.refused["singapore"] for r in results.values())
    members = read_members(stores["beijing"], plan, 0)
    assert sorted(members.contributions) == list(CLOUDS) and members.decided_by in CLOUDS
    # round 1: shanghai's committed delta is damaged at rest: every cloud reads it 3 times, then refuses it
    for c, d in _deltas(1).items():
        _commit_delta(plan, stores[c], c, 1, d)
    key = read_commit(stores["shanghai"], plan.keys.cloud_step("shanghai", 1))["objects"]["delta.int8.safetensors"]["key"]
    path = stores["shanghai"].root / key
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x10
    path.write_bytes(bytes(raw))
    new = {n: t.clone() for n, t in load_file(results["beijing"].params).items()}
    again = {c: _round(exchanges[c], 1, new) for c in CLOUDS}
    assert len({r.digest for r in again.values()}) == 1
    assert all(set(r.refused) == {"shanghai"} and "sha256" in r.refused["shanghai"] for r in again.values())


class _CountingStore(LocalStore):
    """A cloud's store that remembers every object read from it."""

    def __init__(self, root, cloud):
        super().__init__(root, cloud)
        self.read: list[str] = []

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.read.append(key)
        return super().get_range(key, start, length)


def test_a_cloud_folds_its_own_delta_from_the_bytes_it_committed_not_from_its_store(tmp_path):
    plan, stores = _plan(tmp_path, JobSpec(rounds=3, compression="int8"))
    own = _CountingStore(tmp_path / "beijing", "beijing")
    exchanges = _exchanges(plan, stores, tmp_path)
    exchanges["beijing"] = CloudExchange(plan, "beijing", {**stores, "beijing": own}, tmp_path / "spool" / "beijing",
                                         log=lambda m: None)
    known = _model()
    for r, wrong in ((0, False), (1, True)):
        for c, d in _deltas(r).items():
            _commit_delta(plan, stores[c], c, r, d)
        entry = read_commit(own, plan.keys.cloud_step("beijing", r))["objects"]["delta.int8.safetensors"]
        data = own.get(entry["key"])  # the bytes the sub-task committed, as it still holds them
        exchanges["beijing"].hand_in({**entry, "sha256": "0" * 64} if wrong else entry, b"x" * len(data) if wrong else data)
        digests = {c: _round(exchanges[c], r, dict(known)).digest for c in CLOUDS}
        assert len(set(digests.values())) == 1  # the same global as the clouds that read it from beijing's store
        # handed bytes are used only when they are what the commit names; else the store is read
        assert (entry["key"] in own.read) == wrong
        known = {n: t.clone() for n, t in load_file(exchanges["beijing"].last.params).items()}


def test_a_cloud_past_its_patience_is_left_out_once_and_for_all_and_a_lost_cloud_stops(tmp_path):
    plan, stores = _plan(tmp_path, JobSpec(rounds=3, round_timeout_s=1.0))
    for c, d in _deltas(0).items():
        if c != "singapore":  # singapore never commits round 0
            _commit_delta(plan, stores[c], c, 0, d)
    exchanges = _exchanges(plan, stores, tmp_path)
    result = _round(exchanges["beijing"], 0, _model())
    assert sorted(result.members.contributions) == ["beijing", "shanghai"]
    assert set(result.members.lost) == {"singapore"} and result.members.next_shares["singapore"] == 0
    assert sum(result.members.next_shares.values()) == plan.spec.global_batch  # its share went to the others
    _commit_delta(plan, stores["singapore"], "singapore", 0, _deltas(0)["singapore"])  # too late
    with pytest.raises(Stopped, match="singapore was lost from the run in round 0"):
        _round(exchanges["singapore"], 0, _model())


def test_retention_keeps_the_last_rounds_and_a_restarted_cloud_rebuilds_the_same_global(tmp_path):
    plan, stores = _plan(tmp_path, JobSpec(rounds=6, keep_rounds=2, outer_momentum=0.5))
    exchanges, known = _exchanges(plan, stores, tmp_path), {c: _model() for c in CLOUDS}
    for r in range(4):
        for c, d in _deltas(r).items():
            _commit_delta(plan, stores[c], c, r, d)
        for c in CLOUDS:
            result = _round(exchanges[c], r, known[c])
            known[c] = {n: t.clone() for n, t in load_file(result.params).items()}
    own = stores["shanghai"]
    deltas = {int(k.split("/")[-2]) for k in own.list(f"{plan.keys.root}/clouds/shanghai") if k.endswith("COMMIT.json")}
    globals_ = {int(k.split("/")[-2]) for k in own.list(f"{plan.keys.root}/global") if k.endswith("COMMIT.json")}
    assert deltas == {2, 3} and globals_ == {3, 4}
    # shanghai dies after round 3's exchange and starts again from its state at round 3 (global 3 folded in):
    # it finds its outer momentum in its global 3 and makes global 4 again, the same bytes
    reborn = CloudExchange(plan, "shanghai", stores, tmp_path / "spool-new", log=lambda m: None)
    reborn.restore(3)
    global3 = read_commit(own, plan.keys.global_step(3))["objects"]["params.safetensors"]["key"]
    (tmp_path / "g3.st").write_bytes(own.get(global3))
    redo = _round(reborn, 3, dict(load_file(tmp_path / "g3.st")))
    assert redo.digest == read_commit(own, plan.keys.global_step(4))["meta"]["digest"]


def test_the_watcher_records_decided_rounds_from_the_home_store_alone(tmp_path):
    plan, stores = _plan(tmp_path, JobSpec(rounds=2, inner_steps=10, eval_every_steps=10))
    exchanges = _exchanges(plan, stores, tmp_path)
    watcher = Watcher(plan, stores, handles=[], log=lambda m: None)
    assert watcher.peek() is None and watcher.act() == []
    for c, d in _deltas(0).items():
        _commit_delta(plan, stores[c], c, 0, d)
    for c in CLOUDS:
        _round(exchanges[c], 0, _model())
    assert watcher.peek() is None and watcher.act() == []  # decided, but evaluation is due and not there yet
    stores["beijing"].put(plan.keys.evaluation(1), json.dumps({"eval_loss": 2.5}).encode())
    [record] = Watcher(plan, stores, handles=[], log=lambda m: None).act()  # a new watcher picks up the same round
    assert record["round"] == 0 and record["eval_loss"] == 2.5 and record["digests_agree"]
    assert set(record["digests"]) == set(CLOUDS) and record["wan_bytes"] > 0


class _Landing:
    """A cloud's store as another cloud reads it: each ranged read late by a seeded random delay (so the deltas land
    in a different order each time), and optionally damaged in transit on its first read (a read again mends it)."""

    def __init__(self, inner, seed: int, damaged_once: bool = False):
        import random

        self.inner, self.rng, self.damaged, self.lock = inner, random.Random(seed), damaged_once, threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_range(self, key, start, length):
        with self.lock:
            delay, damage = self.rng.uniform(0, 0.004), self.damaged and start == 1024  # a part of the values
            self.damaged = self.damaged and start != 1024
        time.sleep(delay)
        data = self.inner.get_range(key, start, length)
        return bytes([data[0] ^ 1]) + data[1:] if damage and data else data


def _faulty_round(plan, stores, r: int) -> None:
    """Round ``r``'s deltas, one fault a round: singapore's poisoned (an outlier norm: only the screen refuses it,
    once every norm is known), shanghai's not finite (float32), then of the wrong shape."""
    deltas = _deltas(r)
    if r == 1:
        deltas["singapore"] = {n: 1000.0 * t for n, t in deltas["singapore"].items()}
    if r == 2:
        deltas["shanghai"]["norm"][2] = float("nan")
    if r == 3:
        deltas["shanghai"]["embed"] = deltas["shanghai"]["embed"][:32]
    for c, d in deltas.items():
        _commit_delta(plan, stores[c], c, r, d, int8=r != 2)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_streamed_exchange_makes_the_blocking_global_bit_for_bit_refusals_included(tmp_path, monkeypatch, seed):
    from crosscloud.training.exchange import reduce as reduce_module
    from crosscloud.training.exchange import transfer

    monkeypatch.setattr(transfer, "PART", 512)  # many parts and fragments: the fold trails the downloads
    monkeypatch.setattr(reduce_module, "FRAGMENT", 96)
    plan, stores = _plan(tmp_path, JobSpec(rounds=5, compression="int8", outer_momentum=0.9, outer_lr=0.7))
    for r in range(4):
        if r == 0:
            for c, d in _deltas(0).items():
                _commit_delta(plan, stores[c], c, 0, d)
        else:
            _faulty_round(plan, stores, r)
    landing = {c: _Landing(s, seed * 10 + i, damaged_once=c == "singapore") if c != "beijing" else s
               for i, (c, s) in enumerate(stores.items())}
    blocking = CloudExchange(plan, "beijing", stores, tmp_path / "blocking", log=lambda m: None, stream=False)
    streamed = CloudExchange(plan, "beijing", landing, tmp_path / "streamed", log=lambda m: None)
    known_b, known_s, refused = _model(), _model(), []
    for r in range(4):
        want, got = blocking.round(r, known_b), streamed.round(r, known_s)
        refused.append(want.refused)
        assert got.stats["streamed"] and not want.stats["streamed"]
        assert got.params.read_bytes() == want.params.read_bytes() and got.digest == want.digest
        assert got.refused == want.refused
        assert got.momentum.read_bytes() == want.momentum.read_bytes()  # the next round starts from the same
        for known, result in ((known_b, want), (known_s, got)):
            with TensorFile(result.params) as f:
                for n, t in known.items():
                    t.copy_(f.read(n).view(t.shape))
    assert [sorted(x) for x in refused] == [[], ["singapore"], ["shanghai"], ["shanghai"]]
    assert "norm" in refused[1]["singapore"] and "NaN" in refused[2]["shanghai"] and "expected" in refused[3]["shanghai"]
