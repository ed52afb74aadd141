"""What a run reads, put where its clouds can fetch it: the program, the dataset, the initial model.

Everything is a content-addressed blob: the program's code and the initial
model on the local cloud, the training shards on the dataset's home cloud (within
its residency), the held-out files on the local cloud where evaluation runs.
Preheat then copies to each cloud only the bytes it lacks.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import NamedTuple

from crosscloud.core.federation import Dataset, Federation
from crosscloud.core.job import DEFAULT_DATASET, JobSpec
from crosscloud.run.plan import ProgramRef
from crosscloud.store.base import ObjectStore
from crosscloud.store.chunks import BlobRef, ChunkIndex, put_blob
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes, to_bytes
from crosscloud.training.corpus import build_corpus
from crosscloud.training.program import ProgramError, load_program, program_family, program_source
from crosscloud.training.session import load_params, parameters


class RunInputs(NamedTuple):
    """What a run reads: the dataset's shards, its held-out files, the initial model and the program."""

    shards: list[BlobRef]
    held_out: list[BlobRef]
    init: BlobRef
    program: ProgramRef
    shard_names: list[str]
    held_out_names: list[str]


class LoadedProgram(NamedTuple):
    module: ModuleType
    ref_name: str
    file: str
    code: bytes
    family: str
    dataset: str  # the dataset it reads unless the job names one (its DATASET)


def load_job_program(spec: JobSpec) -> LoadedProgram:
    """The job's program, imported here to check it and to read its family before anything is admitted."""
    path = program_source(spec.program)
    module = load_program(path, spec.program)
    return LoadedProgram(module, spec.program, path.name, path.read_bytes(), program_family(module, spec.program),
                         getattr(module, "DATASET", DEFAULT_DATASET))


def _prepared(fed: Federation, tenant: str, ds: Dataset) -> None:
    """Run a files dataset's ``prepare`` script and put what it wrote in the home store: its first use."""
    with tempfile.TemporaryDirectory(prefix=f"prepare-{ds.name}-") as out:
        script = program_source(ds.prepare)
        done = subprocess.run([sys.executable, str(script), "--out", out], capture_output=True, text=True)
        if done.returncode != 0:
            raise ProgramError(f"dataset {ds.name}: {ds.prepare} --out {out} failed ({done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        upload_dataset(fed, tenant, ds.name, Path(out))


def _files(store: ObjectStore, tenant: str, prefix: str, what: str, ds: Dataset) -> list[tuple[str, bytes]]:
    root = f"{tenant}/{prefix.strip('/')}/"
    keys = sorted(k for k in store.list(root.rstrip("/")) if k.startswith(root) and not k.endswith("/"))
    if not keys:
        raise ProgramError(f"dataset {ds.name}: no {what} files under {root} in the store of cloud {ds.home} "
                           f"(put them there first, e.g. crosscloud dataset put {ds.name} FOLDER)")
    return [(PurePosixPath(k).name, store.get(k)) for k in keys]


def dataset_files(fed: Federation, spec: JobSpec) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """(training shards, held-out files) as (name, bytes): built from the stdlib, or read from the home store."""
    ds = fed.dataset(spec.dataset)
    if ds.source == "python-stdlib":
        shards, held_out = build_corpus(ds.shards, spec.seed)
        return [(f"shard-{i:03d}.bin", s) for i, s in enumerate(shards)], [("held-out-000.bin", held_out)]
    home = open_store(fed.cloud(ds.home), spec.tenant)
    if ds.prepare and not home.list(f"{spec.tenant}/{ds.prefix.strip('/')}"):
        _prepared(fed, spec.tenant, ds)
    return _files(home, spec.tenant, ds.prefix, "training", ds), _files(home, spec.tenant, ds.eval_prefix, "held-out", ds)


def materialize_inputs(fed: Federation, spec: JobSpec, program: LoadedProgram, init: bytes | None = None) -> RunInputs:
    """Store the run's inputs as blobs; ``init`` (safetensors) starts from given weights, checked against the program's model."""
    ds = fed.dataset(spec.dataset)
    train, held = dataset_files(fed, spec)
    data_home = open_store(fed.cloud(ds.home), spec.tenant)
    index = ChunkIndex(data_home, spec.tenant)
    shard_refs = [put_blob(data_home, spec.tenant, data, kind="dataset", index=index, residency=ds.residency)[0]
                  for _, data in train]
    home = open_store(fed.local_cloud, spec.tenant)
    held_refs = [put_blob(home, spec.tenant, data, kind="dataset", residency=ds.residency)[0] for _, data in held]
    model = program.module.build_model(spec.program_run_args())
    if init is not None:
        load_params(model, from_bytes(init))  # raises, naming the tensors, when they do not fit the program's model
    init_ref, _ = put_blob(home, spec.tenant, to_bytes({n: p.detach() for n, p in parameters(model).items()}), kind="model")
    code_ref, _ = put_blob(home, spec.tenant, program.code, kind="program")
    ref = ProgramRef(name=program.ref_name, file=program.file, code=code_ref, family=program.family)
    return RunInputs(shard_refs, held_refs, init_ref, ref, [n for n, _ in train], [n for n, _ in held])


def upload_dataset(fed: Federation, tenant: str, name: str, folder: Path) -> dict:
    """Put ``folder/train/*`` and ``folder/val/*`` under a files dataset's prefixes in its home cloud's store."""
    ds = fed.dataset(name)
    if ds.source != "files":
        raise ProgramError(f"dataset {name} is built from {ds.source}, not put from files")
    store, sent = open_store(fed.cloud(ds.home), tenant), {"cloud": ds.home, "files": 0, "bytes": 0}
    for sub, prefix in (("train", ds.prefix), ("val", ds.eval_prefix)):
        files = sorted(p for p in (folder / sub).glob("*") if p.is_file())
        if not files:
            raise ProgramError(f"dataset {name}: {folder / sub} holds no files")
        for path in files:
            data = path.read_bytes()
            store.put(f"{tenant}/{prefix.strip('/')}/{path.name}", data)
            sent["files"] += 1
            sent["bytes"] += len(data)
    return sent
