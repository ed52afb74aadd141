"""What to probe before a program's first placement on a pool: a short run of the program's own first steps.

A run with ``probe_steps`` > 0 first measures its program on every accelerator
type it may be placed on that no run has measured this program and model on
yet. Each probe is a real run: one device of one cloud of that type (the one
whose devices hold the most memory), one round of ``probe_steps`` inner steps
of the program's own loop on the run's dataset, admitted through the queue
like any run and never tracked. Its aggregate records what it measured in the
ledger (``ledger.figures``), as every run's does, so the run itself is then
sized, checked against each pool's memory and placed by measured figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from crosscloud.core.federation import Federation
from crosscloud.core.job import JobSpec
from crosscloud.ledger import Ledger


@dataclass(frozen=True)
class Probe:
    """One accelerator type to measure the program on, the cloud that measures it, and the probe run's job."""

    accelerator: str
    cloud: str
    spec: JobSpec

    def run_id(self, run_id: str) -> str:
        return f"{run_id}-probe-{self.cloud}"


def probe_spec(spec: JobSpec, cloud: str, batch: int) -> JobSpec:
    """The probe's job: the run's program, arguments and dataset; one device, one round of its first steps."""
    return dataclasses.replace(
        spec, clouds=[cloud], placement="spread", devices_per_cloud=1, mode="cross_cloud", rounds=1,
        inner_steps=spec.probe_steps, eval_every_steps=spec.probe_steps, global_batch=batch, probe_steps=0,
        deadline="", deferrable=False, adapt_shares=False, follow_prices=False)


def probes(fed: Federation, spec: JobSpec, family: str, program_sha256: str, architecture: str,
           ledger: Ledger) -> list[Probe]:
    """The probes the run needs: one per accelerator type among the clouds it may use that has an image for the
    program's family and no measured figure of this program and model; none without ``probe_steps``."""
    if spec.probe_steps <= 0 or not architecture:
        return []
    known = ledger.figures.lookup(spec.tenant, program_sha256, architecture)
    usable = spec.usable_clouds(fed)
    best: dict[str, tuple[float, str]] = {}
    for name in usable:
        for pool in fed.cloud(name).pools:
            if pool.accelerator in known or fed.image_for(pool.accelerator, family) is None:
                continue
            if pool.accelerator not in best or pool.memory_gb > best[pool.accelerator][0]:
                best[pool.accelerator] = (pool.memory_gb, name)
    ranks = max(1, len(usable) * spec.devices_per_cloud)
    batch = max(1, spec.global_batch // ranks)  # about one rank's batch in the run itself
    return [Probe(accelerator, cloud, probe_spec(spec, cloud, batch))
            for accelerator, (_, cloud) in sorted(best.items())]
