"""One cloud's exchange of a round: agree on the members, fetch their deltas once, screen, reduce, publish its own global.

It runs on rank 0 of the cloud's sub-task, beside training (a thread when
rounds overlap). Everything large goes through files in the cloud's spool
folder: the downloaded deltas, the new global and the outer momentum; what it
holds in memory is a few fragments. The global is committed in the cloud's own
store with its sha256, the digest by which the clouds' copies are compared.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from crosscloud.core import failpoints
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectStore, StoreError
from crosscloud.store.commit import read_commit, write_step
from crosscloud.store.digest import IntegrityError
from crosscloud.training.checkpoint import PARAMS
from crosscloud.training.exchange.members import Members, RoundDecider, global_report
from crosscloud.training.exchange.reduce import Delta, inspect, norm_of, reduce, screen
from crosscloud.training.exchange.tensorfile import TensorFile, TensorFileError, TensorFileWriter
from crosscloud.training.exchange.transfer import Download, download, file_sha256, upload
from crosscloud.training.outer import outer_config
from crosscloud.training.stopped import Stopped

MOMENTUM = "outer_momentum.safetensors"
INSPECTING = 2  # deltas inspected at the same time: each holds a few fragments
_NO_DELTA = "cloud {cloud}: its commit lists no pseudo-gradient"


@dataclass
class RoundResult:
    """What a cloud's exchange of round ``members.round`` made: global ``round + 1`` as a local file, and its record."""

    members: Members
    params: Path
    digest: str
    refused: dict[str, str] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)  # seconds and bytes of each part of the exchange
    momentum: Path | None = None
    momentum_digest: str | None = None


