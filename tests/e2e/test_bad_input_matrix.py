"""Bad input, as a new user would give it, fed to the command line and to the DAG: a clear error, nothing left behind.

Each case goes to ``crosscloud train`` and to a ``cross_cloud_training`` DAG
run with the same parameters. The command line must end with one line
naming the field and the fix (exit 1 or 2, no traceback); the DAG must
refuse the run, either at the trigger (Airflow's own check of the Params,
which names the Param) or in its ``admit`` task on the first try, the log
ending with the engine's message. After each: no reservation, no queue
entry, no plan or other object in any cloud's store, no sub-task started.
"""

from __future__ import annotations

import pytest
from dagruns import params_restored

from crosscloud import cli
from crosscloud.ledger import Ledger

pytestmark = [pytest.mark.badinput, pytest.mark.e2e, pytest.mark.slow]

# a run this small would finish in seconds, should a bad input ever slip through
BASE = {"rounds": 1, "inner_steps": 2, "model_size": "tiny", "global_batch": 4, "eval_every_steps": 2}
PROGRAM = "examples/byte_lm/train.py"
NO_EVALUATE = "import torch\n\ndef build_model(args):\n    return torch.nn.Linear(2, 2)\n"
BROKEN = "def build_model(args:\n    return None\n"

CASES = [  # (case, job parameters, program, what the engine's message says)
    ("rounds-zero", {"rounds": 0}, None, "job parameter rounds: must be > 0"),
    ("rounds-negative", {"rounds": -3}, None, "job parameter rounds: must be > 0"),
    ("rounds-text", {"rounds": "three"}, None, "job parameter rounds: must be an integer, got 'three'"),
    ("inner-steps-zero", {"inner_steps": 0}, None, "job parameter inner_steps: must be > 0"),
    ("batch-zero", {"global_batch": 0}, None, "job parameter global_batch: must be > 0"),
    ("devices-per-cloud-zero", {"devices_per_cloud": 0}, None, "job parameter devices_per_cloud: must be > 0"),
    ("devices-zero", {"placement": "auto", "devices": 0}, None, "job parameter devices: must be > 0"),
    ("model-size-unknown", {"model_size": "huge"}, None, "job parameter model_size: 'huge' is unknown"),
    ("placement-unknown", {"placement": "everywhere"}, None, "job parameter placement: 'everywhere' is unknown"),
    ("mode-unknown", {"mode": "fast"}, None, "job parameter mode: 'fast' is unknown"),
    ("inner-lr-zero", {"inner_lr": 0}, None, "job parameter inner_lr: must be > 0"),
    ("outer-lr-negative", {"outer_lr": -1.0}, None, "job parameter outer_lr: must be > 0"),
    ("momentum-one", {"outer_momentum": 1.0}, None, "job parameter outer_momentum: must be in [0, 1)"),
    ("eval-every-zero", {"eval_every_steps": 0}, None, "job parameter eval_every_steps: must be > 0"),
    ("eval-timeout-zero", {"eval_timeout_s": 0}, None, "job parameter eval_timeout_s: must be > 0"),
    ("probe-one-step", {"probe_steps": 1}, None, "job parameter probe_steps: must be 0 (no probe) or >= 2"),
    ("fold-mix-one", {"fold_mix": 1.0}, None, "job parameter fold_mix: must be in [0, 1)"),
    ("round-timeout-zero", {"round_timeout_s": 0}, None, "job parameter round_timeout_s: must be > 0"),
    ("lr-scaling-unknown", {"local_lr_scaling": "cubic"}, None, "job parameter local_lr_scaling: 'cubic' is unknown"),
    ("compression-unknown", {"compression": "zip"}, None, "job parameter compression: 'zip' is unknown"),
    ("overlap-text", {"overlap": "yes"}, None, "job parameter overlap: must be true or false, got 'yes'"),
    ("clouds-twice", {"clouds": ["beijing", "beijing"]}, None, "job parameter clouds: lists a cloud twice"),
    ("clouds-not-a-list", {"clouds": "beijing"}, None, "job parameter clouds: must be a list of names"),
    ("cloud-unknown", {"clouds": ["mars"]}, None, "unknown cloud 'mars'"),
    ("tenant-path", {"tenant": "../team-b"}, None, "job parameter tenant: tenant '../team-b' is not allowed"),
    ("tenant-unknown", {"tenant": "nobody"}, None, "unknown tenant 'nobody'"),
    ("tenant-without-quota", {"tenant": "team-b", "clouds": ["singapore"]}, None, "tenant team-b has no quota"),
    ("dataset-unknown", {"dataset": "nope"}, None, "unknown dataset 'nope'"),
    ("retries-negative", {"subtask_retries": -1}, None, "job parameter subtask_retries: must be >= 0"),
    ("keep-one-round", {"keep_rounds": 1}, None, "job parameter keep_rounds: must be >= 2"),
    ("deadline-text", {"deadline": "tomorrow"}, None, "job parameter deadline: 'tomorrow' is neither hours"),
    ("deadline-past", {"deadline": "-5"}, None, "hours after submission must be > 0"),
    ("objective-unknown", {"objective": "cheapest"}, None, "job parameter objective: 'cheapest' is unknown"),
    ("deferrable-without-deadline", {"deferrable": True}, None, "deferrable work needs a deadline"),
    ("program-missing", {}, "examples/nowhere.py", "program 'examples/nowhere.py': no file"),
    ("program-without-evaluate", {}, "{tmp}/no_evaluate.py", "defines no evaluate"),
    ("program-broken", {}, "{tmp}/broken.py", "SyntaxError"),
]


