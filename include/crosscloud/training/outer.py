"""The outer step of a round (DiLoCo): combine pseudo-gradients, apply Nesterov SGD.

A pseudo-gradient is ``global params at round start - local params at round
end``. Clouds' pseudo-gradients are averaged weighted by the samples each
trained on, then one SGD step with Nesterov momentum moves the global params.
With ``lr=1, momentum=0`` the step simply adopts the averaged local params,
which is what a single cluster's synchronous run does.
"""

from __future__ import annotations

import torch

from crosscloud.core.job import OuterConfig

# lr 1 and no momentum: the step adopts the clouds' weighted average (a single cluster, a run's last round)
SYNCHRONOUS = OuterConfig(lr=1.0, momentum=0.0)


def outer_config(plan, round_: int) -> OuterConfig:
    """The outer step of a round of ``plan``: a single cluster's rounds adopt the average, as does a run's last round."""
    spec = plan.spec
    return SYNCHRONOUS if spec.mode == "single_cluster" else round_config(plan.outer, round_, spec.rounds)


def round_config(cfg: OuterConfig, round_: int, rounds: int) -> OuterConfig:
    """The outer step of ``round_`` of ``rounds``: the last one adopts the clouds' average.

    An outer lr above 1 or momentum extrapolates past the clouds' points, which helps the
    next round's start but leaves a model off the valley floor that training would return to.
    The last global is the model a run hands over, so it is the clouds' average itself.
    """
    return SYNCHRONOUS if round_ == rounds - 1 else cfg


def weighted_mean(deltas: dict[str, dict[str, torch.Tensor]], weights: dict[str, float]) -> dict[str, torch.Tensor]:
    """Average each tensor over clouds, weighted by ``weights`` (e.g. samples trained)."""
    if not deltas:
        raise ValueError("no pseudo-gradients to combine")
    total = sum(weights[c] for c in deltas)
    names = next(iter(deltas.values())).keys()
    return {n: sum(deltas[c][n].float() * (weights[c] / total) for c in deltas) for n in names}


def outer_step(
    params: dict[str, torch.Tensor],
    delta: dict[str, torch.Tensor],
    momentum: dict[str, torch.Tensor] | None,
    cfg: OuterConfig,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """One Nesterov SGD step on ``params`` with gradient ``delta``; returns (params, momentum).

    Without momentum the buffer is None: there is nothing to carry to the next round, so
    no cloud stores any (a params-sized object a round).
    """
    new_params, new_momentum = {}, {}
    for name, p in params.items():
        step = delta[name].to(p.dtype)
        if cfg.momentum:
            buf = step.clone() if momentum is None else cfg.momentum * momentum[name] + step
            new_momentum[name] = buf
            step = step + cfg.momentum * buf
        new_params[name] = p - cfg.lr * step
    return new_params, (new_momentum if cfg.momentum else None)
