"""int8 pseudo-gradient compression: bounded error per value, nothing lost over rounds."""

from __future__ import annotations

import pytest
import torch

from crosscloud.training.compression import BLOCK, ErrorFeedback, decode, encode


def test_error_per_value_is_at_most_half_a_step_of_its_block():
    torch.manual_seed(0)
    t = torch.randn(3, 1000) * torch.logspace(-3, 1, 1000)  # magnitudes spanning four decades
    back = decode(encode({"w": t}), {"w": t})["w"]
    blocks = torch.nn.functional.pad(t.reshape(-1), (0, (-t.numel()) % BLOCK)).reshape(-1, BLOCK)
    step = (blocks.abs().amax(dim=1) / 127).repeat_interleave(BLOCK)[: t.numel()].reshape(t.shape)
    assert ((back - t).abs() <= step / 2 + 1e-7).all()
    assert back.shape == t.shape and back.dtype == t.dtype


def test_four_times_smaller_than_float32():
    t = {"w": torch.randn(512, 512)}
    enc = encode(t)
    raw = sum(v.numel() * v.element_size() for v in t.values())
    sent = sum(v.numel() * v.element_size() for v in enc.values())
    assert sent < raw / 3.9


def test_error_feedback_carries_what_quantization_dropped():
    torch.manual_seed(1)
    fb = ErrorFeedback()
    updates = [{"w": torch.randn(1000) * 1e-3 + (1.0 if i == 0 else 0.0) * (torch.arange(1000) == 0)} for i in range(20)]
    sent_total = torch.zeros(1000)
    for u in updates:
        sent_total += decode(fb.compress(u), u)["w"]
    true_total = sum(u["w"] for u in updates)
    # whatever was not sent yet is exactly the residual the sender still holds
    assert torch.allclose(sent_total + fb.residual["w"], true_total, atol=1e-5)
    # without feedback the small values next to the outlier would be lost entirely in round 0
    plain = decode(encode(updates[0]), updates[0])["w"]
    assert (plain[1:BLOCK] == 0).all() and not (updates[0]["w"][1:BLOCK] == 0).all()


def test_malformed_encoding_is_refused():
    ref = {"w": torch.zeros(10)}
    with pytest.raises(ValueError, match="missing or malformed"):
        decode({"w.q": torch.zeros(1, BLOCK, dtype=torch.int32), "w.scale": torch.ones(1)}, ref)
    with pytest.raises(ValueError, match="missing or malformed"):
        decode({}, ref)
    with pytest.raises(ValueError, match="holds"):
        decode(encode({"w": torch.zeros(10)}), {"w": torch.zeros(BLOCK * 2)})