class CloudExchange:
    """The exchange of cloud ``cloud``; ``stores`` are every run cloud's store as this cloud reaches them."""

    def __init__(self, plan: Plan, cloud: str, stores: dict[str, ObjectStore], spool: Path,
                 device: torch.device | None = None, log=print, stream: bool = True):
        self.plan, self.cloud, self.stores, self.own = plan, cloud, stores, stores[cloud]
        self.spool, self.device, self.log = Path(spool), device or torch.device("cpu"), log
        self.stream = stream  # fold each delta in as it lands (False: after every one is in and inspected)
        self.decider = RoundDecider(plan, cloud, stores, log)
        self.momentum: Path | None = None  # the outer momentum of the newest global, when the outer step has any
        self.last: RoundResult | None = None  # the round made last: its file stays until the next round
        self._spares: dict[str, Path] = {}  # "global"/"momentum": files done with, written over by the next round
        self._handed: dict[str, tuple[dict, bytes]] = {}  # key -> (entry, bytes): this cloud's delta, as committed
        self._publishing: threading.Thread | None = None
        self._publish_error: BaseException | None = None

    def restore(self, global_: int) -> dict:
        """After a restart: the outer momentum of global ``global_`` from this cloud's own commit of it.

        Returns what that commit says of the exchange that made it (digest, refusals, figures), for the next report.
        """
        commit = read_commit(self.own, self.plan.keys.global_step(global_)) if global_ > 0 else None
        if commit is not None and MOMENTUM in commit["objects"]:
            self.momentum = self.spool / f"momentum-{global_}.safetensors"
            download(self.own, commit["objects"][MOMENTUM], self.momentum)
        elif global_ > 0 and outer_config(self.plan, global_ - 1).momentum:
            raise IntegrityError(f"cloud {self.cloud}: cannot resume after global {global_}: its outer momentum is not "
                                 "committed in this cloud's store")
        return global_report(commit["meta"] if commit else {})

    def hand_in(self, entry: dict, data: bytes) -> None:
        """The delta this cloud just committed as ``entry`` (``put_object``'s), as its bytes: the next round writes
        them to its spool instead of reading them back from the cloud's store."""
        self._handed = {entry["key"]: (entry, data)}

    def _handed_bytes(self, entry: dict | None) -> bytes | None:
        """The handed bytes of ``entry``, once, if they are exactly what it names."""
        held = self._handed.pop(entry["key"], None) if entry else None
        same = held is not None and (held[0]["sha256"], held[0]["size"]) == (entry["sha256"], entry["size"])
        return held[1] if same else None

    def round(self, r: int, known: dict[str, torch.Tensor]) -> RoundResult:
        """Global ``r + 1`` from global ``r`` (``known``) and round ``r``'s members' deltas, as a local file.

        Training can fold it in at once; ``publish`` then commits the cloud's copy.
        """
        self.published()  # the round before is committed (and its file no longer read) before this one starts
        if self.last is not None:  # written over by this round's global
            self._spare(self.last.params)
        t0 = time.perf_counter()
        members = self.decider.decide(r)
        if self.cloud in members.gone:
            raise Stopped(f"cloud {self.cloud} was lost from the run in round {members.round}: "
                          f"{members.gone[self.cloud]}")
        t1 = time.perf_counter()
        folder = self.spool / f"round-{r}"
        layout = {n: (torch.float32, tuple(t.shape)) for n, t in known.items()}
        try:
            if self.stream:
                params, momentum, refused, read, stats = self._streamed(r, members, folder, layout, known)
            else:
                params, momentum, refused, read, stats = self._blocking(r, members, folder, layout, known)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self._handed = {}
        self._adopt(momentum)
        stats = {"decide_s": t1 - t0, **stats, "reduce_s": time.perf_counter() - t1 - stats["fetch_s"],
                 "read_bytes": read}
        self.last = RoundResult(members=members, params=params.close(), digest=params.digest or file_sha256(params.path),
                                refused=refused, stats=stats, momentum=momentum and momentum.close(),
                                momentum_digest=momentum.digest if momentum else None)
        return self.last

    def _blocking(self, r: int, members: Members, folder: Path, layout: dict, known: dict[str, torch.Tensor]):
        """Every delta in and inspected, then screened, then reduced: the reference the streamed round equals."""
        t = time.perf_counter()
        deltas, norms, refused, read = self._fetch(members, folder, layout)
        stats = {"fetch_s": time.perf_counter() - t, "streamed": False}
        try:
            params, momentum = self._screened_reduce(r, members, deltas, norms, refused, known, layout)
        finally:
            for d in deltas.values():
                d.close()
        return params, momentum, refused, read, stats

    def _screened_reduce(self, r: int, members: Members, deltas: dict[str, Delta], norms: dict[str, float],
                         refused: dict[str, str], known: dict[str, torch.Tensor], layout: dict):
        """The norm screen over the well-formed deltas (``refused`` gains its refusals), then the reduce of the rest."""
        refused.update(screen(norms, members.shares))
        accepted = {c: d for c, d in deltas.items() if c not in refused}
        if not accepted:
            raise IntegrityError(f"round {r}: every contribution was refused: {refused}")
        return self._reduce(r, accepted, members, known, layout)

    def publish(self, result: RoundResult, wait: bool = True) -> None:
        """Commit this cloud's copy of the global ``result`` made, then delete what no reader needs any more.

        ``wait=False`` does it in a thread beside training; the next ``round`` (or ``published``) waits for it.
        """
        def work() -> None:
            t = time.perf_counter()
            try:
                result.stats["written_bytes"] = self._publish(result)
                result.stats["publish_s"] = time.perf_counter() - t
                self._retain(result.members.round)
            except BaseException as exc:  # raised where the next round waits for it
                self._publish_error = exc

        if wait:
            work()
            self.published()
            return
        self._publishing = threading.Thread(target=work, name="publish", daemon=True)
        self._publishing.start()

    def published(self) -> None:
        """Wait for the publishing in flight, if any; raise what it failed with."""
        if self._publishing is not None:
            self._publishing.join()
            self._publishing = None
        if self._publish_error is not None:
            error, self._publish_error = self._publish_error, None
            raise error

    def close(self) -> None:
        """After the run's last round: its publishing done, the last file removed."""
        self.published()
        if self.last is not None:
            self.last.params.unlink(missing_ok=True)
        for spare in self._spares.values():
            spare.unlink(missing_ok=True)

    def _fetch(self, members: Members, folder: Path,
               layout: dict) -> tuple[dict[str, Delta], dict[str, float], dict[str, str], int]:
        """Every member's delta into ``folder``, once, all at the same time, each inspected the moment it is in.

        Returns the deltas, their norms, the refused ones (not as committed, malformed, not finite) and the bytes read
        from other clouds' stores.
        """
        inspecting = threading.Semaphore(INSPECTING)  # every download at once, a bounded few inspections

        def one(cloud: str, c: dict) -> tuple[Delta, float]:
            if c["entry"] is None:
                raise IntegrityError(_NO_DELTA.format(cloud=cloud))
            path = folder / f"{cloud}.safetensors"
            download(self.stores[cloud], c["entry"], path, self._handed_bytes(c["entry"]))
            delta = Delta(cloud, path)
            try:
                with inspecting:
                    return delta, inspect(delta, layout)
            except BaseException:
                delta.close()
                raise

        deltas, norms, refused = {}, {}, {}
        with ThreadPoolExecutor(max(1, len(members.contributions))) as pool:
            futures = {cloud: pool.submit(one, cloud, c) for cloud, c in sorted(members.contributions.items())}
            for cloud, future in futures.items():
                try:
                    deltas[cloud], norms[cloud] = future.result()
                except (IntegrityError, TensorFileError) as exc:
                    refused[cloud] = str(exc)
        return deltas, norms, refused, self._read_bytes(members)

    def _read_bytes(self, members: Members) -> int:
        """The bytes a round reads from other clouds' stores: every other member's delta, once."""
        return sum(int(c["entry"]["size"]) for cloud, c in members.contributions.items()
                   if cloud != self.cloud and c["entry"] is not None)

    def _streamed(self, r: int, members: Members, folder: Path, layout: dict, known: dict[str, torch.Tensor]):
        """Every delta folded in as it lands, then screened; the same bytes as ``_blocking``, refusals included.

        Every member's download starts at once, and the reduce reads each
        fragment of every well-formed delta behind its download, in the blocking
        order (tensors and clouds sorted), summing each delta's squares on the
        way. The screen can only be judged once every norm is known: when it
        (or a delta found not finite, or a download read again or failed)
        refuses a contribution that was folded, the round is reduced again from
        the local files, as ``_blocking`` reduces it. Either way the same
        contributions are dropped, and the global has the same bytes.
        """
        t = time.perf_counter()
        refused: dict[str, str] = {}
        loads = {c: Download(self.stores[c], e["entry"], folder / f"{c}.safetensors", self._handed_bytes(e["entry"]))
                 for c, e in sorted(members.contributions.items()) if e["entry"] is not None}
        refused.update({c: _NO_DELTA.format(cloud=c) for c, e in members.contributions.items() if e["entry"] is None})
        deltas = self._landing(loads, layout, refused)
        read = self._read_bytes(members)
        try:
            squares: dict[str, dict[str, float]] = {}
            try:
                if not deltas:
                    raise IntegrityError(f"round {r}: every contribution was refused: {refused}")
                params, momentum = self._reduce(r, deltas, members, known, layout, squares)
            except (IntegrityError, TensorFileError):  # a download refused mid-fold: judged below, as blocking would
                params = momentum = None
            norms = self._judged(loads, deltas, squares, layout, refused)
            stats = {"fetch_s": time.perf_counter() - t, "streamed": True, "reduced_again": False,
                     "download_s": max((load.seconds for load in loads.values()), default=0.0)}
            if (params is None or set(deltas) - set(norms) or screen(norms, members.shares)
                    or any(load.attempts > 1 for load in loads.values())):
                stats["reduced_again"] = True
                for writer in (params, momentum):
                    if writer is not None:
                        writer.close()
                params, momentum = self._screened_reduce(r, members, {c: deltas[c] for c in norms}, norms, refused,
                                                         known, layout)
        finally:
            for d in deltas.values():
                d.close()
        return params, momentum, refused, read, stats

    def _landing(self, loads: dict[str, Download], layout: dict, refused: dict[str, str]) -> dict[str, Delta]:
        """Each download's delta, opened once its header is in and checked against the model's layout.

        A header that does not check out is judged again on the verified file
        (a read again may have mended it), as the blocking round judges it.
        """
        deltas = {}
        for cloud, load in loads.items():
            try:
                try:
                    deltas[cloud] = _checked(Delta.landing(cloud, load.path, load.wait), layout)
                except (IntegrityError, TensorFileError):
                    load.result()
                    deltas[cloud] = _checked(Delta(cloud, load.path), layout)
            except (IntegrityError, TensorFileError) as exc:
                refused[cloud] = str(exc)
        return deltas

    def _judged(self, loads: dict[str, Download], deltas: dict[str, Delta], squares: dict[str, dict[str, float]],
                layout: dict, refused: dict[str, str]) -> dict[str, float]:
        """Every folded delta's norm, once its download is verified; ``refused`` gains the ones that failed.

        A delta read more than once was folded (in part) from bytes that were
        not its own: its norm is taken again from the verified file.
        """
        norms = {}
        for cloud, delta in deltas.items():
            try:
                loads[cloud].result()
                delta.wait = None
                sums = squares.get(cloud, {})
                norms[cloud] = (inspect(delta, layout) if loads[cloud].attempts > 1 or set(sums) != set(layout)
                                else norm_of(cloud, sums, layout))
            except (IntegrityError, TensorFileError) as exc:
                refused[cloud] = str(exc)
        return norms

    def _reduce(self, r: int, accepted: dict[str, Delta], members: Members, known: dict[str, torch.Tensor],
                layout: dict, squares: dict | None = None) -> tuple[TensorFileWriter, TensorFileWriter | None]:
        """The new global (and momentum) written by the reduce, each writer still open for its ``close``."""
        cfg = outer_config(self.plan, r)
        params = TensorFileWriter(self._recycled(self.spool / f"global-{r + 1}.safetensors"), layout, reuse=True)
        momentum_out = (TensorFileWriter(self._recycled(self.spool / f"momentum-{r + 1}.safetensors"), layout, reuse=True)
                        if cfg.momentum else None)
        momentum_in = TensorFile(self.momentum) if self.momentum and cfg.momentum else None
        try:
            weights = {c: float(members.shares.get(c, 0)) for c in accepted}
            if not sum(weights.values()):  # every contribution idle: nothing to weigh by, average them evenly
                weights = {c: 1.0 for c in accepted}
            half = len(known) // 2 or 1
            reduce(accepted, weights, known, cfg, params, momentum_in, momentum_out, self.device,
                   after=lambda done: done == half and failpoints.hit("reduce", self.cloud, r, self.spool),
                   squares=squares)
        except BaseException:
            params.close()
            if momentum_out:
                momentum_out.close()
            raise
        finally:
            if momentum_in:
                momentum_in.close()
        return params, momentum_out

    def _adopt(self, momentum_out: TensorFileWriter | None) -> None:
        """The round's momentum replaces the one it was made from, which the next round's is written over."""
        if self.momentum and momentum_out and self.momentum != momentum_out.path:
            self._spare(self.momentum)
        self.momentum = momentum_out.path if momentum_out else None

    def _spare(self, path: Path) -> None:
        """A file no reader needs any more, kept to be written over (``_recycled``): one of each kind at most."""
        kind = path.name.split("-")[0]
        old = self._spares.get(kind)
        if old is not None and old != path:
            old.unlink(missing_ok=True)
        self._spares[kind] = path

    def _recycled(self, path: Path) -> Path:
        """``path``, taken over from a spare file of its kind when there is one and ``path`` is not there yet."""
        spare = self._spares.pop(path.name.split("-")[0], None)
        if spare is not None and spare != path and spare.exists() and not path.exists():
            os.replace(spare, path)
        elif spare is not None and spare != path:
            spare.unlink(missing_ok=True)
        return path

    def _publish(self, result: RoundResult) -> int:
        """Commit global ``r + 1`` in the own store; a restarted cloud finds it committed and checks the digest."""
        r, digest, members = result.members.round, result.digest, result.members
        step = self.plan.keys.global_step(r + 1)
        done = read_commit(self.own, step)
        if done is not None:
            if done["meta"].get("digest") != digest:
                raise IntegrityError(f"cloud {self.cloud}: global {r + 1} was committed with digest "
                                     f"{done['meta'].get('digest', '?')[:12]}, recomputed {digest[:12]}")
            return 0
        refs = {PARAMS: upload(self.own, f"{step}/{PARAMS}", result.params, digest)}
        if result.momentum is not None:
            refs[MOMENTUM] = upload(self.own, f"{step}/{MOMENTUM}", result.momentum, result.momentum_digest)
        failpoints.hit("publish", self.cloud, r, self.spool)
        meta = {"round": r, "cloud": self.cloud, "digest": digest, "members": sorted(members.contributions),
                "refused": result.refused, "exchange": dict(result.stats), "published_at": time.time()}
        write_step(self.own, step, {}, refs=refs, meta=meta)
        return sum(e["size"] for e in refs.values())

    def _retain(self, r: int) -> None:
        """Delete this cloud's deltas and globals no reader needs any more: all but the last ``keep_rounds``.

        Round ``r``'s record exists, so every cloud still in the run has folded
        global ``r`` and saved its state at round ``r``: none reads a delta before
        round ``r`` or a global before ``r`` again. Global 0 and the last global stay.
        """
        keys, keep = self.plan.keys, self.plan.spec.keep_rounds
        old = [keys.cloud_step(self.cloud, r - keep)] + ([keys.global_step(r + 1 - keep)] if r + 1 - keep > 0 else [])
        for step in old if r - keep >= 0 else []:
            try:
                found = self.own.list(step)
                for key in sorted(found, key=lambda k: not k.endswith("/COMMIT.json")):  # the commit first
                    if key.startswith(step + "/"):
                        self.own.delete(key)
            except StoreError as exc:  # left for the run's end: a retention failure never stops training
                self.log(f"retention: {step}: {exc}")


def _checked(delta: Delta, layout: dict) -> Delta:
    """``delta`` once it is found to hold exactly the model's tensors; closed, and the error raised, if not."""
    try:
        delta.check(layout)
    except IntegrityError:
        delta.close()
        raise
    return delta


def spool_folder(plan: Plan, cloud: str) -> Path:
    """Where a cloud's sub-task keeps the round's files: ``CROSSCLOUD_SPOOL``, else the temporary folder."""
    root = os.environ.get("CROSSCLOUD_SPOOL") or os.path.join(os.environ.get("TMPDIR", "/tmp"), "crosscloud-spool")
    return Path(root) / plan.tenant / plan.run_id / cloud


def write_evaluation(home: ObjectStore, plan: Plan, global_: int, cloud: str, loss: float, error: str = "") -> None:
    """The held-out loss of a global, once, in the run's home store; a failed evaluation's NaN says why."""
    home.put_if_absent(plan.keys.evaluation(global_), json.dumps(
        {"global": global_, "cloud": cloud, "eval_loss": loss, "at": time.time(), **({"error": error} if error else {})}
    ).encode())
