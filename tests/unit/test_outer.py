"""The outer step against numbers computed by hand."""

from __future__ import annotations

import pytest
import torch

from crosscloud.training.outer import SYNCHRONOUS, OuterConfig, outer_step, round_config, weighted_mean


def test_weighted_mean_by_samples():
    deltas = {"a": {"w": torch.tensor([1.0, 0.0])}, "b": {"w": torch.tensor([4.0, 3.0])}}
    avg = weighted_mean(deltas, {"a": 2.0, "b": 1.0})
    assert torch.allclose(avg["w"], torch.tensor([2.0, 1.0]))  # (2*1 + 4)/3, (0 + 3)/3


def test_two_nesterov_steps_by_hand():
    cfg = OuterConfig(lr=0.5, momentum=0.9)
    params = {"w": torch.tensor([1.0])}
    # step 1: buf = g = 0.2; update = g + 0.9 * buf = 0.38; w = 1 - 0.5 * 0.38 = 0.81
    params, buf = outer_step(params, {"w": torch.tensor([0.2])}, None, cfg)
    assert params["w"].item() == pytest.approx(0.81)
    assert buf["w"].item() == pytest.approx(0.2)
    # step 2: buf = 0.9 * 0.2 + 0.1 = 0.28; update = 0.1 + 0.9 * 0.28 = 0.352; w = 0.81 - 0.176 = 0.634
    params, buf = outer_step(params, {"w": torch.tensor([0.1])}, buf, cfg)
    assert params["w"].item() == pytest.approx(0.634)
    assert buf["w"].item() == pytest.approx(0.28)


def test_matches_torch_sgd_nesterov():
    torch.manual_seed(0)
    w0, grads = torch.randn(5), [torch.randn(5) for _ in range(4)]
    ref = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    params, buf = {"w": w0.clone()}, None
    for g in grads:
        ref.grad = g.clone()
        opt.step()
        params, buf = outer_step(params, {"w": g}, buf, OuterConfig(0.7, 0.9))
    assert torch.allclose(params["w"], ref.detach(), atol=1e-6)


def test_synchronous_config_adopts_the_averaged_local_params():
    global_w, local_w = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5])
    params, momentum = outer_step({"w": global_w}, {"w": global_w - local_w}, None, SYNCHRONOUS)
    assert torch.equal(params["w"], local_w)
    assert momentum is None  # nothing for the coordinator to store


def test_last_round_hands_over_the_clouds_average_not_an_extrapolation():
    cfg = OuterConfig(lr=1.4, momentum=0.9)
    assert [round_config(cfg, r, 3) for r in range(3)] == [cfg, cfg, SYNCHRONOUS]
    params, buf = outer_step({"w": torch.tensor([1.0])}, {"w": torch.tensor([0.5])}, None, round_config(cfg, 0, 2))
    assert params["w"].item() == pytest.approx(1.0 - 1.4 * (0.5 + 0.9 * 0.5))  # extrapolated past 0.5
    # the clouds end the last round at 0.2 and 0.4 (pseudo-gradients params - local): the run's model is their mean
    deltas = {"a": {"w": params["w"] - 0.2}, "b": {"w": params["w"] - 0.4}}
    final, _ = outer_step(params, weighted_mean(deltas, {"a": 1.0, "b": 1.0}), buf, round_config(cfg, 1, 2))
    assert final["w"].item() == pytest.approx(0.3)
