"""The soak's recorder: what the deployment leaves behind (processes, stores, ledger, run records) as history events.

The checker (``crosscloud.soak.checker``) judges only the history, so this module turns what can be seen from
outside the deployment into its events; the harness (``bench/soak.py``) writes the runs, faults, capacities,
baselines and the history's end itself.

- Sub-tasks (``SubtaskLived``): a thread samples this machine's processes every ``interval_s``. An ssh cloud's
  sub-task runs with its working folder at ``<access.workdir>/subtasks/<tenant>/<run>/<cloud>``
  (``backends.ssh._folder``); every ``python ... -m ...`` process whose working folder is one of those belongs to
  that (run, cloud), a torchrun launcher and its workers alike. Its start is the earliest process's create time,
  its end the last sample that saw it alive (a stopped, SIGSTOPped, process is alive: it still holds its devices).
  Serving replicas (module ``crosscloud.serving.server``) reserve nothing in the ledger and are left out.
- Committed objects (``ObjectCommitted``, ``ObjectRetired``): a second thread lists each cloud's store under
  ``<tenant>/runs`` every ``commit_scan_s``; every object a new COMMIT.json names (its own and those it refers
  to), and the COMMIT.json itself, is committed once per store; an object whose every commit is gone again was
  retired (retention and a run's cleanup delete a step's COMMIT.json before its objects). A scan that meets a
  store error (the faults make outages) skips that cloud until the next scan; neither thread ever dies.
- ``finish``: the last scan, then a read of every committed object still vouched for (``ObjectObserved``;
  a store error is retried ``OBSERVE_TRIES`` times with backoff, then the object is observed missing and a
  problem is returned), the ledger's reservations of the runs (``ReservationHeld``; one that lapsed ends at
  its lease's lapse, reaped or not), each run's recorded rounds (``RoundSpent`` per member; a member whose work
  the round refused or lost spent it not kept), the clouds' globals (``GlobalCommitted``) and final loss
  (``FinalLoss``), the same for the baseline calibration a run starts itself (``<run>.baseline``, no final
  loss), and last the sub-tasks still alive (``SubtaskLived`` with ``end`` None).

Times: ``t`` is when the recorder saw it; a round's ``t`` is its record's ``published_at``.

Credentials: the recorder is no Airflow process, so the stores' Connections are not read; the driver sets, for
each cloud whose store names a ``connection_id``, ``CROSSCLOUD_<CLOUD>_<TENANT>_ACCESS_KEY_ID`` and
``..._SECRET_ACCESS_KEY`` (names upper-cased, every other character than letters and digits as ``_``: cloud
beijing, tenant team-a -> ``CROSSCLOUD_BEIJING_TEAM_A_ACCESS_KEY_ID``), as the multi-host test's operator does
(``crosscloud.store.credentials``). Without them ``Recorder(...)`` raises ``CredentialsError`` at once.
The processes must be readable by this one (the same user, or root): another user's working folder is not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psutil

from crosscloud.core.federation import Cloud, Federation
from crosscloud.core.keys import RunKeys, validate_name
from crosscloud.soak.history import (
    Event,
    FinalLoss,
    GlobalCommitted,
    History,
    ObjectCommitted,
    ObjectObserved,
    ObjectRetired,
    ReservationHeld,
    RoundSpent,
    SubtaskLived,
)
from crosscloud.store.base import ObjectNotFound, ObjectStore
from crosscloud.store.commit import COMMIT
from crosscloud.store.open_store import open_store

SCAN_DEADLINE_S = 5.0  # a store's retries within one scan: an outage skips the scan, not the next samples
OBSERVE_TRIES = 4  # reads of an object at the end before it is taken for missing (1, 2, 4 s between them)
SERVING_MODULE = "crosscloud.serving.server"
RETIRED = "its COMMIT.json was deleted (retention or the run's cleanup), which goes before its objects"
_NPROC = re.compile(r"--nproc[-_]per[-_]node(?:=(\d+))?$")
Log = Callable[[str], None]
Proc = tuple[int, float]  # (pid, create time): a pid used again is another process


@dataclass
class Seen:
    """The processes of one sub-task in one sample of this machine."""

    folder: str
    procs: set[Proc] = field(default_factory=set)
    start: float = math.inf
    nproc: int = 0  # the torchrun launcher's --nproc-per-node, 0 when none was seen
    serving: bool = False


@dataclass
class Life:
    """A sub-task from its first sample to its last."""

    run: str
    cloud: str
    devices: int
    start: float
    last: float
    procs: set[Proc]


@dataclass
class Committed:
    """A committed object of a store, and the steps whose COMMIT.json vouches for it now."""

    sha256: str
    size: int
    steps: set[str] = field(default_factory=set)


def subtask_roots(fed: Federation) -> list[str]:
    """The real paths of the ssh clouds' sub-task folders (``<workdir>/subtasks``) on this machine."""
    roots = {os.path.realpath(os.path.join(c.access.workdir, "subtasks"))
             for c in fed.clouds if c.access.method == "ssh" and c.access.workdir}
    return sorted(roots)


