"""Retraining: continue the latest registered model on the current data, and promote it only if it is better.

A retrain is a cross-cloud run like any other, queued and trained by the same
stages; ``starting_point`` gives it the tenant's registered model to continue:
the ``champion`` version, else the newest version (a rejected retrain is not
continued while a better champion exists), or the seed when none is
registered yet. The run registers its final model as a new version
(``registry.register``).
``decide`` then compares the new model's ``final_eval_loss`` with the
champion's loss on the same held-out set: a retrain that continued the
champion starts from its weights, so the home cloud's sub-task measured that
as global 0's loss. It moves the ``champion`` alias to the new version only
when its loss is lower, and weighs nothing in the Airflow task but numbers.
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.pipeline.inputs import LoadedProgram, StartFrom, load_job_program
from crosscloud.pipeline.stages import Log
from crosscloud.store import header
from crosscloud.store.chunks import put_blob_stream
from crosscloud.store.open_store import open_store
from crosscloud.tracking import registry
from crosscloud.tracking.mlflow_runs import Tracker

BLOCK = 8 << 20  # bytes read from the downloaded model file at a time


def starting_point(spec: JobSpec, log: Log = print,
                   program: LoadedProgram | None = None) -> tuple[StartFrom | None, dict[str, str]]:
    """What a retrain of ``spec`` continues (None: the seed) and the lineage tag naming it: the program's own
    registered model (``registry.plan_model_name``), its champion else its newest version. The weights go from
    the artifact store to the local cloud's store as a file, streamed: the task never holds them."""
    client = Tracker().client
    name = registry.model_name(spec.tenant, (program or load_job_program(spec)).model_name)
    base = registry.champion(client, name) or registry.latest(client, name)
    log(f"retraining {name} from {f'version {base.version}' if base else 'scratch (no registered version yet)'}")
    if base is None:
        return None, {}
    label = f"{name}/{base.version}"
    home = open_store(load_federation().local_cloud, spec.tenant)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(registry.download(base, tmp))
        head = header.file_prefix(path)
        with open(path, "rb") as f:
            ref, _ = put_blob_stream(home, spec.tenant, iter(partial(f.read, BLOCK), b""), kind="model")
    start = StartFrom(ref, header.architecture(head), header.parameters(head), f"registered {label}")
    return start, {"crosscloud.parent_model": label}


def retrained(run: dict, summary: dict) -> dict:
    """What ``decide`` weighs: the run (a ``RunRef`` as a dict), the version it registered, its eval loss, and the
    held-out loss of its global 0 (the weights it continued), as the home cloud's sub-task measured both."""
    m = summary["metrics"]
    return {"run": run, "model": summary["model"], "final_eval_loss": m["final_eval_loss"],
            "start_eval_loss": m["eval_loss_start"]}


def _champion_loss(client, name: str, result: dict, current) -> tuple[float | None, str]:
    """The champion's held-out loss on the retrain's held-out set, and why there is none: global 0 of a retrain
    that continued the champion is the champion, evaluated in the cloud on the same bytes as the new model."""
    version = client.get_model_version(name, str(result["model"]["version"]))
    parent = version.tags.get("crosscloud.parent_model")
    start = result.get("start_eval_loss")
    if parent != f"{name}/{current.version}":
        return None, (f"the champion is version {current.version} and this retrain continued "
                      f"{parent or 'the seed'}: the two were not compared on the same held-out set; retrain again")
    if start is None or start != start:
        return None, "the champion's held-out loss was not measured in this run (its global 0 was not evaluated)"
    return float(start), ""


def decide(result: dict) -> dict:
    """Promote the retrained version to ``champion`` only if it beats the champion on the same held-out set; the
    task compares two numbers and never loads a model."""
    client = Tracker().client
    name, version, new_loss = result["model"]["name"], result["model"]["version"], result["final_eval_loss"]
    current = registry.champion(client, name)
    champion_loss, why_not = _champion_loss(client, name, result, current) if current else (None, "")
    promoted = not why_not and (champion_loss is None or new_loss < champion_loss)
    if promoted:
        registry.promote(client, name, version)
    client.set_model_version_tag(name, str(version), "crosscloud.promoted", str(promoted).lower())
    if why_not:
        client.set_model_version_tag(name, str(version), "crosscloud.not_compared", why_not)
    if champion_loss is not None:
        client.set_model_version_tag(name, str(version), "crosscloud.champion_eval_loss", f"{champion_loss:.6f}")
    return {"name": name, "version": version, "eval_loss": new_loss, "champion_version": int(current.version) if current else None,
            "champion_eval_loss": champion_loss, "promoted": promoted, "not_compared": why_not,
            "champion": version if promoted else int(current.version)}
