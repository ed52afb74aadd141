"""The federation's clouds as one placement hour of a served model sees them.

Why from the federation and not the benchmark's file: the DAG places a real
tenant's traffic over the clouds it has, so every input comes from where the
rest of crosscloud keeps it: the cloud's pool (accelerator, power, device-hour
price), its grid (price region, PUE; the price of the hour from the
electricity feed, as the inventory reads it), its jurisdiction, the tenant's
quota (devices it may serve on) and the link from the cloud nearest the
tenant's users (network distance). The served model's size comes from its
weights. A cloud that cannot be priced or reached is refused with the reason,
never silently given a price of zero.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from crosscloud.core.federation import Cloud, Federation
from crosscloud.energy.power import PowerModelError
from crosscloud.pool.inventory import electricity_now
from crosscloud.pool.placement import Considered
from crosscloud.serving.replica import refusal
from crosscloud.serving.energy import (ACCELERATOR_SPECS, ServedModel, TokenRates, UnknownAcceleratorError,
                                       price_per_token, token_rates)
from crosscloud.serving.traffic import CloudOffer

LOCAL_BATCH = 1  # crosscloud's own server generates one request at a time: one M/M/c server a replica


@dataclass(frozen=True)
class RequestMix:
    """The tenant's requests in tokens: their means, and a fixed sample around them for the latency tail."""

    context_mean: float
    generated_mean: float

    def sample(self, n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Exponentially spread token counts with these means (a fixed seed: the same sample every hour)."""
        rng = np.random.default_rng(seed)
        ctx = np.maximum(1, np.round(rng.exponential(self.context_mean, n)))
        gen = np.maximum(1, np.round(rng.exponential(self.generated_mean, n)))
        return ctx, gen


def served_model(weights: bytes, devices_per_replica: int = 1, batch: int = 32, name: str = "served") -> ServedModel:
    """The model's size for the energy model, read from its safetensors weights (parameters and bytes each)."""
    from crosscloud.store.tensors import from_bytes

    params = sum(t.numel() for t in from_bytes(weights).values())
    return ServedModel(name=name, params_b=params / 1e9, bytes_per_param=len(weights) / max(params, 1),
                       devices_per_replica=devices_per_replica, batch=batch)


def rtt_ms(fed: Federation, users_near: str, cloud: str) -> float | None:
    """Round trip from the tenant's users (near cloud ``users_near``) to ``cloud``: 0 there, else the link's latency."""
    if cloud == users_near:
        return 0.0
    link = fed.link(users_near, cloud)
    return None if link is None else link.latency_ms


def serving_pool(cloud: Cloud):
    """The cloud's first pool whose accelerator has datasheet figures."""
    return next((p for p in cloud.pools if p.accelerator in ACCELERATOR_SPECS), None)


def measured_rates(rates: TokenRates, step_s: float) -> TokenRates:
    """``rates`` with a measured time per generated token where it is slower than the datasheet's.

    A small model on a CPU is bound by the framework's time per forward step,
    not by FLOPs or memory bandwidth, so a local replica's rate is measured on
    this host (``placement.local_step_s``) rather than modelled.
    """
    step = max(step_s, rates.step_s)
    return replace(rates, step_s=step, decode_tps=rates.decode_tps * rates.step_s / step)


def cloud_offer(fed: Federation, cloud: Cloud, tenant: str, model: ServedModel, mix: RequestMix, when: float,
                users_near: str, warm: bool, max_utilisation: float, step_s: float | None = None,
                family: str | None = None) -> CloudOffer | str:
    """The cloud's offer this hour, or why it cannot get traffic (``step_s``: a replica's measured time per token;
    ``family``: the model's, which decides whether a Kubernetes cloud can serve it)."""
    if why := refusal(cloud, family):
        return f"refused: {why}"
    pool = serving_pool(cloud)
    if pool is None:
        return f"refused: no pool with datasheet figures ({', '.join(p.accelerator for p in cloud.pools)})"
    if cloud.access.method == "kubernetes" and not fed.image_for(pool.accelerator, family):
        return f"refused: no image adapted to {family} on {pool.accelerator} (images[] of the federation) for the warm check"
    devices = min(pool.count, fed.tenant(tenant).quotas.get(cloud.name, 0))
    here = replace(model, batch=LOCAL_BATCH)
    if devices < here.devices_per_replica:
        return f"refused: tenant {tenant} may use {devices} device(s) here, a replica needs {here.devices_per_replica}"
    distance = rtt_ms(fed, users_near, cloud.name)
    if distance is None:
        return f"refused: no link from {users_near} (where the users are): its network distance is unknown"
    usd_mwh, hour, note = electricity_now(cloud, when)
    if usd_mwh is None:
        return f"refused: no electricity price for {hour or 'this hour'} ({note})"
    try:
        rates = token_rates(pool.accelerator, here, full_w=pool.power_w)
    except (UnknownAcceleratorError, PowerModelError) as e:
        return f"refused: {e}"
    rates = measured_rates(rates, step_s) if step_s else rates
    devices -= devices % here.devices_per_replica
    ctx, gen = mix.sample()
    pue = cloud.grid.pue
    price = price_per_token(rates, mix.context_mean, mix.generated_mean, usd_mwh, pue, pool.price_per_device_hour,
                            max_utilisation)
    return CloudOffer(cloud.name, pool.accelerator, cloud.jurisdiction,
                      devices * rates.mix_tps(mix.context_mean, mix.generated_mean), price.total, distance,
                      rates.service_s(ctx, gen), devices, here.devices_per_replica, here.batch, rates.busy_w,
                      rates.idle_w, pue, warm=warm, electricity_per_token=price.electricity)


def federation_offers(fed: Federation, tenant: str, clouds: list[str], model: ServedModel, mix: RequestMix,
                      when: float, users_near: str, warm: dict[str, bool], max_utilisation: float,
                      step_s: float | None = None, family: str | None = None) -> tuple[list[CloudOffer], list[Considered]]:
    """Offers of the named clouds, and a reason for each cloud refused before the traffic plan."""
    offers, refused = [], []
    for name in clouds:
        cloud = fed.cloud(name)
        made = cloud_offer(fed, cloud, tenant, model, mix, when, users_near, warm.get(name, False), max_utilisation,
                           step_s, family)
        if isinstance(made, str):
            refused.append(Considered(name, ", ".join(p.accelerator for p in cloud.pools), False, made))
        else:
            offers.append(made)
    return offers, refused


def offer_to_dict(o: CloudOffer) -> dict:
    """A JSON form of an offer, so a later task (a grid request) re-plans from the same figures."""
    return {**{k: getattr(o, k) for k in CloudOffer.__dataclass_fields__ if k != "service_s"},
            "service_s": [float(f"{s:.6g}") for s in o.service_s]}


def offer_from_dict(d: dict) -> CloudOffer:
    return CloudOffer(**{**d, "service_s": np.array(d["service_s"])})
