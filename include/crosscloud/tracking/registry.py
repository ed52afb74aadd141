"""The MLflow model registry: every cross-cloud run's final model, with where it came from.

A run's final weights (safetensors) and its plan are logged under ``model/``
of its MLflow parent run and registered as a new version of
``crosscloud-<tenant>-<model size>`` (one name per architecture, so any version
can continue any other). The version's tags are its lineage: the run, the DAG
run, the clouds, the plan's digest, the digests of the data shards, the held-out
set and the initial weights, and the model it was retrained from. The alias
``champion`` marks the version serving; ``retrain`` moves it only to a better
model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from crosscloud.store.digest import sha256

CHAMPION = "champion"
MODEL_FILE = "model.safetensors"


def model_name(tenant: str, model_size: str) -> str:
    return f"crosscloud-{tenant}-{model_size}"


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
        "crosscloud.init_sha256": plan.init.sha256,
        "crosscloud.final_eval_loss": f"{summary['metrics']['final_eval_loss']:.6f}",
    }
    # the DAG and DAG run that trained it, and the version it was retrained from, as the run was tagged
    tags.update({k: v for k, v in run_tags.items() if k.startswith("airflow.") or k == "crosscloud.parent_model"})
    return tags


def register(client, plan, summary: dict, weights: bytes) -> dict:
    """Log the final weights and plan to the run's parent and register them; returns name, version and source."""
    from mlflow.exceptions import MlflowException

    parent = plan.tracking["parent_run_id"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        folder.mkdir()
        (folder / MODEL_FILE).write_bytes(weights)
        (folder / "plan.json").write_text(plan.model_dump_json(indent=2))
        client.log_artifacts(parent, str(folder), "model")
    name = model_name(plan.tenant, plan.spec.model_size)
    try:
        client.create_registered_model(name, description="crosscloud: final models of cross-cloud runs, with lineage tags")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    run = client.get_run(parent)
    source = f"{run.info.artifact_uri}/model"
    version = client.create_model_version(name, source, run_id=parent, tags=lineage(plan, summary, run.data.tags))
    return {"name": name, "version": int(version.version), "source": source}


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


def weights(client, version) -> bytes:
    """The safetensors bytes of a registered version."""
    from mlflow.artifacts import download_artifacts

    with tempfile.TemporaryDirectory() as tmp:
        path = download_artifacts(artifact_uri=f"{version.source}/{MODEL_FILE}", dst_path=tmp)
        return Path(path).read_bytes()
