"""The overlapped (one-round-delayed) round algorithm and straggler-aware shares, by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from crosscloud.core.job import JobSpec, JobSpecError, local_lr
from crosscloud.pool.partition import rebalance_shares
from crosscloud.training.outer import SYNCHRONOUS, OuterConfig, outer_step, weighted_mean
from crosscloud.training.rounds import DelayedGlobal


def _fold(known: DelayedGlobal, params: dict[str, torch.Tensor], meta: dict | None = None) -> dict[str, torch.Tensor]:
    """Fold a whole global in, tensor by tensor, as DiLoCo does; the corrections."""
    known.begin()
    fix = {n: known.correct(n, t) for n, t in params.items()}
    known.end(meta or {})
    return fix


def _run(progress: list[list[float]], cfg: OuterConfig, lag: list[int] | None, mix: float = 0.0) -> tuple[list[float], list[list[float]]]:
    """Two workers whose training moves a scalar by progress[r][c] each round, in equal steps.

    ``lag[r]``: how many of round r + 1's steps pass before global r + 1 is folded in
    (``None``: blocking rounds). Returns the global params after every round and where each
    worker ends every round."""
    theta, buf = [torch.tensor([0.0])], None
    known = [DelayedGlobal({"w": theta[0]}, {}, mix=mix) for _ in (0, 1)]
    x, ends = [torch.tensor([0.0]), torch.tensor([0.0])], []
    for r, moves in enumerate(progress):
        steps, fold_at = 4, (lag[r - 1] if lag and r > 0 else None)
        prog = [torch.tensor([0.0]), torch.tensor([0.0])]
        for i in range(steps):
            for c in (0, 1):
                if i == fold_at:  # global r arrives i steps into round r
                    fix = _fold(known[c], {"w": theta[r]})["w"]
                    x[c] = x[c] + fix
                x[c] = x[c] + moves[c] / steps
                prog[c] = prog[c] + moves[c] / steps
        for c in (0, 1):
            known[c].record(r, {"w": prog[c]})
        ends.append([t.item() for t in x])
        delta = weighted_mean({c: {"w": -prog[c]} for c in (0, 1)}, {0: 1.0, 1: 1.0})
        new, buf = outer_step({"w": theta[-1]}, delta, buf, cfg)
        theta.append(new["w"])
        if lag is None:  # blocking: wait for global r + 1 before round r + 1
            for c in (0, 1):
                x[c] = x[c] + _fold(known[c], {"w": theta[-1]})["w"]
    return [t.item() for t in theta], ends


def test_overlapped_rounds_by_hand():
    cfg = OuterConfig(lr=0.5, momentum=0.0)
    # global 1 lands 1 step into round 1, global 2 3 steps into round 2 (of 4)
    theta, ends = _run([[1.0, 3.0], [2.0, 2.0], [4.0, 0.0]], cfg, lag=[1, 3])
    # theta_{r+1} = theta_r + 0.5 * mean(progress_r)
    assert theta == [0.0, 1.0, 2.0, 3.0]
    assert ends[0] == [1.0, 3.0]
    # round 1: own round-0 progress (1, 3) swapped for the outer step's 1, plus own round 1 (2, 2)
    assert ends[1] == [1.0 + 2.0, 1.0 + 2.0]
    # round 2: global 2 = 2 replaces global 1 + own round-1 progress = 3, plus own round 2 (4, 0)
    assert ends[2] == [2.0 + 4.0, 2.0 + 0.0]


def test_a_mixed_fold_keeps_half_the_drift_and_leaves_the_globals_alone():
    cfg = OuterConfig(lr=0.5, momentum=0.0)
    theta, ends = _run([[1.0, 3.0], [2.0, 2.0], [4.0, 0.0]], cfg, lag=[1, 3], mix=0.5)
    assert theta == [0.0, 1.0, 2.0, 3.0]  # the same globals as the whole fold's
    # round 1: worker 1 (3 where global 1 = 1 would have it at 1) moves half the way: 2, plus its round (2)
    assert ends[1] == [1.0 + 2.0, 2.0 + 2.0]
    # round 2: worker 0 is 1 above global 2 + its round-2 progress, worker 1 is 2 above (its kept 1
    # and this round's 1): each moves half the way
    assert ends[2] == [2.0 + 4.0 + 0.5, 2.0 + 0.0 + 1.0]


def test_fold_timing_does_not_change_where_a_round_ends():
    # progress is linear here, so folding early or late gives the same end points
    moves = [[1.0, 3.0], [2.0, -1.0], [0.5, 0.5]]
    cfg = OuterConfig(lr=0.7, momentum=0.0)
    early, late = _run(moves, cfg, lag=[0, 0]), _run(moves, cfg, lag=[3, 3])
    assert early[0] == pytest.approx(late[0])
    assert [e == pytest.approx(l) for e, l in zip(early[1], late[1])] == [True, True, True]


def test_overlap_on_a_single_cluster_is_plain_continuation():
    # synchronous outer step (adopt the average) and equal progress: every fold adds nothing
    moves = [[0.5, 0.5], [0.25, 0.25], [-0.125, -0.125]]
    theta, ends = _run(moves, SYNCHRONOUS, lag=[2, 1])
    assert theta == [0.0, 0.5, 0.75, 0.625]
    assert [e[0] for e in ends] == [0.5, 0.75, 0.625]


def test_blocking_rounds_start_from_the_new_global():
    theta, ends = _run([[1.0, 3.0], [2.0, 2.0]], OuterConfig(lr=0.5, momentum=0.0), lag=None)
    assert theta == [0.0, 1.0, 2.0]
    assert ends == [[1.0, 3.0], [1.0 + 2.0, 1.0 + 2.0]]


def test_delayed_global_keeps_the_running_rounds_progress():
    known = DelayedGlobal({"w": torch.tensor([0.0])}, {"next_shares": {"a": 12}})
    assert not known.pending()
    known.record(0, {"w": torch.tensor([1.0])})
    known.record(1, {"w": torch.tensor([0.5])})
    assert known.pending()
    # global 1 = 2: the others did more than this cloud's 1 in round 0
    assert _fold(known, {"w": torch.tensor([2.0])}, {"next_shares": {"a": 16}})["w"].item() == 1.0
    assert known.round == 1 and known.metas[1] == {"next_shares": {"a": 16}}
    assert known.pending()  # round 1's progress still waits for global 2
    assert _fold(known, {"w": torch.tensor([2.25])})["w"].item() == -0.25
    assert not known.pending()


def test_shares_follow_measured_speed():
    # cloud b takes twice as long per step with the same share: it gets about a third of the batch
    new = rebalance_shares({"a": 12, "b": 12}, {"a": 0.1, "b": 0.2}, 24)
    assert new == {"a": 16, "b": 8}
    # after rebalancing both finish a step at the same time
    assert abs(new["a"] * 0.1 / 12 - new["b"] * 0.2 / 12) < 1e-9


def test_shares_ignore_timing_noise():
    assert rebalance_shares({"a": 12, "b": 12}, {"a": 0.100, "b": 0.102}, 24) == {"a": 12, "b": 12}


def test_local_lr_follows_the_share_of_the_global_batch():
    spec = JobSpec(inner_lr=0.01, global_batch=24, local_lr_scaling="sqrt")
    # sqrt: a cloud on half the batch trains at sqrt(2) times the global batch's lr
    assert local_lr(spec, 12) == pytest.approx(0.01 * 2**0.5)
    assert local_lr(spec, 6) == pytest.approx(0.02)  # a quarter: sqrt(4) = 2
    assert local_lr(dataclasses.replace(spec, local_lr_scaling="linear"), 12) == pytest.approx(0.02)
    assert local_lr(JobSpec(inner_lr=0.01, global_batch=24), 12) == pytest.approx(0.01)  # default: none
    # the whole batch (a single cluster) trains with inner_lr itself, whatever the rule
    for rule in ("sqrt", "linear", "none"):
        assert local_lr(dataclasses.replace(spec, local_lr_scaling=rule), 24) == pytest.approx(0.01)


def test_unknown_lr_scaling_is_refused():
    with pytest.raises(JobSpecError, match="local_lr_scaling"):
        JobSpec(local_lr_scaling="cubic")


def test_the_global_is_evaluated_every_eval_every_steps_and_after_the_last_round():
    spec = JobSpec(rounds=10, inner_steps=10, eval_every_steps=40)
    assert [r for r in range(10) if spec.evaluates_after(r)] == [3, 7, 9]
    # rounds that do not divide it: the first round whose end reaches the next multiple
    spec = JobSpec(rounds=5, inner_steps=25, eval_every_steps=40)
    assert [r for r in range(5) if spec.evaluates_after(r)] == [1, 3, 4]
    with pytest.raises(JobSpecError, match="eval_every_steps"):
        JobSpec(eval_every_steps=0)
