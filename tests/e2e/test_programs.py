"""Training programs that are not crosscloud's own: trained through the DAG, failing, or never calling the SDK."""

from __future__ import annotations

import json

import pytest

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.keys import RunKeys
from crosscloud.ledger import Ledger
from crosscloud.pipeline.stages import run_job
from crosscloud.store.open_store import open_store
from crosscloud.training.watcher import SubTaskLost
from crosscloud.training.program import ProgramError

pytestmark = [pytest.mark.e2e, pytest.mark.program, pytest.mark.slow]

SMALL = {"rounds": 3, "inner_steps": 10, "global_batch": 12, "seed": 4, "eval_every_steps": 30}


def test_a_program_outside_the_package_trains_through_the_dag(dagbag):
    conf = {**SMALL, "program": "tests/programs/bigram.py", "program_args": {"lr": 0.1}}
    run = dagbag.get_dag("cross_cloud_training").test(run_conf=conf)
    assert run.state == "success"
    home = open_store(load_federation().local_cloud)
    summary = json.loads(home.get(RunKeys("team-a", run.run_id).summary))
    plan = json.loads(home.get(RunKeys("team-a", run.run_id).plan))
    assert plan["program"]["name"] == "tests/programs/bigram.py" and plan["program"]["family"] == "byte-lm"
    m = summary["metrics"]
    assert m["final_eval_loss"] < 0.8 * m["eval_loss_start"], m
    assert set(summary["clouds"]) == {"beijing", "shanghai", "singapore"}


def test_a_failing_program_stops_the_run_with_its_traceback_and_gives_the_devices_back():
    lines: list[str] = []
    spec = JobSpec(**SMALL, program="tests/programs/raises.py")
    with pytest.raises(ProgramError, match=r"program tests/programs/raises.py failed on cloud (beijing|shanghai|singapore)"):
        run_job(spec, "program-raises", log=lines.append, compare_baseline=False)
    log = "\n".join(lines)
    assert "crosscloud: program tests/programs/raises.py failed on cloud" in log
    assert "Traceback (most recent call last)" in log and "in load_batches" in log
    assert "FileNotFoundError: no batches for cloud" in log
    assert Ledger().active(run_id="program-raises") == []


def test_a_program_that_cannot_be_found_is_refused_before_anything_is_reserved():
    with pytest.raises(ProgramError, match="no file .*nowhere.py .*project folder"):
        run_job(JobSpec(**SMALL, program="examples/nowhere.py"), "program-missing", compare_baseline=False)
    with pytest.raises(ProgramError, match="cannot find module: No module named .no_such_package."):
        run_job(JobSpec(**SMALL, program="no_such_package.train"), "program-missing-2", compare_baseline=False)
    assert Ledger().active(run_id="program-missing") == []


def test_a_program_that_never_calls_the_sdk_fails_after_the_round_timeout_saying_so():
    spec = JobSpec(**{**SMALL, "rounds": 1}, program="tests/programs/silent.py", round_timeout_s=6)
    with pytest.raises(SubTaskLost, match=r"within 6 s; tests/programs/silent.py never called crosscloud.sdk.init\(\)"):
        run_job(spec, "program-silent", log=lambda m: None, compare_baseline=False)
    assert Ledger().active(run_id="program-silent") == []


def test_an_evaluation_that_hangs_or_raises_is_recorded_as_failed_and_the_run_trains_on():
    spec = JobSpec(**{**SMALL, "rounds": 2, "eval_every_steps": 10}, program="tests/programs/slow_eval.py",
                   eval_timeout_s=3, program_args={"lr": 0.1})
    summary = run_job(spec, "program-slow-eval", log=lambda m: None, compare_baseline=False)
    assert summary["rounds"] == 2 and len(summary["history"]) == 2
    m = summary["metrics"]
    assert m["eval_loss_start"] != m["eval_loss_start"] and m["final_eval_loss"] != m["final_eval_loss"]  # NaN
    home = open_store(load_federation().local_cloud)
    hung, raised = (json.loads(home.get(RunKeys("team-a", "program-slow-eval").evaluation(g))) for g in (0, 2))
    assert hung["error"] == "evaluate of global 0 ran past its time limit of 3 s"
    assert raised["error"] == "evaluate of global 2 raised RuntimeError: the held-out set is unreadable"
    assert Ledger().active(run_id="program-slow-eval") == []


def test_a_dag_run_of_a_missing_program_fails_at_once_saying_what_to_fix(dagbag, capfd):
    from dagruns import params_restored

    with params_restored(dagbag.get_dag("cross_cloud_training")) as dag:
        run = dag.test(run_conf={**SMALL, "program": "examples/nowhere.py"})
    [admit] = [ti for ti in run.get_task_instances() if ti.task_id == "admit"]
    # a user's error is not retried (the DAG retries its tasks twice): the task failed on its first try
    assert run.state == "failed" and admit.state == "failed" and admit.try_number == 1
    log = capfd.readouterr().out  # dag.test() writes the task logs here
    assert "AirflowFailException: ProgramError: program 'examples/nowhere.py': no file" in log
    assert "set CROSSCLOUD_PROJECT_DIR to change it" in log
    assert "include/crosscloud/" not in log  # Airflow's own frames only: none of the engine's hides the message
    assert Ledger().active(run_id=run.run_id) == []
