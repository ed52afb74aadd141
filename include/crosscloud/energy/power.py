"""Power model per accelerator type, throughput against power cap, PUE, and the effective device-hour price.

Placement, electricity-following and demand response all price a device-hour
the same way: rental plus energy at the grid's price and PUE, with power drawn
at a cap read from measured DVFS sweeps (``PowerCurve``) rather than assumed
linear. How the curve is fitted is in ``docs/energy-and-grid.md``.
"""

from __future__ import annotations

import bisect
import csv
import os
from dataclasses import dataclass
from pathlib import Path

from crosscloud.core.paths import data_dir


@dataclass(frozen=True)
class DevicePower:
    idle_w: float
    full_w: float


# Full = board power limit (TDP); idle = typical idle draw of one device.
DEVICE_POWER: dict[str, DevicePower] = {
    "cpu": DevicePower(10.0, 65.0),
    "nvidia-k80": DevicePower(25.0, 150.0),   # one GK210 (half a 300 W K80 board)
    "nvidia-p100": DevicePower(30.0, 250.0),
    "nvidia-v100": DevicePower(40.0, 300.0),
    "nvidia-a100": DevicePower(50.0, 400.0),
    "nvidia-h100": DevicePower(70.0, 700.0),
    "nvidia-h200": DevicePower(75.0, 700.0),
    "ascend-910b": DevicePower(60.0, 400.0),
    "hygon-k100": DevicePower(50.0, 300.0),
}
# Gavel's worker-type names
DEVICE_POWER.update({"k80": DEVICE_POWER["nvidia-k80"], "p100": DEVICE_POWER["nvidia-p100"], "v100": DEVICE_POWER["nvidia-v100"]})

DEFAULT_PUE = 1.2


class PowerModelError(ValueError):
    pass


def device_power(accelerator: str, full_w: float | None = None) -> DevicePower:
    """Idle and full power of one device; ``full_w`` (e.g. a pool's ``power_w``) overrides the full power."""
    try:
        base = DEVICE_POWER[accelerator]
    except KeyError:
        raise PowerModelError(f"no power model for accelerator {accelerator!r}; known: {', '.join(sorted(DEVICE_POWER))}") from None
    if full_w is None:
        return base
    return DevicePower(min(base.idle_w, full_w), full_w)


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0] * max(x, 0.0) / xs[0] if xs[0] > 0 else ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class PowerCurve:
    caps: tuple[float, ...]  # cap fractions, ascending, last 1.0
    throughput: tuple[float, ...]  # normalized throughput at each cap (non-decreasing, last 1.0)
    power: tuple[float, ...]  # drawn power / drawn power at full cap (non-decreasing, last 1.0)
    workloads: tuple[str, ...] = ()

    @property
    def min_cap(self) -> float:
        return self.caps[0]

    def throughput_at(self, cap_fraction: float) -> float:
        """Normalized throughput at a power cap of ``cap_fraction`` of the full cap."""
        return _interp(list(self.caps), list(self.throughput), cap_fraction)

    def power_at(self, cap_fraction: float) -> float:
        """Drawn power, as a fraction of the draw at full cap, at ``cap_fraction``."""
        return _interp(list(self.caps), list(self.power), cap_fraction)

    def cap_for_power(self, fraction: float) -> float:
        """The largest cap fraction whose drawn power is at most ``fraction`` of the full-cap draw."""
        if fraction >= 1.0:
            return 1.0
        if fraction <= 0.0:
            return 0.0
        xs, ys = [0.0, *self.caps], [0.0, *self.power]
        for i in range(len(xs) - 1, 0, -1):
            if ys[i - 1] <= fraction:
                if ys[i] == ys[i - 1]:
                    return xs[i]
                return xs[i - 1] + (xs[i] - xs[i - 1]) * (min(fraction, ys[i]) - ys[i - 1]) / (ys[i] - ys[i - 1])
        return 0.0


def fit_power_curve(path: str | os.PathLike | None = None, kind: str = "training") -> PowerCurve:
    """Fit ``PowerCurve`` from a DVFS sweep CSV; ``kind``: 'training', 'inference' or 'all'."""
    path = Path(path) if path is not None else data_dir() / "power" / "dvfs_sweep.csv"
    try:
        rows = list(csv.DictReader(path.read_text().splitlines()))
    except OSError as e:
        raise PowerModelError(f"{path}: cannot read the DVFS sweep: {e} (set CROSSCLOUD_DATA_DIR)") from None
    need = {"Workload", "GPU power cap", "normalized throughput", "power per GPU"}
    if not rows or not need <= set(rows[0]):
        raise PowerModelError(f"{path}: expected columns {sorted(need)}")
    by_workload: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        name = r["Workload"]
        is_inf = name.startswith("infer")
        if (kind == "training" and is_inf) or (kind == "inference" and not is_inf):
            continue
        by_workload.setdefault(name, []).append((float(r["GPU power cap"]), float(r["normalized throughput"]), float(r["power per GPU"])))
    if not by_workload:
        raise PowerModelError(f"{path}: no {kind} workloads")
    sums: dict[float, list[float]] = {}
    for points in by_workload.values():
        top_cap, _, top_power = max(points)
        for cap, thr, pw in points:
            acc = sums.setdefault(round(cap / top_cap, 6), [0.0, 0.0, 0])
            acc[0] += thr
            acc[1] += pw / top_power
            acc[2] += 1
    caps = sorted(sums)
    thr = [sums[c][0] / sums[c][2] for c in caps]
    pw = [sums[c][1] / sums[c][2] for c in caps]
    if caps[-1] != 1.0:
        caps.append(1.0)
        thr.append(1.0)
        pw.append(1.0)
    thr[-1], pw[-1] = 1.0, 1.0
    for i in range(1, len(caps)):  # monotone
        thr[i] = max(thr[i], thr[i - 1])
        pw[i] = max(pw[i], pw[i - 1])
    for i in range(len(caps) - 2, -1, -1):  # and never above the full-cap value
        thr[i] = min(thr[i], thr[i + 1])
        pw[i] = min(pw[i], pw[i + 1])
    return PowerCurve(tuple(caps), tuple(thr), tuple(pw), tuple(sorted(by_workload)))


def energy_price_per_device_hour(power_w: float, price_usd_per_mwh: float, pue: float = DEFAULT_PUE) -> float:
    """USD per device-hour of electricity: ``power_w/1000 kW x USD/MWh / 1000 x PUE``."""
    return power_w / 1000.0 * price_usd_per_mwh / 1000.0 * pue


def effective_price(rental_per_device_hour: float, power_w: float, price_usd_per_mwh: float, pue: float = DEFAULT_PUE) -> float:
    """Effective device-hour price: rental + energy at the electricity price x PUE."""
    return rental_per_device_hour + energy_price_per_device_hour(power_w, price_usd_per_mwh, pue)
