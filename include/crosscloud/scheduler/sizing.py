"""How long a run's samples take and how much memory a device needs: measured, declared, or estimated, and said which.

Admission resolves a run's ``Sizing`` once, in this order, and placement, the
memory check and the queue's cost estimates read only it:

1. **measured**: what earlier runs of the same program and model measured on
   each accelerator type (``ledger.figures``, from ``measured_figures`` of
   each finished run);
2. **declared**: the program's ``figures(args)`` (or ``FIGURES``), e.g. the
   byte-LM example's presets;
3. **estimated** from the model's parameter count (admission's meta-device
   layout), against the byte-LM reference: the run says it is an estimate;
4. the byte-LM preset of the job's ``model_size`` when nothing is known of the
   model at all.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from crosscloud.core.job import JobSpec
from crosscloud.core.presets import PRESETS, SAMPLE_SECONDS
from crosscloud.ledger.figures import Figure
from crosscloud.pool.placement import ANY_ACCELERATOR
from crosscloud.run.plan import Plan

# bytes of device memory per parameter a run needs besides activations: fp32 weights, gradients, AdamW's two
# moments and DiLoCo's fp32 copy of the round's start
BYTES_PER_PARAMETER = 20
ACTIVATION_MARGIN = 1.25  # what activations add at a small batch, as a factor on the above
# the byte-LM reference: seconds per sample per parameter on a device of speed 1 ("small", measured)
REFERENCE = SAMPLE_SECONDS["small"] / PRESETS["small"].parameters()


@dataclass(frozen=True)
class Sizing:
    """What one sample costs on each accelerator type (device-seconds at relative speed 1), what one device must
    hold, and where the figures came from."""

    seconds_per_sample: dict[str, float]  # by accelerator type; ANY_ACCELERATOR for the others
    memory_gb: float
    source: str
    measured: bool = False
    parameters: int = 0

    def runtime_s(self, spec: JobSpec) -> dict[str, float]:
        """Device-seconds the whole run needs, by accelerator type."""
        samples = spec.rounds * spec.inner_steps * spec.global_batch
        return {a: samples * s for a, s in self.seconds_per_sample.items()}


def preset_sizing(spec: JobSpec) -> Sizing:
    """The byte-LM preset of ``model_size``: the estimate for a model nothing is known of."""
    cfg = PRESETS[spec.model_size]
    return Sizing({ANY_ACCELERATOR: SAMPLE_SECONDS[spec.model_size]}, cfg.min_train_memory_gb(),
                  f"an estimate: the byte-LM preset {spec.model_size!r} (nothing is known of this model yet)",
                  parameters=cfg.parameters())


def resolve_sizing(spec: JobSpec, measured: dict[str, Figure], declared: dict | None, parameters: int) -> Sizing:
    """The run's sizing from the best figures there are (see the module's docstring)."""
    if measured:
        return _measured(measured, parameters)
    if declared:
        return _declared(declared, parameters)
    if parameters:
        return Sizing({ANY_ACCELERATOR: REFERENCE * parameters},
                      BYTES_PER_PARAMETER * ACTIVATION_MARGIN * parameters / 1e9,
                      f"an estimate from its {parameters:,} parameters (no run of this program and model has "
                      "measured it yet)", parameters=parameters)
    return preset_sizing(spec)


def _measured(figures: dict[str, Figure], parameters: int) -> Sizing:
    per = {a: f.seconds_per_sample for a, f in figures.items()}
    per[ANY_ACCELERATOR] = statistics.median(per.values())  # speeds are normalised: other types scale from it
    runs = sum(f.runs for f in figures.values())
    where = ", ".join(f"{a} ({f.runs} run(s), peak {f.peak_memory_gb:.2f} GB at batch {f.batch})"
                      for a, f in sorted(figures.items()))
    return Sizing(per, max(f.peak_memory_gb for f in figures.values()), f"measured by {runs} run(s) on {where}",
                  measured=True, parameters=parameters or max(f.parameters for f in figures.values()))


def _declared(declared: dict, parameters: int) -> Sizing:
    sps = declared.get("seconds_per_sample")
    per = dict(sps) if isinstance(sps, dict) else {ANY_ACCELERATOR: float(sps)}
    if ANY_ACCELERATOR not in per:
        per[ANY_ACCELERATOR] = statistics.median(per.values())
    return Sizing(per, float(declared.get("memory_gb", 0.0)), "declared by the program (figures(args))",
                  parameters=parameters)


def measured_figures(plan: Plan, history: list[dict]) -> list[Figure]:
    """What a finished run measured of its program on each accelerator type it trained on: device-seconds per
    sample at speed 1, from the median of its inner steps (robust to the steps a fold-in or a slow neighbour
    lengthened; the run's first step, which warms up, left out), and the largest peak memory of a rank."""
    if plan.program is None or not plan.program.architecture:
        return []
    per_sample: dict[str, list[float]] = {}
    peaks: dict[str, list[tuple[float, int]]] = {}
    for c in plan.clouds:
        speed = c.throughput / c.devices if c.devices else 1.0
        rounds = [r["clouds"][c.name] for r in history if c.name in r.get("clouds", {})]
        for i, m in enumerate(rounds):
            steps = list(m.get("step_s") or [])[1 if i == 0 else 0:]
            if not m.get("samples") or not steps:
                continue
            per_step = m["samples"] / len(m["step_s"])
            per_sample.setdefault(c.accelerator, []).extend(t * c.devices * speed / per_step for t in steps)
            peaks.setdefault(c.accelerator, []).append((float(m.get("peak_memory_gb") or 0.0), int(m.get("batch") or 0)))
    return [Figure(plan.tenant, plan.program.code.sha256, plan.program.architecture, accelerator, plan.program.parameters,
                   statistics.median(seen), max(p for p, _ in peaks[accelerator]),
                   max(b for _, b in peaks[accelerator]), run_id=plan.run_id, name=plan.program.name)
            for accelerator, seen in sorted(per_sample.items())]
