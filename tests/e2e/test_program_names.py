"""Each program registers its own model, and a version of another architecture never joins it.

Real runs through the engine (``run_job``) with MLflow tracking: two programs
of one tenant register two models; the same name with another width is
refused before anything is reserved, whether trained fresh or as a retrain of
the registered champion.
"""

from __future__ import annotations

import json

import pytest

from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger
from crosscloud.pipeline.inputs import ArchitectureMismatch
from crosscloud.pipeline.retraining import starting_point
from crosscloud.pipeline.stages import run_job
from crosscloud.tracking import registry
from crosscloud.tracking.mlflow_runs import Tracker

pytestmark = [pytest.mark.e2e, pytest.mark.program, pytest.mark.slow]

TENANT, EXPERIMENT = "team-b", "program-names"
SMALL = {"tenant": TENANT, "rounds": 1, "inner_steps": 4, "global_batch": 8, "seed": 2, "eval_every_steps": 4,
         "program_args": {"lr": 0.05}}
BIGRAM, FACTORED = "tests/programs/bigram.py", "tests/programs/factored.py"


def _versions(name: str) -> list:
    return Tracker().client.search_model_versions(f"name = '{name}'")


def _version(model: dict):
    return Tracker().client.get_model_version(model["name"], str(model["version"]))


@pytest.fixture(scope="module")
def registered():
    out = {}
    for program, run_id in ((BIGRAM, "names-bigram"), (FACTORED, "names-factored")):
        summary = run_job(JobSpec(**SMALL, program=program), run_id, experiment=EXPERIMENT, compare_baseline=False,
                          log=lambda m: None)
        out[program] = summary["model"]
    return out


def test_two_programs_of_one_tenant_get_two_registered_models(registered):
    assert registered[BIGRAM]["name"] == f"crosscloud-{TENANT}-bigram-byte-lm"  # the file's stem and family
    assert registered[FACTORED]["name"] == f"crosscloud-{TENANT}-factored-bigram"  # its MODEL_NAME
    bigram, factored = (_version(registered[p]).tags for p in (BIGRAM, FACTORED))
    assert bigram["crosscloud.program"] == BIGRAM and factored["crosscloud.program"] == FACTORED
    assert len(bigram["crosscloud.program_sha256"]) == 64
    assert json.loads(factored["crosscloud.program_args"])["lr"] == 0.05
    assert bigram[registry.ARCHITECTURE] != factored[registry.ARCHITECTURE]
    assert int(factored[registry.PARAMETERS]) == 256 * 32 + 32 * 256 + 256


def test_the_registered_weights_are_the_home_clouds_final_global_byte_for_byte(registered):
    from crosscloud.core.federation import load_federation
    from crosscloud.core.keys import RunKeys
    from crosscloud.store.commit import read_commit
    from crosscloud.store.digest import sha256
    from crosscloud.store.open_store import open_store

    home = open_store(load_federation().local_cloud, TENANT)
    final = read_commit(home, RunKeys(TENANT, "names-factored").final)["objects"]["model.safetensors"]
    version = _version(registered[FACTORED])
    assert version.tags["crosscloud.model_sha256"] == final["sha256"]
    assert sha256(registry.weights(Tracker().client, version)) == final["sha256"]


def test_another_architecture_under_the_same_name_is_refused_before_anything_is_reserved(registered):
    name = registered[FACTORED]["name"]
    before = len(_versions(name))
    narrow = JobSpec(**{**SMALL, "program_args": {"lr": 0.05, "width": 16}}, program=FACTORED)
    with pytest.raises(registry.RegistryMismatch, match=rf"run names-narrow is refused: {name} version \d+ .*"
                       r"versions of one registered model must continue each other.*MODEL_NAME"):
        run_job(narrow, "names-narrow", experiment=EXPERIMENT, compare_baseline=False, log=lambda m: None)
    assert Ledger().queue.get(TENANT, "names-narrow") is None and Ledger().active(run_id="names-narrow") == []
    assert len(_versions(name)) == before


def test_a_retrain_across_architectures_is_refused_naming_the_version(registered):
    narrow = JobSpec(**{**SMALL, "program_args": {"lr": 0.05, "width": 16}}, program=FACTORED)
    start, lineage = starting_point(narrow, log=lambda m: None)  # the champion of the program's own name
    assert lineage["crosscloud.parent_model"].startswith(f"{registered[FACTORED]['name']}/")
    assert start.parameters == 256 * 32 + 32 * 256 + 256  # read from the streamed file's header
    with pytest.raises(ArchitectureMismatch, match=rf"cannot continue registered {lineage['crosscloud.parent_model']}: "
                       r"its model is another architecture \(16,640 parameters.*retraining across architectures"):
        run_job(narrow, "names-retrain", experiment=EXPERIMENT, compare_baseline=False, init=start, tags=lineage,
                log=lambda m: None)
    assert Ledger().queue.get(TENANT, "names-retrain") is None


def test_serving_a_version_of_another_architecture_than_the_champion_is_refused(registered):
    from crosscloud.serving.placement import ServingPlacementError, resolve

    client, name = Tracker().client, registered[FACTORED]["name"]
    champion = registry.champion(client, name) or registry.latest(client, name)
    registry.promote(client, name, int(champion.version))
    # a version put beside it by hand, in MLflow, from another model
    other = client.create_model_version(name, champion.source, tags={registry.ARCHITECTURE: "0" * 16})
    client.set_registered_model_alias(name, "candidate", other.version)
    assert resolve(client, name, "champion").version == int(champion.version)
    with pytest.raises(ServingPlacementError, match=rf"serving {name} @candidate \(version {other.version}\) is refused"):
        resolve(client, name, "candidate")


def test_a_run_measures_its_program_and_the_next_run_is_sized_by_that(registered, capsys):
    from crosscloud.pipeline.stages import admit_stage, release_stage

    lines: list[str] = []
    ref = admit_stage(JobSpec(**SMALL, program=BIGRAM), "names-bigram-again", log=lines.append, wait=True)
    try:
        _, plan = ref.load()
        figures = Ledger().figures.lookup(TENANT, plan.program.code.sha256, plan.program.architecture)
        assert set(figures) == {"cpu"} and figures["cpu"].seconds_per_sample > 0 and figures["cpu"].peak_memory_gb > 0
        assert plan.sizing["measured"] and plan.sizing["seconds_per_sample"]["cpu"] == figures["cpu"].seconds_per_sample
        assert any("sized by measured by 1 run(s) on cpu" in line for line in lines), lines
        from crosscloud import cli

        assert cli.main(["inventory", "--tenant", TENANT, "--json"]) == 0
        shown = [p for p in json.loads(capsys.readouterr().out)["programs"] if p["name"] == BIGRAM]
        assert shown and shown[0]["accelerator"] == "cpu" and shown[0]["tenant"] == TENANT
    finally:
        release_stage(ref)
