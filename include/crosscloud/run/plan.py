"""The plan of one run: written by ``partition``, read by every later stage.

It is stored as ``<tenant>/runs/<run_id>/plan.json`` in the local cloud's store
and travels between Airflow tasks by that key, never as a copy that can drift.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crosscloud.core.job import JobSpec, OuterConfig
from crosscloud.core.keys import RunKeys
from crosscloud.core.presets import ModelConfig
from crosscloud.store.base import ObjectStore
from crosscloud.store.chunks import BlobRef


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CloudAssignment(_Model):
    """One cloud's sub-task: where it runs, on what, and which part of the job."""

    name: str
    role: str
    method: str
    accelerator: str
    devices: int
    throughput: float = Field(description="effective throughput: devices x relative speed for the model family")
    share: int = Field(description="sequences of the global batch this cloud trains per inner step")
    shards: list[int]
    image: str


class Candidate(_Model):
    """A cloud's pool considered by placement, and why it was taken or not."""

    cloud: str
    accelerator: str = ""  # plans written before pools were named per candidate have none
    chosen: bool
    reason: str


class ProgramRef(_Model):
    """The training program of a run: as the user named it, its code as a blob, and its model family."""

    name: str
    file: str = Field(description="the program's file name, kept so tracebacks name it")
    code: BlobRef
    family: str
    # the registered model's name under the tenant, and global 0's architecture (store.header); empty in plans
    # written before models were named per program: those register under the byte-LM preset's old name
    model: str = ""
    architecture: str = ""
    parameters: int = 0


class Plan(_Model):
    """Where a run trains and on what; the job, model and outer step are kept as their own types.

    Pydantic stores the dataclasses under "job", "model" and "outer" as plain objects of their
    fields, the shape plans have always had, and builds them (checks included) when a plan loads.
    """

    version: int = 1
    tenant: str
    run_id: str
    federation: str
    federation_path: str
    federation_sha256: str = ""  # the admitted federation file's digest; every stage checks its own against it
    job: JobSpec
    model: ModelConfig
    outer: OuterConfig
    coordinator_cloud: str
    clouds: list[CloudAssignment]
    candidates: list[Candidate]
    dataset: str
    shards: list[BlobRef]
    held_out: list[BlobRef]
    init: BlobRef | None = None  # weights the run starts from (a retrain's); None: the builder cloud builds global 0
    program: ProgramRef | None = None
    shard_names: list[str] = Field(default_factory=list)  # the files' names (a files dataset's own); empty: shard-NNN.bin
    held_out_names: list[str] = Field(default_factory=list)
    # how admission sized the run (crosscloud.scheduler.sizing): source, measured, memory_gb, seconds_per_sample
    sizing: dict = Field(default_factory=dict)
    tracking: dict = Field(default_factory=dict)
    created_at: float = 0.0  # when the run was admitted: its age in the artifacts' demand

    @field_validator("held_out", mode="before")
    @classmethod
    def _one_or_more(cls, value):
        return [value] if isinstance(value, (dict, BlobRef)) else value

    def shard_name(self, index: int) -> str:
        return self.shard_names[index] if self.shard_names else f"shard-{index:03d}.bin"

    def held_out_name(self, index: int) -> str:
        return self.held_out_names[index] if self.held_out_names else f"held-out-{index:03d}.bin"

    @property
    def keys(self) -> RunKeys:
        return RunKeys(self.tenant, self.run_id)

    @property
    def spec(self) -> JobSpec:
        """The job spec (the stored ``job``, not a copy)."""
        return self.job

    @property
    def overlap(self) -> bool:
        """Whether round r's exchange runs while round r + 1 computes (one-round-delayed global)."""
        return self.spec.overlap

    @property
    def compression(self) -> str:
        """How pseudo-gradients travel; a single cluster exchanges nothing over a WAN, so exactly."""
        return "none" if self.spec.mode == "single_cluster" else self.spec.compression

    def cloud(self, name: str) -> CloudAssignment:
        for c in self.clouds:
            if c.name == name:
                return c
        raise KeyError(f"cloud {name!r} is not in the plan of run {self.run_id}; planned: {[c.name for c in self.clouds]}")

    @property
    def store_clouds(self) -> list[str]:
        """The clouds whose stores the run uses: every cloud of the plan, and the home (coordinator) cloud, whose
        store holds the run's records (plan, round members, history) even when it trains no part (drained or full
        when the run was placed)."""
        names = [c.name for c in self.clouds]
        return names if self.coordinator_cloud in names else names + [self.coordinator_cloud]

    @property
    def builder(self) -> str:
        """The cloud whose sub-task builds global 0 when the run starts from no given weights: the home
        (coordinator) cloud when it trains, else the first cloud of the plan."""
        names = [c.name for c in self.clouds]
        return self.coordinator_cloud if self.coordinator_cloud in names else names[0]

    def evaluates(self, cloud: str) -> bool:
        """Whether ``cloud``'s sub-task may evaluate globals: the home cloud when it trains; when it trains no part,
        any cloud of the plan (the builder evaluates global 0, each round's first member the round's global)."""
        return cloud == self.coordinator_cloud or self.coordinator_cloud not in {c.name for c in self.clouds}

    def needs(self, cloud: str) -> list[BlobRef]:
        """What the sub-task on ``cloud`` reads: its shards, the given initial model, the program, and the held-out
        data where it may evaluate."""
        return ([self.shards[i] for i in self.cloud(cloud).shards] + ([self.init] if self.init else [])
                + ([self.program.code] if self.program else []) + (list(self.held_out) if self.evaluates(cloud) else []))

    def save(self, store: ObjectStore) -> None:
        store.put(self.keys.plan, self.model_dump_json(indent=2).encode())

    @classmethod
    def load(cls, store: ObjectStore, tenant: str, run_id: str) -> Plan:
        return cls.model_validate(json.loads(store.get(RunKeys(tenant, run_id).plan)))
