"""The MLflow model registry: every cross-cloud run's final model, with where it came from.

A run's final weights (safetensors) and its plan are logged under ``model/``
of its MLflow parent run and registered as a new version of the program's own
model, ``crosscloud-<tenant>-<name>``: the name is the program's ``MODEL_NAME``
(or ``model_name(args)``), else its file's stem and family
(``training.program.program_model_name``). Plans written before names were per
program register under the old ``crosscloud-<tenant>-<model size>``, which
stays readable. Every version records its program (digest and arguments) and
its architecture (``store.header``); a version of another architecture than the
name's champion is refused, so any version can continue any other. The
version's other tags are its lineage: the run, the DAG run, the clouds, the
plan's digest, the digests of the data shards, the held-out set and the initial
weights, and the model it was retrained from. The alias ``champion`` marks the
version serving; ``retrain`` moves it only to a better model.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

from crosscloud.store import header
from crosscloud.store.digest import sha256

CHAMPION = "champion"
MODEL_FILE = "model.safetensors"
ARCHITECTURE, PARAMETERS = "crosscloud.architecture", "crosscloud.parameters"


class RegistryMismatch(ValueError):
    """A version that would sit under a name whose champion is another architecture."""


def model_name(tenant: str, name: str) -> str:
    """The registered name of the tenant's model ``name`` (a program's model name, or an old byte-LM preset)."""
    return f"crosscloud-{tenant}-{name}"


def plan_model_name(plan) -> str:
    """Where the run's final model is registered: its program's model, or the old name by preset for a plan
    written before models were named per program."""
    own = plan.program.model if plan.program is not None else ""
    return model_name(plan.tenant, own or plan.spec.model_size)


def check_architecture(client, name: str, architecture: str, what: str) -> None:
    """Refuse ``what`` (a run to register, a version to serve) when the champion of ``name`` (else its newest
    version) records another architecture; a name with no version, or versions from before architectures were
    recorded, takes any."""
    current, role = champion(client, name), "champion"
    if current is None:
        current, role = latest(client, name), "newest"
    theirs = current.tags.get(ARCHITECTURE) if current is not None else None
    if theirs is None or theirs == architecture:
        return
    program = current.tags.get("crosscloud.program", "an unrecorded program")
    raise RegistryMismatch(
        f"{what} is refused: {name} version {current.version} (its {role}, "
        f"from {program} with arguments {current.tags.get('crosscloud.program_args', '{}')}, "
        f"{int(current.tags.get(PARAMETERS, 0)):,} parameters) is architecture {theirs}, and this one is "
        f"{architecture}: versions of one registered model must continue each other. Give the program its own "
        "MODEL_NAME (or model_name(args)) for a new registered model (docs/programs.md#names-and-versions)")


def lineage(plan, summary: dict, run_tags: dict[str, str]) -> dict[str, str]:
    """The tags that say where a model version came from."""
    tags = {
        "crosscloud.run_id": plan.run_id,
        "crosscloud.tenant": plan.tenant,
        "crosscloud.clouds": ",".join(f"{c.name}:{c.share}" for c in plan.clouds),
        "crosscloud.plan_sha256": sha256(plan.model_dump_json(indent=2).encode()),
        "crosscloud.dataset": plan.dataset,
        "crosscloud.data_sha256": ",".join(s.sha256 for s in plan.shards),
        "crosscloud.held_out_sha256": ",".join(h.sha256 for h in plan.held_out),
        "crosscloud.init_sha256": summary.get("init_sha256") or (plan.init.sha256 if plan.init else ""),
        "crosscloud.final_eval_loss": f"{summary['metrics']['final_eval_loss']:.6f}",
        "crosscloud.program_args": json.dumps(plan.spec.program_run_args(), sort_keys=True),
    }
    if plan.program is not None:
        tags.update({"crosscloud.program": plan.program.name, "crosscloud.program_sha256": plan.program.code.sha256})
    # the DAG and DAG run that trained it, and the version it was retrained from, as the run was tagged
    tags.update({k: v for k, v in run_tags.items() if k.startswith("airflow.") or k == "crosscloud.parent_model"})
    return tags


def register(client, plan, summary: dict, weights: Iterable[bytes]) -> dict:
    """Log the final weights (a stream of chunks, written to a file as they come: never whole in memory) and the
    plan to the run's parent and register them; returns name, version and source. A model of another
    architecture than the name's champion is refused before anything is logged."""
    from mlflow.exceptions import MlflowException

    name, parent = plan_model_name(plan), plan.tracking["parent_run_id"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        folder.mkdir()
        digest, arch = _write(folder / MODEL_FILE, weights)
        check_architecture(client, name, arch[0], f"registering run {plan.run_id}")
        (folder / "plan.json").write_text(plan.model_dump_json(indent=2))
        client.log_artifacts(parent, str(folder), "model")
    try:
        client.create_registered_model(name, description="crosscloud: final models of cross-cloud runs, with lineage tags")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    run = client.get_run(parent)
    source = f"{run.info.artifact_uri}/model"
    tags = {**lineage(plan, summary, run.data.tags), "crosscloud.model_sha256": digest,
            ARCHITECTURE: arch[0], PARAMETERS: str(arch[1])}
    version = client.create_model_version(name, source, run_id=parent, tags=tags)
    return {"name": name, "version": int(version.version), "source": source}


def _write(path: Path, chunks: Iterable[bytes]) -> tuple[str, tuple[str, int]]:
    """Write the chunks to ``path``; their sha256, and the architecture and parameter count of the safetensors
    file they make (read back from its header alone)."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            digest.update(chunk)
    head = header.file_prefix(path)
    return digest.hexdigest(), (header.architecture(head), header.parameters(head))


def latest(client, name: str):
    """The newest version of ``name``, or None when none is registered."""
    versions = client.search_model_versions(f"name = '{name}'")
    return max(versions, key=lambda v: int(v.version), default=None)


def champion(client, name: str):
    """The version under the alias ``champion``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def promote(client, name: str, version: int) -> None:
    client.set_registered_model_alias(name, CHAMPION, str(version))


def download(version, folder: str) -> str:
    """The path of a registered version's safetensors file, downloaded into ``folder`` (streamed to disk)."""
    from mlflow.artifacts import download_artifacts

    return download_artifacts(artifact_uri=f"{version.source}/{MODEL_FILE}", dst_path=folder)


def weights(client, version) -> bytes:
    """The safetensors bytes of a registered version (serving's small models; a trainer streams ``download``)."""
    with tempfile.TemporaryDirectory() as tmp:
        return Path(download(version, tmp)).read_bytes()
