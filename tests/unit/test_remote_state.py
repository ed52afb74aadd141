"""Remote sub-tasks are asked for their state and output far less often than the coordinator polls."""

from __future__ import annotations

from crosscloud.backends.base import RemoteState


def test_running_state_is_reused_until_due_and_a_final_state_is_never_asked_again():
    asked = []

    def ask(answer):
        def _ask():
            asked.append(answer)
            return answer
        return _ask

    remote = RemoteState(interval_s=1e9)
    assert remote.state("job", ask("running")) == "running"
    assert remote.state("job", ask("failed")) == "running"  # not due: the remote is not asked
    assert asked == ["running"]
    now = RemoteState(interval_s=0)
    assert now.state("job", ask("running")) == "running"
    assert now.state("job", ask("succeeded")) == "succeeded"
    assert now.state("job", ask("running")) == "succeeded"
    assert asked == ["running", "running", "succeeded"]


def test_logs_wait_until_due_but_an_ended_subtask_gives_its_last_lines_at_once():
    remote = RemoteState(interval_s=1e9)
    assert remote.logs("job", 0, lambda: ("a\n", 2)) == ("a\n", 2)
    assert remote.logs("job", 2, lambda: ("b\n", 4)) == ("", 2)
    remote.forget("job")
    assert remote.state("job", lambda: "failed") == "failed"
    assert remote.logs("job", 2, lambda: ("b\n", 4)) == ("b\n", 4)
