"""What a run reads, put where its clouds can fetch it: the program, the dataset, the initial model.

Everything is a content-addressed blob: the program's code and the weights a
retrain starts from on the local cloud (a fresh run's global 0 is built by its
home cloud), the training shards on the dataset's home cloud (within
its residency), the held-out files on the local cloud where evaluation runs.
Preheat then copies to each cloud only the bytes it lacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from functools import partial
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from crosscloud.core.federation import Dataset, Federation
from crosscloud.core.job import JobSpec
from crosscloud.run.plan import ProgramRef
from crosscloud.store.base import ObjectStore
from crosscloud.store.chunks import BlobRef, ChunkIndex, put_blob, put_blob_stream
from crosscloud.store.header import Layout, count, fingerprint
from crosscloud.store.open_store import open_store
from crosscloud.training.corpus import build_corpus
from crosscloud.training.program import ProgramError, program_source


class RunInputs(NamedTuple):
    """What a run reads: the dataset's shards, its held-out files, the initial model and the program."""

    shards: list[BlobRef]
    held_out: list[BlobRef]
    init: BlobRef | None  # None: global 0 is built by the home cloud's sub-task
    program: ProgramRef
    shard_names: list[str]
    held_out_names: list[str]


class LoadedProgram(NamedTuple):
    ref_name: str
    file: str
    code: bytes
    family: str
    dataset: str  # the dataset it reads unless the job names one (its DATASET)
    model_name: str  # what its models are registered as, under the tenant
    tensors: Layout | None  # its model, described on the meta device; None: only its cloud can build it
    declared: dict | None  # what it says its model costs: figures(args), or FIGURES

    @property
    def architecture(self) -> str:
        return fingerprint(self.tensors) if self.tensors is not None else ""

    @property
    def parameters(self) -> int:
        return count(self.tensors) if self.tensors is not None else 0


class ArchitectureMismatch(ProgramError):
    """Weights to start from (a registered version) that the program's model cannot continue."""