@pytest.fixture()
def own_state(tmp_path, monkeypatch):
    """A state folder of the case's own (its clouds' stores and ledger start empty), and the programs it names."""
    monkeypatch.setenv("CROSSCLOUD_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "no_evaluate.py").write_text(NO_EVALUATE)
    (tmp_path / "broken.py").write_text(BROKEN)
    return tmp_path / "state"


def _left_behind(state) -> list[str]:
    """Reservations, queue entries, objects in any cloud's store, sub-tasks: all a refused run must not leave."""
    ledger = Ledger()
    left = [f"reservation {r.run_id}" for r in ledger.active()]
    left += [f"queue entry {e.run_id}" for e in ledger.queue.submitted_since(0.0)]
    for folder in ("clouds", "subtasks"):
        if (state / folder).exists():
            left += [str(p.relative_to(state)) for p in (state / folder).rglob("*") if p.is_file()]
    return left


def _command_line(params: dict, program: str, capfd) -> tuple[int, str]:
    import json

    argv = ["train", program, "--no-wait", "--run-id", "bad-input"]
    for key, value in params.items():
        argv += ["--job", f"{key}={json.dumps(value)}"]
    try:
        return cli.main(argv), capfd.readouterr().err
    except SystemExit as exc:  # a refusal of the command's own arguments: its message is the exit's
        return 1, str(exc.code)


@pytest.mark.parametrize(("params", "program", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_its_fix_by_the_command_line_and_the_dag_and_leaves_nothing(
        own_state, tmp_path, capfd, dagbag, params, program, says):
    from airflow.sdk.exceptions import ParamValidationError

    program = (program or PROGRAM).format(tmp=tmp_path)
    params = {**BASE, **params}
    code, err = _command_line(params, program, capfd)
    assert code in (1, 2) and err.startswith("crosscloud train: ") and "Traceback" not in err, err
    assert says in err, err
    assert _left_behind(own_state) == []

    with params_restored(dagbag.get_dag("cross_cloud_training")) as dag:
        try:
            run = dag.test(run_conf={**params, "program": program})
        except ParamValidationError as exc:  # refused at the trigger: the form says which Param
            changed = [k for k in params if k in str(exc)]
            assert changed, f"{exc} names none of {sorted(params)}"
            run = None
    if run is not None:
        [admit] = [ti for ti in run.get_task_instances() if ti.task_id == "admit"]
        log = capfd.readouterr().out  # dag.test() writes the task logs here
        assert run.state == "failed" and admit.state == "failed" and admit.try_number == 1, (run.state, admit.state)
        assert says in log and "AirflowFailException" in log, log[-2000:]
    assert _left_behind(own_state) == []

