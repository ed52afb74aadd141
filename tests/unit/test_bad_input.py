"""Bad job parameters and plans fail before anything starts, naming the field and the fix.

"Before anything starts" is checked on the stores: a refused run leaves no
object in any cloud's store and no reservation in the ledger.
"""

from __future__ import annotations

import pytest
from federations import embedded, embedded_file

from crosscloud.artifacts.preheat import ResidencyError, TransferReport, fetch
from crosscloud.core.job import JobSpec, JobSpecError, key_values
from crosscloud.core.presets import PRESETS
from crosscloud.ledger import Ledger
from crosscloud.pipeline.stages import admit_stage
from crosscloud.scheduler.admission import preflight
from crosscloud.pool.placement import PlacementError
from crosscloud.store.chunks import put_blob
from crosscloud.store.credentials import CredentialsError
from crosscloud.store.open_store import open_store
from crosscloud.training.model import build_model


@pytest.fixture()
def own_state(tmp_path, monkeypatch):
    """A state folder of the test's own: its clouds' stores and ledger start empty."""
    monkeypatch.setenv("CROSSCLOUD_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _written(state) -> list[str]:
    clouds = state / "clouds"
    return sorted(str(p.relative_to(clouds)) for p in clouds.rglob("*") if p.is_file()) if clouds.exists() else []


@pytest.mark.parametrize(
    ("params", "field", "hint"),
    [
        ({"rounds": 0}, "rounds", "must be > 0"),
        ({"rounds": -3}, "rounds", "must be > 0"),
        ({"inner_steps": 0}, "inner_steps", "must be > 0"),
        ({"global_batch": 0}, "global_batch", "must be > 0"),
        ({"devices_per_cloud": 0}, "devices_per_cloud", "must be > 0"),
        ({"model_size": "huge"}, "model_size", "choose one of"),
        ({"outer_momentum": 1.0}, "outer_momentum", "[0, 1)"),
        ({"clouds": ["beijing", "beijing"]}, "clouds", "lists a cloud twice"),
        ({"tenant": "../team-b"}, "tenant", "is not allowed"),
        ({"compression": "zip"}, "compression", "choose int8 or none"),
        ({"round": 3}, "unknown job parameter(s) ['round']", "known:"),
    ],
)
def test_out_of_range_params_name_the_field_and_the_fix(params, field, hint):
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_params(params)
    assert field in str(info.value) and hint in str(info.value)


def test_command_line_pairs_are_json_where_they_parse_and_refused_without_a_key():
    assert key_values(["lr=3e-4", "size=small", "layers=[1, 2]", "url=a=b", "flag=true"]) == {
        "lr": 3e-4, "size": "small", "layers": [1, 2], "url": "a=b", "flag": True}
    for bad in ("size", "=small"):
        with pytest.raises(JobSpecError, match=f"--job {bad!r} is not key=value"):
            key_values([bad], "--job")


def test_a_cloud_the_tenant_has_no_quota_on_fails_before_anything_is_written(own_state):
    fed_path = embedded_file(own_state.parent / "fed.yaml")
    spec = JobSpec(tenant="team-b", clouds=["singapore"], rounds=1, inner_steps=1, model_size="tiny")
    with pytest.raises(PlacementError) as info:
        admit_stage(spec, "no-quota", str(fed_path))
    assert "singapore/cpu: tenant team-b has no quota" in str(info.value)
    assert "Change the job parameters clouds" in str(info.value)
    assert _written(own_state) == [] and Ledger().active("team-b") == []


def test_no_cloud_at_all_fails_before_anything_is_written(own_state):
    def no_quota(raw):
        raw["tenants"][1]["quotas"] = {"beijing": 0, "shanghai": 0}

    fed_path = embedded_file(own_state.parent / "fed.yaml", no_quota)
    with pytest.raises(PlacementError, match=r"no placement for tenant team-b on \['any'\].*Change the job parameters"):
        admit_stage(JobSpec(tenant="team-b", rounds=1, inner_steps=1, model_size="tiny"), "no-clouds", str(fed_path))
    assert _written(own_state) == []


def test_parameter_count_matches_the_model():
    for cfg in PRESETS.values():
        assert cfg.parameters() == sum(p.numel() for p in build_model(cfg, 0).parameters())


def test_a_model_that_cannot_fit_the_pools_memory_is_refused_before_anything_is_written(own_state):
    need = PRESETS["base"].min_train_memory_gb()
    assert PRESETS["tiny"].min_train_memory_gb() < need  # a smaller model is the fix the message offers

    def small_shanghai(raw):
        raw["clouds"][1]["pools"][0]["memory_gb"] = need / 2

    fed_path = embedded_file(own_state.parent / "fed.yaml", small_shanghai)
    spec = JobSpec(clouds=["shanghai"], model_size="base", rounds=1, inner_steps=1)
    with pytest.raises(PlacementError) as info:
        admit_stage(spec, "too-big", str(fed_path))
    message = str(info.value)
    assert f"the model needs at least {need:.2f} GB per device" in message and "model_size" in message
    assert _written(own_state) == []
    # the same pool takes a model that fits, and the other clouds still take the big one
    fed = embedded(small_shanghai)
    preflight(fed, JobSpec(clouds=["shanghai"], model_size="tiny"), "byte-lm", Ledger(own_state / "l.sqlite"))
    preflight(fed, JobSpec(model_size="base"), "byte-lm", Ledger(own_state / "l.sqlite"))


def test_a_tenant_without_credentials_is_told_which_connection_to_create(own_state, monkeypatch):
    def shanghai_on_s3(raw):
        raw["clouds"][1]["store"] = {"url": "s3://crosscloud/x", "endpoint_url": "http://127.0.0.1:9",
                                     "connection_id": "s3_shanghai_{tenant}"}

    fed_path = embedded_file(own_state.parent / "fed.yaml", shanghai_on_s3)
    for name in ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY"):
        monkeypatch.delenv(f"CROSSCLOUD_SHANGHAI_TEAM_B_{name}", raising=False)
        monkeypatch.delenv(f"CROSSCLOUD_SHANGHAI_{name}", raising=False)
    with pytest.raises(CredentialsError) as info:
        admit_stage(JobSpec(tenant="team-b", rounds=1, inner_steps=1, model_size="tiny"), "no-keys", str(fed_path))
    message = str(info.value)
    assert "tenant team-b has no credentials for the store of cloud shanghai" in message
    assert "clouds.shanghai.store.connection_id" in message and "'s3_shanghai_team-b'" in message
    assert "CROSSCLOUD_SHANGHAI_TEAM_B_ACCESS_KEY_ID" in message
    assert _written(own_state) == []


def test_resident_data_is_refused_at_planning_and_again_at_transfer(own_state):
    def sg_resident(raw):
        raw["clouds"][0]["jurisdiction"] = "SG"  # the local cloud evaluates the held-out part, so it is in SG too
        raw["datasets"][0].update(home="singapore", residency="SG")

    fed_path = embedded_file(own_state.parent / "fed.yaml", sg_resident)
    # planning: a run asking for a cloud outside SG is refused before anything is written
    with pytest.raises(PlacementError, match="shanghai/cpu: data resident in SG, cloud is in CN"):
        admit_stage(JobSpec(clouds=["beijing", "shanghai"], rounds=1, inner_steps=1, model_size="tiny"), "out", str(fed_path))
    assert _written(own_state) == []
    # transfer: even a caller that skips planning cannot copy a resident shard out of SG
    fed = embedded(sg_resident)
    home, cn = open_store(fed.cloud("singapore"), "team-a"), open_store(fed.cloud("shanghai"), "team-a")
    ref, _ = put_blob(home, "team-a", b"resident rows " * 1000, kind="dataset", residency="SG")
    with pytest.raises(ResidencyError, match=r"resident in SG; cloud shanghai is in CN: not copied"):
        fetch(cn, [home], "team-a", ref, TransferReport())
    assert cn.list("team-a/packs") == [] and not cn.exists(f"team-a/artifacts/{ref.sha256}.json")
    # within the jurisdiction the same shard moves
    beijing = open_store(fed.cloud("beijing"), "team-a")
    assert fetch(beijing, [home], "team-a", ref, TransferReport()) > 0
    # and data without a residency label moves anywhere
    free, _ = put_blob(home, "team-a", b"public rows " * 1000, kind="dataset")
    assert fetch(cn, [home], "team-a", free, TransferReport()) > 0


@pytest.mark.parametrize("argv, says", [  # bad job parameters and programs: tests/e2e/test_bad_input_matrix.py
    (["train", "examples/byte_lm/train.py", "--clouds", "mars"], "unknown cloud 'mars'"),
    (["train", "examples/byte_lm/train.py", "--federation", "{tmp}/none.yaml"], "federation file not found"),
    (["train", "examples/byte_lm/train.py", "--federation", "{tmp}/bad.yaml"], "invalid federation"),
    (["queue", "--federation", "{tmp}/bad.yaml"], "invalid federation"),
    (["cloud", "drain", "mars"], "unknown cloud 'mars'"),
    (["inventory", "--tenant", "nobody"], "unknown tenant(s) ['nobody']"),
])
def test_the_command_line_says_what_to_fix_without_a_traceback_and_leaves_nothing(own_state, tmp_path, capsys, argv,
                                                                                   says):
    from crosscloud import cli

    embedded_file(tmp_path / "bad.yaml", lambda raw: raw.pop("jurisdictions"))
    argv = [a.format(tmp=tmp_path) for a in argv] + (["--no-wait"] if argv[0] == "train" else [])
    try:
        code, err = cli.main(argv), capsys.readouterr().err
    except SystemExit as exc:  # a refusal of the command's own arguments: its message is the exit's
        code, err = 1, str(exc.code)
    assert code in (1, 2) and err.startswith(f"crosscloud {argv[0]}: ")
    assert says.format(tmp=tmp_path) in err and "Traceback" not in err
    ledger = Ledger()
    assert ledger.active() == [] and ledger.queue.submitted_since(0.0) == []
    if code == 2:
        with pytest.raises(cli.USER_ERRORS):  # --debug shows the traceback
            cli.main(["--debug"] + argv)