def _where(cwd: str | None, roots: list[str], tenant: str) -> tuple[str, str, str] | None:
    """(run, cloud, folder) of a working folder inside a sub-task folder of ``tenant``; None elsewhere."""
    if not cwd:
        return None
    for root in roots:
        if cwd.startswith(root + os.sep):
            parts = cwd[len(root) + 1:].split(os.sep)
            if len(parts) >= 3 and parts[0] == tenant:
                return parts[1], parts[2], os.path.join(root, *parts[:3])
    return None


def _runs_python_module(cmdline: list[str] | None) -> bool:
    """``python [...] -m module ...``: not the wrapper shell, whose ``-m`` is inside one ``-c`` string."""
    return bool(cmdline) and "python" in os.path.basename(cmdline[0]) and "-m" in cmdline[1:]


def _nproc(cmdline: list[str]) -> int:
    """torchrun's ``--nproc-per-node`` (``=N`` or a separate N), 0 when the command line has none."""
    for i, arg in enumerate(cmdline):
        m = _NPROC.match(arg)
        if m:
            value = m.group(1) or (cmdline[i + 1] if i + 1 < len(cmdline) else "")
            return int(value) if value.isdigit() else 0
    return 0


def find_subtasks(roots: list[str], tenant: str) -> dict[tuple[str, str], Seen]:
    """The sub-tasks of ``tenant`` running now, by (run, cloud); processes that vanish mid-scan are skipped."""
    found: dict[tuple[str, str], Seen] = {}
    if not roots:
        return found
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = proc.cmdline()
            if not _runs_python_module(cmdline):
                continue
            where = _where(proc.cwd(), roots, tenant)
            created = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if where is None:
            continue
        seen = found.setdefault(where[:2], Seen(where[2]))
        seen.procs.add((proc.pid, created))
        seen.start = min(seen.start, created)
        seen.nproc = max(seen.nproc, _nproc(cmdline))
        seen.serving = seen.serving or SERVING_MODULE in cmdline
    return found


def _handle_devices(folder: str) -> int | None:
    """The devices the sub-task's handle.json names (written just after the start: may not be there yet)."""
    try:
        with open(os.path.join(folder, "handle.json"), encoding="utf-8") as f:
            devices = json.load(f).get("devices")
    except (OSError, ValueError, AttributeError):
        return None
    return devices if isinstance(devices, int) and devices > 0 else None


def devices_of(seen: Seen) -> int:
    """A sub-task's devices: its launcher's ``--nproc-per-node`` (only a sub-task of several has one), else its
    handle's, else 1."""
    return seen.nproc or _handle_devices(seen.folder) or 1


def _impatient(cloud: Cloud) -> Cloud:
    """The cloud with its store's retries cut to ``SCAN_DEADLINE_S``: a scan during an outage gives up soon."""
    deadline = min(cloud.store.retry_deadline_s, SCAN_DEADLINE_S)
    return cloud.model_copy(update={"store": cloud.store.model_copy(update={"retry_deadline_s": deadline})})


