"""Energy and price per token of a served language model, per accelerator type and power cap.

Why a model and not a table: a cloud's tokens per second and joules per
token follow from two datasheet figures of its accelerator and the model's
size, so a new accelerator or model needs no new measurement. Throughput
comes from these documented datasheet figures (``ACCELERATOR_SPECS``), not
from the federation's relative speeds, which are per training family and
carry no unit. Assumptions
(sources and figures in ``docs/serving.md``):

- **prefill** (context tokens) is compute-bound: ``2 x params`` FLOPs a token
  at ``prefill_efficiency`` of the datasheet's dense BF16/FP16 peak;
- **decode** (generated tokens) is memory-bound: one step reads the weights
  once for the ``batch`` sequences a replica serves together (continuous
  batching), at ``decode_efficiency`` of the memory bandwidth; KV-cache reads
  are left out;
- a busy device draws its board power (``energy.power.DEVICE_POWER`` or the
  pool's ``power_w``) at full cap; under a cap both rates and the draw follow
  the measured inference rows of the DVFS sweep (``fit_power_curve(kind="inference")``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crosscloud.energy.power import PowerCurve, device_power

JOULES_PER_MWH = 3.6e9


@dataclass(frozen=True)
class AcceleratorSpec:
    """Datasheet figures of one device: dense BF16 (FP16 where no BF16) peak and memory bandwidth."""

    peak_tflops: float
    memory_tbps: float
    source: str


ACCELERATOR_SPECS: dict[str, AcceleratorSpec] = {
    "nvidia-h200": AcceleratorSpec(989.0, 4.8, "NVIDIA H200 SXM datasheet"),
    "nvidia-h100": AcceleratorSpec(989.0, 3.35, "NVIDIA H100 SXM datasheet"),
    "nvidia-a100": AcceleratorSpec(312.0, 2.039, "NVIDIA A100 80GB SXM datasheet"),
    "nvidia-v100": AcceleratorSpec(125.0, 0.9, "NVIDIA V100 SXM2 datasheet (tensor FP16)"),
    "nvidia-p100": AcceleratorSpec(21.2, 0.732, "NVIDIA P100 SXM2 datasheet (FP16)"),
    "nvidia-k80": AcceleratorSpec(4.4, 0.24, "NVIDIA K80 datasheet, one GK210 (FP32, no fast FP16)"),
    "ascend-910b": AcceleratorSpec(320.0, 1.6, "Huawei Ascend 910B as reported (FP16), not a vendor datasheet"),
    "cpu": AcceleratorSpec(2.0, 0.2, "one server socket, order of magnitude (AMX BF16, 8-channel DDR5)"),
}


class UnknownAcceleratorError(ValueError):
    pass


@dataclass(frozen=True)
class ServedModel:
    """The model a tenant serves; defaults: a 70B model in BF16 on 4 devices a replica (Llama-2-70B, as Splitwise served the Azure trace)."""

    name: str = "llama-2-70b"
    params_b: float = 70.0
    bytes_per_param: float = 2.0
    devices_per_replica: int = 4
    batch: int = 32  # sequences one replica decodes together
    prefill_efficiency: float = 0.5  # of peak FLOPs
    decode_efficiency: float = 0.6  # of memory bandwidth

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param


@dataclass(frozen=True)
class TokenRates:
    """One device's rates and energy at a power cap, as one of a replica's ``devices_per_replica``."""

    accelerator: str
    cap: float
    prefill_tps: float  # context tokens/s per device
    decode_tps: float  # generated tokens/s per device (at the model's batch)
    step_s: float  # one decode step of a replica: a sequence's time per generated token
    busy_w: float
    idle_w: float
    devices_per_replica: int

    @property
    def j_per_context_token(self) -> float:
        return self.busy_w / self.prefill_tps

    @property
    def j_per_generated_token(self) -> float:
        return self.busy_w / self.decode_tps

    def device_s(self, context, generated):
        """Device-seconds of work of requests (scalars or arrays)."""
        return np.asarray(context) / self.prefill_tps + np.asarray(generated) / self.decode_tps

    def energy_j(self, context, generated):
        """Joules the busy devices draw for requests (scalars or arrays), before PUE."""
        return self.device_s(context, generated) * self.busy_w

    def service_s(self, context, generated):
        """A request's time on its replica once it is admitted: prefill over the replica, then one step a token."""
        replica_prefill = self.prefill_tps * self.devices_per_replica
        return np.asarray(context) / replica_prefill + np.asarray(generated) * self.step_s

    def mix_tps(self, context_mean: float, generated_mean: float) -> float:
        """Tokens (context + generated) per second one device serves for a mix of requests."""
        return (context_mean + generated_mean) / float(self.device_s(context_mean, generated_mean))


def token_rates(accelerator: str, model: ServedModel = ServedModel(), cap: float = 1.0,
                curve: PowerCurve | None = None, full_w: float | None = None) -> TokenRates:
    """Rates and draw of one device of ``accelerator`` serving ``model`` at power cap ``cap`` (fraction of full)."""
    try:
        spec = ACCELERATOR_SPECS[accelerator]
    except KeyError:
        raise UnknownAcceleratorError(f"no datasheet figures for accelerator {accelerator!r}; known: "
                                      f"{', '.join(sorted(ACCELERATOR_SPECS))}") from None
    if cap < 1.0 and curve is None:
        raise ValueError("a power cap below 1.0 needs the inference power curve (fit_power_curve(kind='inference'))")
    slow = curve.throughput_at(cap) if cap < 1.0 else 1.0
    draw = curve.power_at(cap) if cap < 1.0 else 1.0
    power = device_power(accelerator, full_w)
    prefill = spec.peak_tflops * 1e12 * model.prefill_efficiency / (2 * model.params_b * 1e9) * slow
    step = model.weight_bytes / (model.devices_per_replica * spec.memory_tbps * 1e12 * model.decode_efficiency) / slow
    decode = model.batch / step / model.devices_per_replica
    busy = power.idle_w + (power.full_w - power.idle_w) * draw
    return TokenRates(accelerator, cap, prefill, decode, step, busy, power.idle_w, model.devices_per_replica)


def electricity_usd(joules, price_usd_per_mwh, pue: float):
    """USD of ``joules`` drawn by devices at a grid price, the building's overhead (PUE) included."""
    return np.asarray(joules) / JOULES_PER_MWH * np.asarray(price_usd_per_mwh) * pue


@dataclass(frozen=True)
class TokenPrice:
    """USD per token (context + generated) of one cloud in one hour."""

    electricity: float
    rental: float

    @property
    def total(self) -> float:
        return self.electricity + self.rental


def price_per_token(rates: TokenRates, context_mean: float, generated_mean: float, price_usd_per_mwh: float,
                    pue: float, rental_per_device_hour: float, utilisation: float) -> TokenPrice:
    """Electricity x energy per token x PUE, plus the device-hour price over the tokens a device serves in an hour.

    A device is paid for every hour it runs but serves only ``utilisation`` of its
    rate, so the rental per token is spread over that many tokens.
    """
    tokens = context_mean + generated_mean
    joules = float(rates.energy_j(context_mean, generated_mean)) / tokens
    served_per_hour = rates.mix_tps(context_mean, generated_mean) * 3600 * max(utilisation, 1e-9)
    return TokenPrice(float(electricity_usd(joules, price_usd_per_mwh, pue)), rental_per_device_hour / served_per_hour)