def load_job_program(spec: JobSpec) -> LoadedProgram:
    """The job's program, checked and described by a child process (``training.describe``) before anything is
    admitted: this process imports neither the program nor torch."""
    path = program_source(spec.program)
    done = subprocess.run([sys.executable, "-m", "crosscloud.training.describe", "--path", str(path), "--label",
                           spec.program, "--args", json.dumps(spec.program_run_args())],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _python_path()})
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ProgramError(f"program {spec.program} could not be described (exit {done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if "error" in out:
        raise ProgramError(out["error"])
    tensors = [(n, d, list(shape)) for n, d, shape in out["tensors"]] if out["tensors"] is not None else None
    return LoadedProgram(spec.program, path.name, path.read_bytes(), out["family"], out["dataset"],
                         out["model_name"], tensors, out["declared"])


def _python_path() -> str:
    """This process's import path, so the child finds what it found (the package, a program's package.module)."""
    return os.pathsep.join(p for p in sys.path if p)


def _prepared(fed: Federation, tenant: str, ds: Dataset) -> None:
    """Run a files dataset's ``prepare`` script and put what it wrote in the home store: its first use."""
    with tempfile.TemporaryDirectory(prefix=f"prepare-{ds.name}-") as out:
        script = program_source(ds.prepare)
        done = subprocess.run([sys.executable, str(script), "--out", out], capture_output=True, text=True)
        if done.returncode != 0:
            raise ProgramError(f"dataset {ds.name}: {ds.prepare} --out {out} failed ({done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        upload_dataset(fed, tenant, ds.name, Path(out))


class DataFile(NamedTuple):
    """One file of a run's dataset: its name and how to read it as a stream of blocks (never whole)."""

    name: str
    blocks: Callable[[], Iterable[bytes]]


def _files(store: ObjectStore, tenant: str, prefix: str, what: str, ds: Dataset) -> list[DataFile]:
    root = f"{tenant}/{prefix.strip('/')}/"
    keys = sorted(k for k in store.list(root.rstrip("/")) if k.startswith(root) and not k.endswith("/"))
    if not keys:
        raise ProgramError(f"dataset {ds.name}: no {what} files under {root} in the store of cloud {ds.home} "
                           f"(put them there first, e.g. crosscloud dataset put {ds.name} FOLDER)")
    return [DataFile(PurePosixPath(k).name, partial(store.iter_chunks, k)) for k in keys]


def dataset_files(fed: Federation, spec: JobSpec) -> tuple[list[DataFile], list[DataFile]]:
    """(training shards, held-out files): built from the stdlib, or read from the home store as streams."""
    ds = fed.dataset(spec.dataset)
    if ds.source == "python-stdlib":
        shards, held_out = build_corpus(ds.shards, spec.seed)
        return ([DataFile(f"shard-{i:03d}.bin", partial(iter, [s])) for i, s in enumerate(shards)],
                [DataFile("held-out-000.bin", partial(iter, [held_out]))])
    home = open_store(fed.cloud(ds.home), spec.tenant)
    if ds.prepare and not home.list(f"{spec.tenant}/{ds.prefix.strip('/')}"):
        _prepared(fed, spec.tenant, ds)
    return _files(home, spec.tenant, ds.prefix, "training", ds), _files(home, spec.tenant, ds.eval_prefix, "held-out", ds)


@dataclass(frozen=True)
class StartFrom:
    """Weights a run starts from instead of the program's seed (a retrain: the registered version), already a blob
    in the local cloud's store, with its architecture read from its header."""

    ref: BlobRef
    architecture: str
    parameters: int
    label: str  # whose weights, for messages: "registered crosscloud-team-a-gru/3"


def _check_continues(program: LoadedProgram, init: StartFrom) -> None:
    """Refuse, before anything is reserved, weights whose architecture the program's model is not."""
    if program.architecture and init.architecture != program.architecture:
        raise ArchitectureMismatch(
            f"program {program.ref_name} cannot continue {init.label}: its model is another architecture "
            f"({init.parameters:,} parameters, architecture {init.architecture}) than the program builds "
            f"({program.parameters:,} parameters, architecture {program.architecture}); retraining across "
            "architectures is refused. Give the program its own MODEL_NAME to start a new registered model "
            "(docs/programs.md#names-and-versions)")


def materialize_inputs(fed: Federation, spec: JobSpec, program: LoadedProgram,
                       init: StartFrom | None = None) -> RunInputs:
    """Store the run's data and program as blobs and describe its model (on the meta device: nothing model-sized
    is built here). Global 0 is ``init``'s weights, checked against the program's model, or else the model the
    home cloud's sub-task builds."""
    ds = fed.dataset(spec.dataset)
    train, held = dataset_files(fed, spec)
    data_home = open_store(fed.cloud(ds.home), spec.tenant)
    index = ChunkIndex(data_home, spec.tenant)
    shard_refs = [put_blob_stream(data_home, spec.tenant, f.blocks(), kind="dataset", index=index,
                                  residency=ds.residency)[0] for f in train]
    home = open_store(fed.local_cloud, spec.tenant)
    held_refs = [put_blob_stream(home, spec.tenant, f.blocks(), kind="dataset", residency=ds.residency)[0]
                 for f in held]
    if init is not None:
        _check_continues(program, init)
    code_ref, _ = put_blob(home, spec.tenant, program.code, kind="program")
    ref = ProgramRef(name=program.ref_name, file=program.file, code=code_ref, family=program.family,
                     model=program.model_name, architecture=program.architecture, parameters=program.parameters)
    return RunInputs(shard_refs, held_refs, init.ref if init else None, ref, [f.name for f in train],
                     [f.name for f in held])


def upload_dataset(fed: Federation, tenant: str, name: str, folder: Path) -> dict:
    """Put ``folder/train/*`` and ``folder/val/*`` under a files dataset's prefixes in its home cloud's store, each
    file streamed; the put replaces the dataset as a whole: files of an earlier put that this one lacks are
    deleted once the new ones are in, so no run trains on a leftover."""
    ds = fed.dataset(name)
    if ds.source != "files":
        raise ProgramError(f"dataset {name} is built from {ds.source}, not put from files")
    parts = [(prefix, sorted(p for p in (folder / sub).glob("*") if p.is_file()))
             for sub, prefix in (("train", ds.prefix), ("val", ds.eval_prefix))]
    for (prefix, files), sub in zip(parts, ("train", "val")):
        if not files:
            raise ProgramError(f"dataset {name}: {folder / sub} holds no files")
    store, sent = open_store(fed.cloud(ds.home), tenant), {"cloud": ds.home, "files": 0, "bytes": 0, "removed": 0}
    for prefix, files in parts:
        root = f"{tenant}/{prefix.strip('/')}/"
        for path in files:
            with open(path, "rb") as f:
                store.put_stream(root + path.name, f)
            sent["files"] += 1
            sent["bytes"] += path.stat().st_size
        kept = {root + p.name for p in files}
        for key in store.list(root.rstrip("/")):
            if key.startswith(root) and key not in kept:
                store.delete(key)
                sent["removed"] += 1
    return sent