def held_until(released_at: float | None, lease_expires_at: float | None, now: float) -> float | None:
    """When a reservation stopped holding its devices: its release, or its lease's lapse where that came first
    (reaped or not); None while it holds them."""
    lapsed = lease_expires_at if lease_expires_at is not None and lease_expires_at <= now else None
    ends = [e for e in (released_at, lapsed) if e is not None]
    return min(ends, default=None)


def _baseline_of(run: str) -> str | None:
    """The run id of ``run``'s baseline calibration (``pipeline.stages._baseline``); None where it is no valid id."""
    try:
        return validate_name(f"{run}.baseline", "run id")
    except ValueError:
        return None


def _json(store: ObjectStore, key: str):
    """An object of the store read as JSON; None when it is not there."""
    try:
        return json.loads(store.get(key))
    except ObjectNotFound:
        return None


def _sha256_of(store: ObjectStore, key: str) -> tuple[str, int]:
    """sha256 and size of an object as the store gives it now, read in chunks."""
    whole, size = hashlib.sha256(), 0
    for chunk in store.iter_chunks(key):
        whole.update(chunk)
        size += len(chunk)
    return whole.hexdigest(), size


class Recorder:
    """Records the sub-tasks, committed objects, reservations and rounds of ``tenant``'s runs into ``history``.

    ``lease_s`` is the deployment's lease (``CROSSCLOUD_LEASE_S``), written with each reservation. ``log`` gets
    what could not be seen for now (a store in an outage); by default this module's logger.
    """

    def __init__(self, history: History, fed: Federation, tenant: str, ledger_url: str, lease_s: float,
                 interval_s: float = 1.0, commit_scan_s: float = 10.0, log: Log | None = None):
        self.history, self.fed, self.tenant, self.ledger_url, self.lease_s = history, fed, tenant, ledger_url, lease_s
        self.interval_s, self.commit_scan_s = interval_s, commit_scan_s
        self.log = log or logging.getLogger(__name__).warning
        self.stores = {c.name: open_store(_impatient(c), tenant) for c in fed.clouds}
        self.roots = subtask_roots(fed)
        self.lives: dict[tuple[str, str], Life] = {}
        self.steps: dict[tuple[str, str], list[str]] = {}  # (cloud, step) seen committed -> the keys it vouches for
        self.objects: dict[tuple[str, str], Committed] = {}  # (cloud, key) -> committed and not retired
        self._sample_lock, self._scan_lock = threading.Lock(), threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- the threads ----------------------------------------------------------------------------
    def start(self) -> None:
        """Sample the sub-tasks every ``interval_s`` and scan the stores every ``commit_scan_s``, each in a daemon
        thread of its own (a scan waiting on a store in an outage never delays the samples)."""
        self._stop.clear()
        self._threads = [threading.Thread(target=self._every, args=(self.sample, self.interval_s), daemon=True,
                                          name="soak-record-subtasks"),
                         threading.Thread(target=self._every, args=(self.scan_commits, self.commit_scan_s),
                                          daemon=True, name="soak-record-commits")]
        for thread in self._threads:
            thread.start()

    def _every(self, step: Callable[[], None], every_s: float) -> None:
        """``step()`` every ``every_s`` until stopped; whatever it raises is logged and the next one comes."""
        while not self._stop.is_set():
            try:
                step()
            except Exception as exc:  # the recorder must outlive every fault it watches
                self.log(f"soak recorder: {getattr(step, '__name__', step)} failed: {exc!r}")
            self._stop.wait(every_s)

    def stop(self) -> None:
        """Stop both threads (a scan under way ends first: at most a store's ``SCAN_DEADLINE_S`` per request)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
            if thread.is_alive():
                self.log(f"soak recorder: {thread.name} still running after 120 s; finish waits for it")
        self._threads = []

    # -- sub-tasks --------------------------------------------------------------------------------
    def sample(self) -> None:
        """One look at this machine's processes: a sub-task gone (or started anew in its folder: none of its
        processes left) is written with its end, a new one is remembered."""
        found = {k: s for k, s in find_subtasks(self.roots, self.tenant).items() if not s.serving}
        now = time.time()
        with self._sample_lock:
            for key, life in list(self.lives.items()):
                seen = found.get(key)
                if seen is not None and seen.procs & life.procs:
                    life.last, life.procs = now, life.procs | seen.procs
                    continue
                del self.lives[key]
                self._lived(life, life.last)
            for key, seen in found.items():
                if key not in self.lives:
                    self.lives[key] = Life(key[0], key[1], devices_of(seen), seen.start, now, set(seen.procs))

    def _lived(self, life: Life, end: float | None) -> None:
        self.history.append(SubtaskLived(t=time.time(), run=life.run, cloud=life.cloud, devices=life.devices,
                                         start=life.start, end=end))

    # -- committed objects ------------------------------------------------------------------------
    def scan_commits(self) -> list[str]:
        """Scan every cloud's store once; returns the clouds whose scan failed (skipped until the next)."""
        failed = []
        for cloud, store in self.stores.items():
            try:
                self.scan_store(cloud, store)
            except Exception as exc:  # an outage, a 503, a full store: the next scan sees it
                self.log(f"soak recorder: commit scan of {cloud} skipped: {exc!r}")
                failed.append(cloud)
        return failed

    def scan_store(self, cloud: str, store: ObjectStore) -> None:
        """New commits of one store (their objects committed), and commits gone since (their objects retired)."""
        prefix, suffix = f"{self.tenant}/runs", "/" + COMMIT
        with self._scan_lock:
            listed = {k[:-len(suffix)] for k in store.list(prefix) if k.startswith(prefix + "/") and k.endswith(suffix)}
            for step in sorted(listed):
                if (cloud, step) not in self.steps:
                    self._committed(cloud, store, step)
            for c, step in [k for k in self.steps if k[0] == cloud and k[1] not in listed]:
                self._retire(cloud, step, self.steps.pop((c, step)))

    def _committed(self, cloud: str, store: ObjectStore, step: str) -> None:
        """Record a commit seen for the first time: its COMMIT.json and each object it names by key (artifacts,
        content-addressed and checked chunk by chunk by every reader, are no step's objects)."""
        key = f"{step}/{COMMIT}"
        try:
            raw = store.get(key)
        except ObjectNotFound:
            return  # deleted since the listing: never seen committed
        try:
            entries = [(e["key"], str(e["sha256"]), int(e["size"])) for e in json.loads(raw)["objects"].values()
                       if isinstance(e, dict) and "artifact" not in e]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # judged once: never read again
            self.log(f"soak recorder: {cloud}: unreadable commit {key}: {exc!r}")
            entries = []
        now = time.time()
        for name, sha, size in [(key, hashlib.sha256(raw).hexdigest(), len(raw)), *entries]:
            self._object(cloud, step, name, sha, size, now)
        self.steps[(cloud, step)] = [key] + [e[0] for e in entries]

    def _object(self, cloud: str, step: str, key: str, sha: str, size: int, t: float) -> None:
        """One object vouched for by ``step``: written once per store, and again only if a commit names it with
        other content (which the checker then finds)."""
        known = self.objects.get((cloud, key))
        if known is None or (known.sha256, known.size) != (sha, size):
            self.history.append(ObjectCommitted(t=t, store=cloud, key=key, sha256=sha, size=size))
        if known is None:
            known = self.objects[(cloud, key)] = Committed(sha, size)
        known.steps.add(step)

    def _retire(self, cloud: str, step: str, keys: Iterable[str], why: str = RETIRED) -> None:
        """The step's commit is gone: each of its objects no other live commit vouches for is retired."""
        now = time.time()
        for key in keys:
            known = self.objects.get((cloud, key))
            if known is None:
                continue
            known.steps.discard(step)
            if not known.steps:
                del self.objects[(cloud, key)]
                self.history.append(ObjectRetired(t=now, store=cloud, key=key, why=why))

    # -- the end ----------------------------------------------------------------------------------
    def finish(self, runs: Mapping[str, str]) -> list[str]:
        """After ``stop``: the final observations of ``runs`` (run id -> its job's name); returns what could not be
        recorded (each a line), empty when everything was. A run's baseline calibration (``<run>.baseline``, which
        the run starts itself) is recorded like its run, without a final loss."""
        problems: list[str] = []
        failed = self.scan_commits()
        for attempt in range(1, OBSERVE_TRIES):
            if not failed:
                break
            time.sleep(2 ** (attempt - 1))
            failed = [c for c in failed if c not in self._rescan(c)]
        problems += [f"the last commit scan of {c} failed {OBSERVE_TRIES} times" for c in failed]
        problems += self.observe_all()
        jobs = {**{b: None for r in runs if (b := _baseline_of(r))}, **runs}
        problems += self._guarded("reservations", lambda: self.reservations(jobs))
        for run, job in jobs.items():
            problems += self._guarded(f"run {run}", lambda run=run, job=job: self.run_outcome(run, job))
        try:
            self.sample()  # the sub-tasks that ended since the last sample, with their ends
        except Exception as exc:
            problems.append(f"the last sample of the sub-tasks failed: {exc!r}")
        with self._sample_lock:
            for life in self.lives.values():
                self._lived(life, None)
            self.lives.clear()
        for problem in problems:
            self.log(f"soak recorder: {problem}")
        return problems

    def _rescan(self, cloud: str) -> list[str]:
        """[] when a scan of ``cloud`` succeeded, else [cloud]."""
        try:
            self.scan_store(cloud, self.stores[cloud])
            return []
        except Exception as exc:
            self.log(f"soak recorder: commit scan of {cloud} failed again: {exc!r}")
            return [cloud]

    def _guarded(self, what: str, part: Callable[[], tuple[list[Event], list[str]]]) -> list[str]:
        """One part of ``finish``: its reads tried ``OBSERVE_TRIES`` times (the ledger or a store may be
        restarting), then its events written all at once (a retry never writes one twice); its problems."""
        for attempt in range(OBSERVE_TRIES):
            try:
                events, problems = part()
                break
            except Exception as exc:
                error = exc
                if attempt < OBSERVE_TRIES - 1:
                    time.sleep(2 ** attempt)
        else:
            return [f"{what}: not recorded: {error!r}"]
        for event in events:
            self.history.append(event)
        return [f"{what}: {p}" for p in problems]

    def observe_all(self) -> list[str]:
        """Read every committed object still vouched for; problems for the reads that never succeeded."""
        problems = []
        with self._scan_lock:
            for (cloud, key) in sorted(self.objects):
                if (cloud, key) in self.objects:  # retired meanwhile, with another object of its step
                    problems += self._observe(cloud, key)
        return problems

    def _observe(self, cloud: str, key: str) -> list[str]:
        """One object's observation. Missing, it is checked against its commits first: where each of them is gone
        too, it was retired (retention ran after the last scan), not lost."""
        store, error = self.stores[cloud], None
        for attempt in range(OBSERVE_TRIES):
            try:
                sha, size = _sha256_of(store, key)
                self.history.append(ObjectObserved(t=time.time(), store=cloud, key=key, sha256=sha, size=size))
                return []
            except ObjectNotFound:
                try:
                    return self._missing(cloud, store, key)
                except Exception as exc:
                    error = exc
            except Exception as exc:
                error = exc
            if attempt < OBSERVE_TRIES - 1:
                time.sleep(2 ** attempt)
        self.history.append(ObjectObserved(t=time.time(), store=cloud, key=key, sha256=None, size=None))
        return [f"{cloud}/{key}: observed missing after {OBSERVE_TRIES} failed reads: {error!r}"]

    def _missing(self, cloud: str, store: ObjectStore, key: str) -> list[str]:
        """A missing object: retired with the commits that are gone, observed missing if one still vouches for it."""
        steps = sorted(self.objects[(cloud, key)].steps)
        gone = [s for s in steps if not store.exists(f"{s}/{COMMIT}")]
        for step in gone:
            self._retire(cloud, step, self.steps.pop((cloud, step), []))
        if (cloud, key) in self.objects:
            self.history.append(ObjectObserved(t=time.time(), store=cloud, key=key, sha256=None, size=None))
        return []

    def reservations(self, runs: Iterable[str]) -> tuple[list[Event], list[str]]:
        """The ledger's reservations of ``runs``: held from ``created_at`` until released, or until the lease
        lapsed where that came first (a lapsed reservation holds nothing, reaped or not: ``ledger._live``)."""
        import sqlalchemy as sa

        from crosscloud.ledger.engine import engine_for, read
        from crosscloud.ledger.schema import reservations
        from crosscloud.ledger.url import ledger_url

        R = reservations.c
        query = (sa.select(R.run_id, R.cloud, R.devices, R.created_at, R.released_at, R.lease_expires_at)
                 .where(R.tenant == self.tenant, R.run_id.in_(list(runs))).order_by(R.id))
        with read(engine_for(ledger_url(self.ledger_url))) as db:
            rows = db.execute(query).all()
        now = time.time()
        return [ReservationHeld(t=now, run=row.run_id, cloud=row.cloud, devices=row.devices, start=row.created_at,
                                end=held_until(row.released_at, row.lease_expires_at, now), lease_s=self.lease_s)
                for row in rows], []

    def run_outcome(self, run: str, job: str | None) -> tuple[list[Event], list[str]]:
        """A run's rounds and the globals its clouds made, from the home store's records, and its final loss
        when ``job`` is given. A run that never planned has none of them."""
        from crosscloud.run.plan import Plan

        home, keys = self.stores[self.fed.local_cloud.name], RunKeys(self.tenant, run)
        try:
            plan = Plan.load(home, self.tenant, run)
        except ObjectNotFound:
            return [], []
        devices = {c.name: c.devices for c in plan.clouds}
        events: list[Event] = []
        done: set[int] = set()
        for record in _json(home, keys.history) or []:
            if record["round"] not in done:  # a round recorded twice was spent once
                done.add(record["round"])
                events += self._round(run, keys, record, devices)
        summary = _json(home, keys.summary)
        if job is None or summary is None:  # a run that did not complete has no final loss
            return events, []
        loss = (summary.get("metrics") or {}).get("final_eval_loss")
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return events, [f"its summary's final_eval_loss is {loss!r}: no final loss recorded"]
        return events + [FinalLoss(t=time.time(), run=run, job=job, loss=float(loss))], []

    def _round(self, run: str, keys: RunKeys, record: dict, devices: dict[str, int]) -> list[Event]:
        """One round's record: each member's device time (not kept where the round refused or lost the cloud's
        work) and each member's global."""
        r, end = record["round"], float(record["published_at"])
        start = end - float(record["wall_s"])
        wasted = set(record.get("refused") or {}) | set(record.get("lost") or {})
        spent = [RoundSpent(t=end, run=run, cloud=cloud, round=r, devices=devices.get(cloud, 0), start=start, end=end,
                            kept=cloud not in wasted) for cloud in sorted(record.get("clouds") or {})]
        now = time.time()
        return spent + [GlobalCommitted(t=now, run=run, round=r, cloud=cloud, digest=digest)
                        for cloud, digest in sorted(self.digests(keys, r, record).items())]

    def digests(self, keys: RunKeys, r: int, record: dict) -> dict[str, str]:
        """Each member's digest of global ``r + 1`` as ``bench/faults.py`` ``Bench.outcomes`` finds it: reported
        with its next round's contribution, else in its own commit of the global, else in the round's record."""
        home = self.stores[self.fed.local_cloud.name]
        later = (_json(home, keys.members(r + 1)) or {}).get("contributions") or {}
        found = {}
        for cloud in sorted(record.get("clouds") or {}):
            made = ((later.get(cloud) or {}).get("meta") or {}).get("exchange") or {}
            if not made.get("digest") and cloud in self.stores:
                made = (_json(self.stores[cloud], f"{keys.global_step(r + 1)}/{COMMIT}") or {}).get("meta") or {}
            digest = made.get("digest") or (record.get("digests") or {}).get(cloud)
            if digest:
                found[cloud] = digest
        return found
