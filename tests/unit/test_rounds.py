"""The overlapped (one-round-delayed) round algorithm and straggler-aware shares, by hand."""

from __future__ import annotations

import torch

from crosscloud.outer import SYNCHRONOUS, OuterConfig, outer_step, weighted_mean
from crosscloud.partition import rebalance_shares
from crosscloud.worker import continue_from


def _run(progress: list[list[float]], cfg: OuterConfig, overlap: bool) -> tuple[list[float], list[list[float]]]:
    """Two workers whose training moves a scalar by progress[r][c] each round; returns the
    global params after every round and each worker's start of every round."""
    theta, buf = [torch.tensor([0.0])], None
    starts = [[0.0, 0.0]]
    base = [torch.tensor([0.0]), torch.tensor([0.0])]
    for r, moves in enumerate(progress):
        prog = [torch.tensor([m]) for m in moves]
        delta = weighted_mean({c: {"w": -prog[c]} for c in (0, 1)}, {0: 1.0, 1: 1.0})
        new, buf = outer_step({"w": theta[-1]}, delta, buf, cfg)
        theta.append(new["w"])
        if overlap:  # round r + 1 starts from global r (round 0: its own start) plus own progress
            base = [continue_from({"w": theta[r] if r > 0 else base[c]}, {"w": prog[c]})["w"] for c in (0, 1)]
        else:
            base = [theta[-1], theta[-1]]
        starts.append([b.item() for b in base])
    return [t.item() for t in theta], starts


def test_overlapped_rounds_by_hand():
    cfg = OuterConfig(lr=0.5, momentum=0.0)
    theta, starts = _run([[1.0, 3.0], [2.0, 2.0], [1.0, 1.0]], cfg, overlap=True)
    # theta_{r+1} = theta_r + 0.5 * mean(progress_r)
    assert theta == [0.0, 1.0, 2.0, 2.5]
    # round 1 starts from each worker's own round-0 result; round 2 from global 1 + own round-1 progress
    assert starts[1] == [1.0, 3.0]
    assert starts[2] == [1.0 + 2.0, 1.0 + 2.0]
    assert starts[3] == [2.0 + 1.0, 2.0 + 1.0]


def test_overlap_on_a_single_cluster_is_plain_continuation():
    # synchronous outer step (adopt the average): the delayed global plus own progress is
    # exactly where the worker already is, so overlapping changes nothing for a single cluster
    moves = [[0.5, 0.5], [0.25, 0.25], [-0.125, -0.125]]
    theta, starts = _run(moves, SYNCHRONOUS, overlap=True)
    assert theta == [0.0, 0.5, 0.75, 0.625]
    assert [s[0] for s in starts] == [0.0, 0.5, 0.75, 0.625]


def test_blocking_rounds_start_from_the_new_global():
    theta, starts = _run([[1.0, 3.0], [2.0, 2.0]], OuterConfig(lr=0.5, momentum=0.0), overlap=False)
    assert starts[1:] == [[1.0, 1.0], [2.0, 2.0]]


def test_shares_follow_measured_speed():
    # cloud b takes twice as long per step with the same share: it gets about a third of the batch
    new = rebalance_shares({"a": 12, "b": 12}, {"a": 0.1, "b": 0.2}, 24)
    assert new == {"a": 16, "b": 8}
    # after rebalancing both finish a step at the same time
    assert abs(new["a"] * 0.1 / 12 - new["b"] * 0.2 / 12) < 1e-9


def test_shares_ignore_timing_noise():
    assert rebalance_shares({"a": 12, "b": 12}, {"a": 0.100, "b": 0.102}, 24) == {"a": 12, "b": 12}
