"""A new global crosses the WAN as an int8 update: every cloud holds the same global, nothing is lost."""

from __future__ import annotations

import torch

from crosscloud.store.base import LocalStore
from crosscloud.store.commit import read_commit, write_step
from crosscloud.store.tensors import to_bytes
from crosscloud.training.checkpoint import (
    MOMENTUM,
    PARAMS,
    RESIDUAL,
    UPDATE,
    for_others,
    global_params,
    quantized_global,
)
from crosscloud.training.compression import ErrorFeedback


def test_every_cloud_rebuilds_the_coordinators_global_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    store = LocalStore(tmp_path, "other")
    held = coordinator = exact = {"w": torch.randn(300, 7), "b": torch.randn(5)}
    feedback = ErrorFeedback()
    for r in range(1, 6):  # five outer steps, each from the global the clouds hold
        step = {n: 0.01 * torch.randn_like(t) for n, t in coordinator.items()}
        exact = {n: exact[n] + step[n] for n in exact}
        coordinator, update = quantized_global(coordinator, {n: coordinator[n] + step[n] for n in step}, feedback)
        write_step(store, f"global/{r}", for_others({PARAMS: to_bytes(coordinator), UPDATE: to_bytes(update)}))
        held = global_params(store, read_commit(store, f"global/{r}"), held)
        assert all(torch.equal(held[n], coordinator[n]) for n in held)
        # error feedback: the held global is the float32 one less only what the last update dropped, no drift
        assert all(torch.allclose(exact[n] - held[n], feedback.residual[n], atol=1e-6) for n in held)
        assert all(feedback.residual[n].abs().max() < 0.01 * step[n].abs().max() for n in held)


def test_only_the_update_leaves_the_coordinators_store():
    objects = {PARAMS: b"p", UPDATE: b"u", MOMENTUM: b"m", RESIDUAL: b"r"}
    assert for_others(objects) == {UPDATE: b"u"}
    # uncompressed runs send the full params, never the coordinator's own state
    assert for_others({PARAMS: b"p", MOMENTUM: b"m"}) == {PARAMS: b"p"}


def test_a_full_checkpoint_wins_over_an_update(tmp_path):
    store = LocalStore(tmp_path, "home")
    full = {"w": torch.ones(3)}
    write_step(store, "global/1", {PARAMS: to_bytes(full), UPDATE: b"not read"})
    assert torch.equal(global_params(store, read_commit(store, "global/1"), {"w": torch.zeros(3)})["w"], full["w"])
