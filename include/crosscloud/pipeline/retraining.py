"""Retraining: continue the latest registered model on the current data, and promote it only if it is better.

``retrain`` starts a cross-cloud run from the tenant's registered model: the
``champion`` version, else the newest version (a rejected retrain is not
continued while a better champion exists), or from the seed when none is
registered yet; the run
registers its final model as a new version (``registry.register``).
``decide`` then measures the current champion on the held-out set of that
run, the same bytes the new model's ``final_eval_loss`` was measured on, and
moves the ``champion`` alias to the new version only when its loss is lower.
"""

from __future__ import annotations

from crosscloud.core.federation import federation_path as resolve_federation_path
from crosscloud.core.federation import read_federation
from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import Log, RunRef, run_job
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes
from crosscloud.tracking import registry
from crosscloud.tracking.mlflow_runs import Tracker
from crosscloud.training.evaluation import Evaluator


def retrain(spec: JobSpec, run_id: str, experiment: str, federation_path: str | None = None,
            tags: dict[str, str] | None = None, log: Log = print) -> dict:
    """Train from the tenant's champion (else latest) registered model; returns the run and the new version."""
    client = Tracker().client
    name = registry.model_name(spec.tenant, spec.model_size)
    base = registry.champion(client, name) or registry.latest(client, name)
    init = registry.weights(client, base) if base else None
    log(f"retraining {name} from {f'version {base.version}' if base else 'scratch (no registered version yet)'}")
    lineage = {"crosscloud.parent_model": f"{name}/{base.version}"} if base else {}
    path = str(resolve_federation_path(federation_path))
    digest = read_federation(path)[1]  # what the later tasks, on any host, check theirs against
    summary = run_job(spec, run_id, path, experiment, log=log, compare_baseline=False, tags={**(tags or {}), **lineage},
                      init=init)
    return {"run": RunRef(path, spec.tenant, run_id, digest).to_dict(), "model": summary["model"],
            "final_eval_loss": summary["metrics"]["final_eval_loss"], "retrained_from": int(base.version) if base else None}


def held_out_loss(ref: RunRef, weights: bytes) -> float:
    """Eval loss of ``weights`` on the held-out set of run ``ref``."""
    fed, plan = ref.load()
    return Evaluator(plan, open_store(fed.local_cloud, plan.tenant), fed.local_cloud.name)(from_bytes(weights))


def decide(result: dict) -> dict:
    """Promote the retrained version to ``champion`` only if it beats the champion on the same held-out set."""
    client = Tracker().client
    name, version, new_loss = result["model"]["name"], result["model"]["version"], result["final_eval_loss"]
    current = registry.champion(client, name)
    champion_loss = held_out_loss(RunRef(**result["run"]), registry.weights(client, current)) if current else None
    promoted = champion_loss is None or new_loss < champion_loss
    if promoted:
        registry.promote(client, name, version)
    client.set_model_version_tag(name, str(version), "crosscloud.promoted", str(promoted).lower())
    if champion_loss is not None:
        client.set_model_version_tag(name, str(version), "crosscloud.champion_eval_loss", f"{champion_loss:.6f}")
    return {"name": name, "version": version, "eval_loss": new_loss, "champion_version": int(current.version) if current else None,
            "champion_eval_loss": champion_loss, "promoted": promoted,
            "champion": version if promoted else int(current.version)}
