"""Round exchange: each cloud reducing every round itself (replicated outer step) against today's central coordinator.

Synthetic pseudo-gradients shaped like a transformer of P parameters go through
the real exchange code (``training.exchange.cloud.CloudExchange``) between N
local clouds (``file://`` stores in a temporary folder, ``--spool``), every
peer's store reached over an emulated WAN link (``store.network.LinkedStore``
with one ``EmulatedLink`` per pair of clouds, ``--bandwidth-mbps``,
``--latency-ms``), the way ``store_seen_from`` gives a sub-task its peers.

**The model.** Embeddings (vocab x d; vocab 32,000, 4,096 below 10 M), per
layer attention (qkv 3d x d and out d x d: 4 d^2, with biases), MLP (up 4d x d,
down d x 4d: 8 d^2, with biases) and two LayerNorms, and a final norm; d the
smallest multiple of 64 for which d / 64 layers reach P, then the layer count
that comes nearest P. The model (global r) is fp32 ``randn * 0.02`` from
``torch.Generator(seed)``; each cloud's delta of each round is ``randn *
1e-3`` from a generator seeded by (seed, round, cloud), encoded as the
clouds commit it (int8 blocks, ``compression.encode``, ``delta.int8.safetensors``;
``--compression none``: fp32 ``delta.safetensors``) and committed to the
cloud's own store with ``commit.put_object`` + ``write_step``, meta as
``DiLoCo._commit`` writes it. The plan (``run.plan.Plan``, built here) has
``--rounds`` + 1 rounds, so no measured round is the run's last (which adopts
the plain average): every measured round applies the outer step with
``--outer-lr`` / ``--outer-momentum`` (DiLoCo's 0.7 / 0.9 by default; the
job's own defaults are 1.0 / 0, which write no momentum), no evaluation due.

**Per (P, N), in one run:**

1. every cloud's deltas of every round are committed first; then each cloud,
   one after another, runs ``CloudExchange.round(r, known)`` for r = 0 ..
   ``--rounds`` - 1 in a fresh process of its own (``--role cloud``): the
   first decides each round's members, the others read them. Before each
   round's clock starts, the cloud hands the exchange its own delta's bytes
   (``CloudExchange.hand_in``), as the sub-task that committed them does, so
   the round reads only its peers' deltas; the bytes count in its peak. ``known`` is the
   model, built before anything is measured; after each round the model takes
   the new global in place, as a cloud folds it in.
2. the watcher, ``training.watcher.Watcher(plan, stores, handles=[]).act()``,
   in a fresh process (``--role watcher``) over the rounds the clouds decided:
   what Airflow holds (it imports no torch; checked).
3. today's central coordinator (deleted in the commit that made the clouds
   reduce; reproduced here from the engine's pieces: ``screening.screen``,
   ``outer.weighted_mean`` / ``outer_step``, the global's int8 update with an
   ``ErrorFeedback`` as ``checkpoint.quantized_global`` made it, ``to_bytes`` +
   ``write_step`` to every cloud's store, the full global and its state at
   home, only the int8 update to the others), in a fresh process on the home
   cloud (``--role central``), with one torch thread as it ran, over the same
   committed deltas. It writes under ``<run>/central/`` so the clouds'
   globals stay as they made them. It is skipped where its peak, extrapolated
   from the smaller P (else (N + 10) model copies), would not fit the memory
   available, and it says so.

**Definitions.**

- peak RSS beyond the model: in the measuring process, VmRSS after the
  model (the fp32 global, and torch) is built, then before each round the peak
  is reset (``5`` to ``/proc/self/clear_refs``) and after it VmHWM read; the
  figure is the largest VmHWM over the rounds less that VmRSS, so it is the
  exchange's alone (for the central coordinator it includes the outer momentum
  and the error-feedback residual it keeps between rounds). ratio = that /
  fp32 model bytes (4 P).
- watcher RSS: the watcher process's VmHWM at its end (interpreter, imports
  and all), in MB (10^6 bytes).
- bytes per cloud per round: read = bytes read from the peers' stores over
  the WAN (``stats["read_bytes"]``: the peers' deltas); written = bytes the
  exchange writes to the cloud's own store (the global and its momentum:
  ``stats["written_bytes"]``). The delta each cloud commits before the exchange
  (the same in both designs) is in neither. Central: read = the peers' deltas
  over the WAN; written = every object it writes, home and WAN together, and
  the WAN part separately.
- exchange wall time: ``CloudExchange.round`` from call to return, the time
  training waits for the global (decide; fetch: every member's delta
  downloaded, all at once, and folded in as it lands, the digest hashed as
  the global is written, then the screen; reduce: the round reduced again
  when the screen refused a folded contribution, else 0). ``--blocking``
  measures the reduce that waits for every delta (fetch: downloaded and
  inspected; reduce: screen and reduce after). ``CloudExchange.publish`` (upload of the cloud's
  copy, commit, retention) runs beside training in a sub-task; it is timed on
  its own (``publish_s``) and its memory is in the peak.
- link-rate time: the bytes the cloud moved over the WAN / the link's
  bandwidth + one latency per object moved over it: (read + WAN written) / B
  + latency x objects. For a replicated cloud: its peers' deltas (N - 1
  objects; the members record and the commits are a few hundred bytes and are
  not counted). For the central coordinator: N - 1 deltas read and N - 1
  copies of what it publishes to the others. Each peer has a link of its own,
  so a fetch that read the peers in parallel could go below 1.
- exchange_vs_link_bound: sum of a cloud's round wall times / sum of their
  link-rate times. Streamed, the column ``Σdownl`` is the slowest download's
  own time (ranged reads and the hashing along them) of the round.

The table has one row per cloud (and per design) per (P, N), with the
exchange's parts in mean seconds per round: ``decide_s``, ``fetch_s``,
``reduce_s`` (the norm screen and the reduce), ``publish_s`` (uploads,
commit, retention; not in the wall time) from the exchange's own stats, and, summed over the threads that ran
them (so they can exceed the fetch's wall time), Σdownl (``transfer.download``:
ranged reads and the sha256 check), Σinsp (``reduce.inspect``: shapes,
finiteness, norm) and Σsha256 (every file digest of the round, in fetch and
publish), timed by wrapping the engine's functions in the measuring process.
Its last line is

``peak_extra_rss_ratio=<max over clouds and N of the replicated exchange's peak RSS beyond the model / fp32 model
bytes, largest P> airflow_rss_mb=<max over P and N of the watcher's peak RSS> exchange_vs_link_bound=<max over
clouds and N, largest P> central_peak_rss_ratio=<today's coordinator, same unit, at the largest P where it ran,
max over N>``

(goals: <= 1.25, <= 300, <= 1.3; the central figure is the comparison).
``--quick`` (P = 1 M, N = 2) runs in seconds. Exit status 1 when a process
failed or the clouds' globals of a round differ.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# no torch and no engine module at module level: the watcher's process imports this file and must not load torch
TENANT = "team-a"
PARAM_STD, DELTA_STD = 0.02, 1e-3
SHARE = 8  # sequences of the global batch per cloud: equal shares, equal weights


# -- memory of this process ------------------------------------------------------------
def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss() -> int:
    return _status_bytes("VmRSS")


def peak() -> int:
    return _status_bytes("VmHWM")


def reset_peak() -> None:
    """VmHWM back to the current RSS (Linux: ``5`` to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the model -------------------------------------------------------------------------
def transformer_shapes(p: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a transformer of about ``p`` parameters (see the module docstring)."""
    vocab = 32000 if p >= 10_000_000 else 4096
    d = 64
    while 12 * d ** 3 // 64 + vocab * d < p:
        d += 64
    layers = max(1, round((p - vocab * d - 2 * d) / (12 * d * d + 13 * d)))
    shapes = {"embed.weight": (vocab, d), "norm.weight": (d,), "norm.bias": (d,)}
    for i in range(layers):
        pre = f"layers.{i:02d}."
        shapes.update({
            pre + "attn.qkv.weight": (3 * d, d), pre + "attn.qkv.bias": (3 * d,),
            pre + "attn.out.weight": (d, d), pre + "attn.out.bias": (d,),
            pre + "mlp.up.weight": (4 * d, d), pre + "mlp.up.bias": (4 * d,),
            pre + "mlp.down.weight": (d, 4 * d), pre + "mlp.down.bias": (d,),
            pre + "norm1.weight": (d,), pre + "norm1.bias": (d,), pre + "norm2.weight": (d,), pre + "norm2.bias": (d,)})
    return shapes


def numel(shapes: dict[str, tuple[int, ...]]) -> int:
    total = 0
    for shape in shapes.values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def build_model(p: int, seed: int) -> dict:
    """Global 0, fp32, deterministic: the model every cloud holds."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).mul_(PARAM_STD) for n, s in sorted(transformer_shapes(p).items())}


def delta_bytes(p: int, seed: int, round_: int, index: int, compression: str) -> tuple[str, bytes]:
    """Cloud ``index``'s committed pseudo-gradient of ``round_``: object name and bytes, encoded tensor by tensor."""
    import torch
    from crosscloud.store.tensors import to_bytes
    from crosscloud.training.compression import encode

    g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + 1009 * round_ + index + 1)
    payload = {}
    for name, shape in sorted(transformer_shapes(p).items()):
        t = torch.randn(shape, generator=g).mul_(DELTA_STD)
        payload.update(encode({name: t}) if compression == "int8" else {name: t})
    if compression == "int8":
        return "delta.int8.safetensors", to_bytes(payload)
    return "delta.safetensors", to_bytes(payload)


# -- a run of N local clouds ------------------------------------------------------------
def cloud_names(n: int) -> list[str]:
    return [f"cloud-{i}" for i in range(n)]


def make_plan(run_id: str, clouds: list[str], cfg: dict):
    from crosscloud.core.job import JobSpec
    from crosscloud.core.presets import preset
    from crosscloud.run.plan import CloudAssignment, Plan
    from crosscloud.store.chunks import BlobRef

    spec = JobSpec(tenant=TENANT, clouds=clouds, rounds=cfg["rounds"] + 1, round_timeout_s=3600.0, keep_rounds=2,
                   mode="cross_cloud", overlap=True, compression=cfg["compression"], outer_lr=cfg["outer_lr"],
                   outer_momentum=cfg["outer_momentum"], eval_every_steps=10 ** 9, global_batch=SHARE * len(clouds))
    blob = BlobRef(sha256="0" * 64, size=1)
    return Plan(tenant=TENANT, run_id=run_id, federation="bench-exchange", federation_path="", job=spec,
                model=preset(spec.model_size), outer=spec.outer, coordinator_cloud=clouds[0],
                clouds=[CloudAssignment(name=c, role="local", method="local", accelerator="cpu", devices=1,
                                        throughput=1.0, share=SHARE, shards=[i], image="")
                        for i, c in enumerate(clouds)],
                candidates=[], dataset="synthetic", shards=[blob] * len(clouds), held_out=[blob], init=blob,
                created_at=time.time())


def local_store(root: Path, cloud: str):
    from crosscloud.store.base import LocalStore

    return LocalStore(root / "stores" / cloud, cloud)


def open_run(job: dict, seen_from: str | None):
    """The plan and every cloud's store, as a process on ``seen_from`` reaches them (None: no links, the watcher's host)."""
    from crosscloud.run.plan import Plan

    root, clouds = Path(job["root"]), job["clouds"]
    plan = Plan.load(local_store(root, clouds[0]), TENANT, job["run_id"])
    stores = {c: local_store(root, c) for c in clouds}
    if seen_from is not None:
        from crosscloud.store.network import EmulatedLink, LinkedStore

        stores = {c: s if c == seen_from else LinkedStore(s, EmulatedLink(job["bandwidth_mbps"], job["latency_ms"]))
                  for c, s in stores.items()}
    return plan, stores


def commit_deltas(root: Path, runs: dict[str, list[str]], p: int, cfg: dict) -> int:
    """Every cloud's delta of every round, committed in its own store for every run it is in; the delta's size."""
    from crosscloud.core.keys import RunKeys
    from crosscloud.store.commit import put_object, write_step

    size, most = 0, max(len(c) for c in runs.values())
    for r in range(cfg["rounds"]):
        for i in range(most):
            name, data = delta_bytes(p, cfg["seed"], r, i, cfg["compression"])
            size = len(data)
            for run_id, clouds in runs.items():
                if i >= len(clouds):
                    continue
                cloud, store = clouds[i], local_store(root, clouds[i])
                step = RunKeys(TENANT, run_id).cloud_step(cloud, r)
                entry = put_object(store, f"{step}/{name}", data)
                now = time.time()
                write_step(store, step, {}, refs={name: entry}, meta={
                    "round": r, "cloud": cloud, "samples": SHARE * 20, "losses": [2.0] * 20, "step_s": [0.1] * 20,
                    "compute_s": 2.0, "folded_at_step": 3, "cap": 1.0, "started_at": now - 2.0, "wait_s": 0.0,
                    "download_s": 0.0, "upload_s": 0.1, "exchange": {}})
            del data
    return size


# -- the roles, each in a fresh process ---------------------------------------------------
def _timed(table: dict, key: str, fn, lock):
    """``fn``, its seconds added to ``table[key]`` (summed over the threads that call it)."""
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            with lock:
                table[key] = table.get(key, 0.0) + time.perf_counter() - t
    return wrapper


def cloud_role(job: dict) -> dict:
    """One cloud's exchange of every round, its peak RSS beyond the model per round."""
    import threading

    import torch
    from crosscloud.store.commit import read_commit
    from crosscloud.training.exchange import cloud as xc
    from crosscloud.training.exchange import transfer
    from crosscloud.training.exchange.tensorfile import TensorFile

    plan, stores = open_run(job, job["cloud"])
    known = build_model(job["p"], job["seed"])
    timers: dict[str, float] = {}
    lock = threading.Lock()
    xc.download = _timed(timers, "download_s", xc.download, lock)
    xc.inspect = _timed(timers, "inspect_s", xc.inspect, lock)
    transfer.file_sha256 = _timed(timers, "sha256_s", transfer.file_sha256, lock)
    xc.file_sha256 = transfer.file_sha256
    exchange = xc.CloudExchange(plan, job["cloud"], stores, Path(job["spool"]),
                                log=lambda m: print(m, file=sys.stderr), stream=not job.get("blocking"))
    gc.collect()
    base, rounds = rss(), []
    for r in range(job["rounds"]):
        timers.clear()
        own = read_commit(stores[job["cloud"]], plan.keys.cloud_step(job["cloud"], r))["objects"]
        entry = next(iter(own.values()))
        exchange.hand_in(entry, stores[job["cloud"]].get(entry["key"]))  # what the sub-task holds, as it committed it
        reset_peak()
        t = time.perf_counter()
        result = exchange.round(r, known)  # the global made: what training waits for
        wall = time.perf_counter() - t
        exchange.publish(result)  # the cloud's copy committed, beside training in a sub-task; timed on its own
        top = peak()
        rounds.append({"round": r, "wall_s": wall, "peak": top, "digest": result.digest, "refused": result.refused,
                       "members": sorted(result.members.contributions), **result.stats, **timers})
        with TensorFile(result.params) as f, torch.no_grad():  # the model takes the new global, as a cloud folds it in
            for name, t_ in known.items():
                t_.copy_(f.read(name).view(t_.shape))
    exchange.close()
    return {"base_rss": base, "rounds": rounds}


def central_round(plan, stores: dict, r: int, state: dict) -> dict:
    """Today's coordinator's round: every delta read whole, the outer step, the int8 update, published everywhere.

    ``state`` holds its params, outer momentum and error feedback between rounds, as the coordinator's loop did.
    """
    from crosscloud.store.commit import read_commit, write_step
    from crosscloud.store.tensors import to_bytes
    from crosscloud.training.compression import decode
    from crosscloud.training.outer import outer_config, outer_step, weighted_mean
    from crosscloud.training.screening import screen

    home, keys, feedback = plan.coordinator_cloud, plan.keys, state["feedback"]
    commits = {c: read_commit(stores[c], keys.cloud_step(c, r)) for c in sorted(stores)}
    shares = {c.name: c.share for c in plan.clouds}
    deltas, refused = screen(stores, commits, state["params"], shares)
    new, state["momentum"] = outer_step(state["params"], weighted_mean(deltas, {c: float(n) for c, n in shares.items()}),
                                        state["momentum"], outer_config(plan, r))
    update = None
    if feedback:  # checkpoint.quantized_global: the others hold the global before, so they get its int8 update
        update = feedback.compress({n: new[n] - state["params"][n] for n in new})
        new = {n: state["params"][n] + d for n, d in decode(update, state["params"]).items()}
    state["params"] = new
    objects = {"params.safetensors": to_bytes(new)}
    if update is not None:
        objects["update.int8.safetensors"] = to_bytes(update)
    if state["momentum"] is not None:
        objects["outer_state.safetensors"] = to_bytes(state["momentum"])
    if feedback and feedback.residual:
        objects["update_residual.safetensors"] = to_bytes(feedback.residual)
    others = ({"update.int8.safetensors": objects["update.int8.safetensors"]} if update is not None else
              {k: v for k, v in objects.items() if k not in ("outer_state.safetensors", "update_residual.safetensors")})
    step, meta = f"{keys.root}/central/{r + 1}", {"round": r, "shares": shares, "refused": refused}
    for name in sorted(stores, key=lambda n: n != home):  # its own store first
        write_step(stores[name], step, objects if name == home else others, meta=meta)
    peers = [c for c in stores if c != home]
    return {"read_bytes": sum(commits[c]["objects"][n]["size"] for c in peers for n in commits[c]["objects"]),
            "written_bytes": sum(map(len, objects.values())) + len(peers) * sum(map(len, others.values())),
            "wan_written_bytes": len(peers) * sum(map(len, others.values())), "wan_objects": len(peers) * (1 + len(others)),
            "refused": refused, "members": sorted(deltas)}


def central_role(job: dict) -> dict:
    import torch
    from crosscloud.training.compression import ErrorFeedback

    torch.set_num_threads(1)  # as the coordinator ran: the cores belonged to the sub-tasks
    plan, stores = open_run(job, job["clouds"][0])
    state = {"params": build_model(job["p"], job["seed"]), "momentum": None,
             "feedback": ErrorFeedback() if plan.compression == "int8" else None}
    gc.collect()
    base, rounds = rss(), []
    for r in range(job["rounds"]):
        reset_peak()
        t = time.perf_counter()
        found = central_round(plan, stores, r, state)
        rounds.append({"round": r, "wall_s": time.perf_counter() - t, "peak": peak(), **found})
    return {"base_rss": base, "rounds": rounds}


def watcher_role(job: dict) -> dict:
    from crosscloud.training.watcher import Watcher

    plan, stores = open_run(job, None)
    lines: list[str] = []
    records = Watcher(plan, stores, handles=[], log=lines.append).act()
    return {"peak": peak(), "records": len(records), "digests_agree": all(r["digests_agree"] for r in records),
            "torch_imported": "torch" in sys.modules}


ROLES = {"cloud": cloud_role, "central": central_role, "watcher": watcher_role}


def spawn(role: str, job: dict) -> dict:
    """Run a role in a fresh process; its result, or {"error": ...}."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--role", role, "--job", json.dumps(job)],
                          check=False, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    why = "killed (out of memory?)" if proc.returncode == -9 else f"exit status {proc.returncode}"
    return {"error": f"{role} {job.get('cloud', '')}: {why}: {proc.stderr.strip()[-2000:]}"}


# -- one (P, N) -----------------------------------------------------------------------------
def link_seconds(nbytes: int, objects: int, cfg: dict) -> float:
    return nbytes * 8 / (cfg["bandwidth_mbps"] * 1e6) + objects * cfg["latency_ms"] / 1000


def cloud_row(found: dict, p_real: int, n: int, cfg: dict) -> dict:
    rounds, model = found["rounds"], 4 * p_real
    extra = max(r["peak"] for r in rounds) - found["base_rss"]
    wall = sum(r["wall_s"] for r in rounds)
    link = sum(link_seconds(r["read_bytes"], n - 1, cfg) for r in rounds)
    mean = lambda k: sum(r.get(k, 0.0) for r in rounds) / len(rounds)
    return {"extra": extra, "ratio": extra / model, "read": mean("read_bytes"), "written": mean("written_bytes"),
            "wan_written": 0.0, "wall": wall / len(rounds), "link": link / len(rounds), "vs_link": wall / link if link else 0.0,
            "decide": mean("decide_s"), "fetch": mean("fetch_s"), "download": mean("download_s"),
            "inspect": mean("inspect_s"), "reduce": mean("reduce_s"), "publish": mean("publish_s"),
            "sha256": mean("sha256_s"),
            "digests": [r["digest"] for r in rounds]}


def central_row(found: dict, p_real: int, cfg: dict) -> dict:
    rounds, model = found["rounds"], 4 * p_real
    extra = max(r["peak"] for r in rounds) - found["base_rss"]
    wall = sum(r["wall_s"] for r in rounds)
    link = sum(link_seconds(r["read_bytes"] + r["wan_written_bytes"], r["wan_objects"], cfg) for r in rounds)
    mean = lambda k: sum(r[k] for r in rounds) / len(rounds)
    return {"extra": extra, "ratio": extra / model, "read": mean("read_bytes"), "written": mean("written_bytes"),
            "wan_written": mean("wan_written_bytes"), "wall": wall / len(rounds), "link": link / len(rounds),
            "vs_link": wall / link if link else 0.0}


def central_fits(p_real: int, n: int, ratios: dict[int, float]) -> tuple[bool, str]:
    """Whether today's coordinator's peak would fit the memory available now, from its ratio at a smaller P."""
    ratio = ratios.get(n, n + 10.0)
    need = (ratio + 1) * 4 * p_real + 1.5e9  # the model, what the round adds, torch and the interpreter
    have = available_bytes()
    return need < 0.9 * have, f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"


def measure(p: int, n: int, cfg: dict, root: Path, only: list[str] | None = None, central: bool = True,
            watcher: bool = True, central_ratios: dict[int, float] | None = None, deltas: bool = True) -> dict:
    """One (P, N): the clouds' exchanges (``only``: just those clouds), the watcher, the central coordinator.

    The deltas must be committed first (``commit_deltas``; ``deltas`` True does it here for this N alone).
    """
    clouds, run_id = cloud_names(n), f"bench-p{p}-n{n}"
    p_real = numel(transformer_shapes(p))
    if deltas:
        make_plan(run_id, clouds, cfg).save(local_store(root, clouds[0]))
        commit_deltas(root, {run_id: clouds}, p, cfg)
    job = {**cfg, "root": str(root), "run_id": run_id, "clouds": clouds, "p": p}
    out: dict = {"p": p, "p_real": p_real, "n": n, "clouds": {}, "errors": []}
    for cloud in only or clouds:
        found = spawn("cloud", {**job, "cloud": cloud, "spool": str(root / "spool" / run_id / cloud)})
        shutil.rmtree(root / "spool" / run_id / cloud, ignore_errors=True)
        if "error" in found:
            out["errors"].append(found["error"])
        else:
            out["clouds"][cloud] = cloud_row(found, p_real, n, cfg)
    if watcher:
        found = spawn("watcher", job)
        out["watcher"] = found if "error" not in found else None
        if "error" in found:
            out["errors"].append(found["error"])
    if central:
        fits, why = central_fits(p_real, n, central_ratios or {})
        found = spawn("central", job) if fits else {"error": f"central coordinator not run at P={p_real:,}: {why}"}
        out["central"] = central_row(found, p_real, cfg) if "error" not in found else None
        out["central_note"] = found.get("error")
    return out


# -- the table --------------------------------------------------------------------------------
HEADER = (f"{'P':>7} {'N':>2} {'design':<10} {'cloud':<8} {'model MB':>8} {'extra MB':>8} {'ratio':>6} "
          f"{'read MB':>8} {'wrote MB':>8} {'WAN wr MB':>9} {'wall s':>7} {'link s':>7} {'vs link':>7} "
          f"{'decide':>6} {'fetch':>6} {'Σdownl':>6} {'Σinsp':>6} {'reduce':>6} {'publish':>7} {'Σsha256':>7}")


def table_rows(m: dict) -> list[str]:
    lead = f"{m['p_real'] / 1e6:6.1f}M {m['n']:>2}"
    mb = lambda b: f"{b / 1e6:8.1f}"
    rows = []
    for cloud, c in m["clouds"].items():
        rows.append(f"{lead} {'replicated':<10} {cloud:<8} {mb(4 * m['p_real'])} {mb(c['extra'])} {c['ratio']:6.3f} "
                    f"{mb(c['read'])} {mb(c['written'])} {mb(c['wan_written']):>9} {c['wall']:7.2f} {c['link']:7.2f} "
                    f"{c['vs_link']:7.2f} {c['decide']:6.2f} {c['fetch']:6.2f} {c['download']:6.2f} {c['inspect']:6.2f} "
                    f"{c['reduce']:6.2f} {c['publish']:7.2f} {c['sha256']:7.2f}")
    if m.get("central"):
        c = m["central"]
        rows.append(f"{lead} {'central':<10} {'cloud-0':<8} {mb(4 * m['p_real'])} {mb(c['extra'])} {c['ratio']:6.3f} "
                    f"{mb(c['read'])} {mb(c['written'])} {mb(c['wan_written']):>9} {c['wall']:7.2f} {c['link']:7.2f} "
                    f"{c['vs_link']:7.2f}")
    if m.get("watcher"):
        w = m["watcher"]
        rows.append(f"{lead} {'watcher':<10} {'airflow':<8} {'':>8} {w['peak'] / 1e6:8.1f}   (peak RSS of the process; "
                    f"{w['records']} round(s) recorded, digests agree: {w['digests_agree']}, "
                    f"torch imported: {w['torch_imported']})")
    return rows


def summary(results: list[dict]) -> tuple[str, list[str]]:
    """The last line, and notes on what it is taken from."""
    notes, done = [], [m for m in results if m["clouds"]]
    top = max(m["p_real"] for m in done)
    at_top = [c for m in done if m["p_real"] == top for c in m["clouds"].values()]
    ran = [m for m in results if m.get("central")]
    central_p = max((m["p_real"] for m in ran), default=None)
    central = max((m["central"]["ratio"] for m in ran if m["p_real"] == central_p), default=float("nan"))
    airflow = max((m["watcher"]["peak"] / 1e6 for m in results if m.get("watcher")), default=float("nan"))
    notes.append(f"largest P measured: {top:,} parameters (N = {sorted({m['n'] for m in done if m['p_real'] == top})})")
    if central_p != top:
        notes.append(f"central_peak_rss_ratio at P = {central_p:,}: today's coordinator did not fit at the largest P"
                     if central_p else "today's coordinator ran at no P")
    line = (f"peak_extra_rss_ratio={max(c['ratio'] for c in at_top):.3f} airflow_rss_mb={airflow:.1f} "
            f"exchange_vs_link_bound={max(c['vs_link'] for c in at_top):.2f} central_peak_rss_ratio={central:.3f}")
    return line, notes


# -- main -------------------------------------------------------------------------------------------
def run_size(p: int, ns: list[int], cfg: dict, root: Path, central_ratios: dict[int, float]) -> list[dict]:
    """Every N at one P: the deltas committed once for all N, then each N measured and its files removed."""
    runs = {f"bench-p{p}-n{n}": cloud_names(n) for n in ns}
    for run_id, clouds in runs.items():
        make_plan(run_id, clouds, cfg).save(local_store(root, clouds[0]))
    t = time.perf_counter()
    size = commit_deltas(root, runs, p, cfg)
    print(f"P={numel(transformer_shapes(p)):,}: deltas of {size / 1e6:.1f} MB committed for {max(ns)} clouds x "
          f"{cfg['rounds']} round(s) in {time.perf_counter() - t:.1f} s", flush=True)
    out = []
    for n in ns:
        t = time.perf_counter()
        m = measure(p, n, cfg, root, central_ratios=central_ratios, deltas=False)
        if m.get("central"):
            central_ratios[n] = m["central"]["ratio"]
        for row in table_rows(m):
            print(row, flush=True)
        for note in m["errors"] + ([m["central_note"]] if m.get("central_note") else []):
            print(f"  {note}", flush=True)
        print(f"  (P={m['p_real']:,}, N={n}: {time.perf_counter() - t:.1f} s)", flush=True)
        for cloud in cloud_names(n):  # this run's deltas and globals: the disk they took is needed next
            shutil.rmtree(root / "stores" / cloud / TENANT / "runs" / f"bench-p{p}-n{n}", ignore_errors=True)
        out.append(m)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--sizes", default="10e6,100e6,300e6", help="model sizes P, comma-separated")
    a.add_argument("--clouds", default="2,4", help="cloud counts N, comma-separated")
    a.add_argument("--bandwidth-mbps", type=float, default=1000.0)
    a.add_argument("--latency-ms", type=float, default=20.0)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--compression", choices=["int8", "none"], default="int8")
    a.add_argument("--rounds", type=int, default=2, help="rounds exchanged per (P, N): round 1 on is the steady state")
    a.add_argument("--outer-lr", type=float, default=0.7)
    a.add_argument("--outer-momentum", type=float, default=0.9)
    a.add_argument("--spool", default=None, help="folder for the clouds' stores and spools (default: the temporary folder)")
    a.add_argument("--quick", action="store_true", help="P = 1 M, N = 2: a check in seconds")
    a.add_argument("--blocking", action="store_true",
                   help="the reduce that waits for every delta (CloudExchange(stream=False)), for comparison")
    a.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    a.add_argument("--job", help=argparse.SUPPRESS)
    return a.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.role:
        print("RESULT " + json.dumps(ROLES[args.role](json.loads(args.job))), flush=True)
        return 0
    sizes = [1_000_000] if args.quick else [int(float(s)) for s in args.sizes.split(",")]
    ns = [2] if args.quick else [int(s) for s in args.clouds.split(",")]
    cfg = {"bandwidth_mbps": args.bandwidth_mbps, "latency_ms": args.latency_ms, "seed": args.seed,
           "compression": args.compression, "rounds": args.rounds, "outer_lr": args.outer_lr,
           "outer_momentum": args.outer_momentum, "blocking": args.blocking}
    if args.spool:
        Path(args.spool).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="crosscloud-bench-exchange-", dir=args.spool))
    print(f"round exchange: P {sizes}, N {ns}, {args.rounds} round(s), {args.compression}, links "
          f"{args.bandwidth_mbps:g} Mbit/s {args.latency_ms:g} ms, outer lr {args.outer_lr:g} momentum "
          f"{args.outer_momentum:g}, {'blocking' if args.blocking else 'streamed'} reduce, {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.2f}), "
          f"{available_bytes() / 2**30:.1f} GiB available, in {root}")
    print("(MB = 10^6 bytes; read/wrote per cloud per round; seconds per round; exchange parts: mean s per round)")
    print(HEADER, flush=True)
    results, ratios, t0 = [], {}, time.perf_counter()
    try:
        for p in sorted(sizes):
            results += run_size(p, ns, cfg, root, ratios)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    failed = [e for m in results for e in m["errors"]]
    split = [(m["p_real"], m["n"]) for m in results
             if any(len({c["digests"][r] for c in m["clouds"].values()}) > 1 for r in range(args.rounds))
             or (m.get("watcher") and not m["watcher"]["digests_agree"])]
    if not any(m["clouds"] for m in results):
        print("no cloud's exchange completed")
        return 1
    line, notes = summary(results)
    for note in notes + [f"the clouds' globals differ at (P, N) {split}" for _ in split[:1]]:
        print(note)
    print(f"total {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[2]:.2f} over the last 15 min on "
          f"{os.cpu_count()} CPUs (other work on the machine lengthens the times, not the memory)")
    print(line)
    return 1 if failed or split else 0


if __name__ == "__main__":
    sys.exit(main())
