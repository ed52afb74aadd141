"""Retraining: continue the latest registered model on the current data, and promote it only if it is better.

A retrain is a cross-cloud run like any other, queued and trained by the same
stages; ``starting_point`` gives it the tenant's registered model to continue:
the ``champion`` version, else the newest version (a rejected retrain is not
continued while a better champion exists), or the seed when none is
registered yet. The run registers its final model as a new version
(``registry.register``).
``decide`` then measures the current champion on the held-out set of that
run, the same bytes the new model's ``final_eval_loss`` was measured on, and
moves the ``champion`` alias to the new version only when its loss is lower.
"""

from __future__ import annotations

from crosscloud.core.job import JobSpec
from crosscloud.pipeline.stages import Log, RunRef
from crosscloud.store.open_store import open_store
from crosscloud.store.tensors import from_bytes
from crosscloud.tracking import registry
from crosscloud.tracking.mlflow_runs import Tracker
from crosscloud.training.evaluation import Evaluator


def starting_point(spec: JobSpec, log: Log = print) -> tuple[bytes | None, dict[str, str]]:
    """The weights a retrain of ``spec`` continues (None: from the seed) and the lineage tag naming their version."""
    client = Tracker().client
    name = registry.model_name(spec.tenant, spec.model_size)
    base = registry.champion(client, name) or registry.latest(client, name)
    log(f"retraining {name} from {f'version {base.version}' if base else 'scratch (no registered version yet)'}")
    if base is None:
        return None, {}
    return registry.weights(client, base), {"crosscloud.parent_model": f"{name}/{base.version}"}


def retrained(run: dict, summary: dict) -> dict:
    """What ``decide`` weighs: the run (a ``RunRef`` as a dict), the version it registered and its eval loss."""
    return {"run": run, "model": summary["model"], "final_eval_loss": summary["metrics"]["final_eval_loss"]}


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
