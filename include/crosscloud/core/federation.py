"""The federation: every cloud a deployment knows, declared in one YAML file.

The file is validated as a whole when it is loaded, so that a typo fails before
any job starts, with a message naming the file, the field and what is expected.
Credentials never live here: a cloud names the Airflow Connection (or the
environment) that holds them.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from crosscloud.core.keys import validate_name

DEFAULT_FEDERATION = Path(__file__).resolve().parents[2] / "config" / "federation.yaml"

# Accelerator types crosscloud knows how to describe; a pool of any other type is
# a typo far more often than a new chip, so it is refused with this list.
ACCELERATOR_TYPES = (
    "cpu",
    "nvidia-k80",
    "nvidia-p100",
    "nvidia-v100",
    "nvidia-a100",
    "nvidia-h100",
    "nvidia-h200",
    "ascend-910b",
    "hygon-k100",
)


class FederationError(ValueError):
    """A federation file that cannot be used, with the field and the fix."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesPool(_Model):
    """How a pool's devices are asked for on Kubernetes; unset fields take the accelerator type's defaults."""

    resource: str | None = Field(default=None, description="extended resource name, e.g. nvidia.com/gpu")
    devices_per_pod: int | None = Field(default=None, gt=0, description="devices of one pod (one node's share)")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, str | int]] = Field(default_factory=list)
    cpu: str = "4"
    memory: str = "16Gi"


class AcceleratorPool(_Model):
    """A cloud's devices of one type."""

    accelerator: str
    count: int = Field(gt=0)
    throughput: dict[str, float] = Field(
        default_factory=lambda: {"default": 1.0},
        description="relative throughput per model family; 'default' covers the rest",
    )
    power_w: float = Field(gt=0, description="power draw of one device at full load, watts")
    price_per_device_hour: float = Field(ge=0)
    memory_gb: float = Field(default=16.0, gt=0)
    kubernetes: KubernetesPool | None = None

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, value: str) -> str:
        if value not in ACCELERATOR_TYPES:
            raise ValueError(f"unknown accelerator type {value!r}; expected one of {', '.join(ACCELERATOR_TYPES)}")
        return value

    @field_validator("throughput")
    @classmethod
    def _positive_throughput(cls, value: dict[str, float]) -> dict[str, float]:
        if "default" not in value:
            raise ValueError("throughput needs a 'default' entry (relative speed for families not listed)")
        bad = {k: v for k, v in value.items() if v <= 0}
        if bad:
            raise ValueError(f"throughput must be > 0, got {bad}")
        return value

    def throughput_for(self, family: str) -> float:
        return self.throughput.get(family, self.throughput["default"])


class ObjectStoreSpec(_Model):
    """Where a cloud keeps objects: ``file://folder`` or ``s3://bucket/prefix``."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    connection_id: str | None = Field(default=None, description="Airflow Connection holding the credentials")
    # how long a transient failure (unreachable, throttled, 5xx) is retried, with exponential backoff, before it is an error
    retry_deadline_s: float = Field(default=120.0, gt=0)
    retry_backoff_s: float = Field(default=0.2, gt=0, description="first wait between tries; doubles each time")
    retry_backoff_max_s: float = Field(default=5.0, gt=0)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not (value.startswith("file://") or value.startswith("s3://")):
            raise ValueError(f"store url {value!r} must start with file:// or s3://")
        return value

    @field_validator("connection_id")
    @classmethod
    def _only_tenant_placeholder(cls, value: str | None) -> str | None:
        try:
            value is None or value.format(tenant="t")
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"{value!r}: the only placeholder allowed is {{tenant}}") from None
        return value


class Access(_Model):
    """How sub-tasks are started on a cloud (the backend) and its settings."""

    method: Literal["local", "kubernetes", "ssh"]
    connection_id: str | None = None
    namespace: str | None = None
    queue: str | None = None
    # kubernetes: the queue's scheduler; kueue sets the queue-name label, volcano the schedulerName
    scheduler: Literal["default", "kueue", "volcano"] = "default"
    store_secret: str | None = Field(default=None, description="Kubernetes Secret with the store keys of each tenant")
    # ssh: the prepared environment on the host (host, port and user may also come from the Connection)
    host: str | None = None
    port: int = Field(default=22, gt=0, lt=65536)
    user: str | None = None
    workdir: str | None = Field(default=None, description="folder on the host for sub-task files (ssh)")
    python: str | None = Field(default=None, description="interpreter of the prepared environment on the host (ssh)")
    env: dict[str, str] = Field(default_factory=dict, description="non-secret environment of the sub-task")
    serve_host: str | None = Field(default=None, description="ssh: the address serving replicas listen on and the "
                                   "router reaches them at (default: the host's address as SSH reached it)")
    serve_service_type: Literal["ClusterIP", "LoadBalancer"] = Field(
        default="ClusterIP", description="kubernetes: the type of a served model's Service; LoadBalancer when the "
        "router runs outside the cluster's network and reaches the Service at its external address")

    @field_validator("env")
    @classmethod
    def _variable_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"access.env: {bad} are not environment variable names (letters, digits, _)")
        return value

    @model_validator(mode="after")
    def _method_settings(self) -> Access:
        if self.method == "ssh":
            missing = [f for f in ("workdir", "python") if not getattr(self, f)]
            if missing:
                raise ValueError(f"access.{missing[0]}: required for method ssh (workdir: a folder on the host for "
                                 "sub-task files; python: the prepared environment's interpreter, e.g. /opt/crosscloud/.venv/bin/python)")
            if not (self.host or self.connection_id):
                raise ValueError("access.host: method ssh needs a host, or a connection_id naming an SSH Connection")
        return self


class Grid(_Model):
    """The electricity grid a cloud draws from: price region, carbon zone and PUE.

    ``region`` names a price file of the electricity feed
    (``<data>/electricity/prices/<REGION>_<YEAR>.csv``, see ``crosscloud.energy.prices``);
    it is checked when the feed is read (an unknown region is refused, naming it),
    not at load, so a federation loads without the data present.
    """

    region: str = Field(min_length=1)
    carbon_zone: str | None = None
    pue: float = Field(default=1.2, ge=1.0, le=3.0)
    note: str | None = None

    @field_validator("region", "carbon_zone")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "/" in value or value != value.strip()):
            raise ValueError(f"{value!r} must be a region name such as 'DE-LU' (no spaces or slashes)")
        return value


class PowerMetrics(_Model):
    """Where a cloud's measured power is read: a Prometheus HTTP API, e.g. scraping NVIDIA's DCGM exporter.

    A demand-response cut on a cloud with this set holds only once the measured draw has fallen too.
    """

    prometheus_url: str = Field(description="base URL of the Prometheus HTTP API, e.g. http://prometheus:9090")
    query: str = Field(default="sum(DCGM_FI_DEV_POWER_USAGE)", description="PromQL giving the cloud's draw in watts")
    settle_s: float = Field(default=30.0, ge=0, description="wait after the cut applied before reading (a scrape interval)")


class Cloud(_Model):
    name: str
    role: Literal["local", "collaboration"]
    jurisdiction: str
    region: str
    access: Access
    store: ObjectStoreSpec
    pools: list[AcceleratorPool] = Field(min_length=1)
    # joining: receives work only after `crosscloud cloud join` proved it works; draining: no new sub-tasks
    state: Literal["active", "joining", "draining"] = "active"
    grid: Grid | None = None
    power_metrics: PowerMetrics | None = None

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return validate_name(value, "cloud name")

    @model_validator(mode="after")
    def _reachable_store(self) -> Cloud:
        if self.access.method == "kubernetes" and not self.store.url.startswith("s3://"):
            raise ValueError(f"clouds.{self.name}.store.url: a kubernetes cloud's pods cannot read {self.store.url}; "
                             "give it an s3:// store")
        return self


class Link(_Model):
    """A network path between two clouds."""

    a: str
    b: str
    bandwidth_mbps: float = Field(gt=0)
    latency_ms: float = Field(ge=0)
    emulate: bool = False


class Tenant(_Model):
    name: str
    quotas: dict[str, int] = Field(description="devices the tenant may use per cloud")
    weight: float = Field(1.0, gt=0, description="its fair share of the queue against the other tenants' weights")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return validate_name(value, "tenant name")

    @field_validator("quotas")
    @classmethod
    def _non_negative(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in value.items() if v < 0}
        if bad:
            raise ValueError(f"quotas must be >= 0, got {bad}")
        return value


class Image(_Model):
    """An image adapted to one accelerator type for one model family."""

    accelerator: str
    family: str
    image: str


class Dataset(_Model):
    """Training data: the standard library's source (built offline anywhere), or files a team put in a store.

    ``files``: every object under ``<tenant>/<prefix>`` in the home cloud's store is one training
    shard (tokenized ``.bin``/``.npy``/safetensors or Parquet, as the program reads them), and every
    object under ``<tenant>/<eval_prefix>`` is held out for evaluation. A team puts them there
    (``crosscloud dataset put``), or names a ``prepare`` script that writes them on first use.
    """

    name: str
    source: Literal["python-stdlib", "files"]
    shards: int | None = Field(default=None, gt=0, description="python-stdlib: how many shards to cut")
    home: str = Field(description="cloud where the raw data lives")
    residency: str | None = Field(default=None, description="jurisdiction the raw data may not leave")
    prefix: str | None = Field(default=None, description="files: the training shards' folder in the home store")
    eval_prefix: str | None = Field(default=None, description="files: the held-out files' folder in the home store")
    prepare: str | None = Field(default=None, description="files: a script (relative to the project folder) run as "
                                "`python SCRIPT --out DIR` to write DIR/train and DIR/val when the store has none yet")

    @model_validator(mode="after")
    def _source_settings(self) -> Dataset:
        if self.source == "python-stdlib" and self.shards is None:
            raise ValueError(f"datasets.{self.name}.shards: required for source python-stdlib (how many shards to cut)")
        if self.source == "files":
            missing = [f for f in ("prefix", "eval_prefix") if not getattr(self, f)]
            if missing:
                raise ValueError(f"datasets.{self.name}.{missing[0]}: required for source files (a folder in the "
                                 f"store of cloud {self.home}, below the tenant, e.g. datasets/{self.name}/train/)")
        return self


class Jurisdiction(_Model):
    exports: list[Literal["checkpoints", "pseudo_gradients", "data"]] = Field(
        default_factory=lambda: ["checkpoints", "pseudo_gradients", "data"],
        description="what may leave this jurisdiction",
    )


class Federation(_Model):
    name: str
    jurisdictions: dict[str, Jurisdiction]
    clouds: list[Cloud] = Field(min_length=1)
    links: list[Link] = Field(default_factory=list)
    tenants: list[Tenant] = Field(min_length=1)
    images: list[Image] = Field(min_length=1)
    datasets: list[Dataset] = Field(min_length=1)
    wait_for_faster_pools: bool = Field(False, description=(
        "whether a queued run that could start now may instead wait for a faster pool on which it would finish "
        "sooner (default: it starts now, on the best pool free to it)"))

    @model_validator(mode="after")
    def _consistent(self) -> Federation:
        names = [c.name for c in self.clouds]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"clouds: duplicate cloud name(s) {dupes}; each cloud needs a unique name")
        locals_ = [c.name for c in self.clouds if c.role == "local"]
        if len(locals_) != 1:
            raise ValueError(f"clouds: exactly one cloud must have role 'local', found {locals_ or 'none'}")
        known = set(names)
        for cloud in self.clouds:
            if cloud.jurisdiction not in self.jurisdictions:
                raise ValueError(
                    f"clouds.{cloud.name}.jurisdiction: {cloud.jurisdiction!r} is not declared under jurisdictions"
                )
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in known:
                    raise ValueError(f"links.{i}: unknown cloud {end!r}; known clouds: {sorted(known)}")
        for tenant in self.tenants:
            for cloud in tenant.quotas:
                if cloud not in known:
                    raise ValueError(f"tenants.{tenant.name}.quotas: unknown cloud {cloud!r}; known clouds: {sorted(known)}")
        for cloud in self.clouds:
            conn = cloud.store.connection_id
            sharing = sorted(t.name for t in self.tenants if t.quotas.get(cloud.name, 0) > 0)
            if conn and "{tenant}" not in conn and len(sharing) > 1:
                raise ValueError(
                    f"clouds.{cloud.name}.store.connection_id: {conn!r} would give tenants {sharing} the same "
                    f"credentials; write it as '{conn}_{{tenant}}' so that each tenant has its own"
                )
        for image in self.images:
            if image.accelerator not in ACCELERATOR_TYPES:
                raise ValueError(f"images: unknown accelerator type {image.accelerator!r}")
        for ds in self.datasets:
            if ds.home not in known:
                raise ValueError(f"datasets.{ds.name}.home: unknown cloud {ds.home!r}; known clouds: {sorted(known)}")
            if ds.residency is not None and ds.residency not in self.jurisdictions:
                raise ValueError(f"datasets.{ds.name}.residency: {ds.residency!r} is not declared under jurisdictions")
        return self

    def capacity(self) -> dict[tuple[str, str], int]:
        """Each pool's devices by (cloud, accelerator): what the ledger checks reservations against."""
        return {(c.name, p.accelerator): p.count for c in self.clouds for p in c.pools}

    # -- lookups with helpful errors -------------------------------------------------
    def cloud(self, name: str) -> Cloud:
        for cloud in self.clouds:
            if cloud.name == name:
                return cloud
        raise FederationError(f"unknown cloud {name!r}; the federation {self.name!r} has {[c.name for c in self.clouds]}")

    def tenant(self, name: str) -> Tenant:
        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        raise FederationError(f"unknown tenant {name!r}; the federation {self.name!r} has {[t.name for t in self.tenants]}")

    def dataset(self, name: str) -> Dataset:
        for ds in self.datasets:
            if ds.name == name:
                return ds
        raise FederationError(f"unknown dataset {name!r}; the federation {self.name!r} has {[d.name for d in self.datasets]}")

    @property
    def local_cloud(self) -> Cloud:
        return next(c for c in self.clouds if c.role == "local")

    def image_for(self, accelerator: str, family: str) -> str | None:
        for image in self.images:
            if image.accelerator == accelerator and image.family == family:
                return image.image
        return None

    def link(self, a: str, b: str) -> Link | None:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        return None


def _describe(error: dict) -> str:
    loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        msg = "field required"
    elif error["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling against include/config/federation.yaml)"
    return f"{loc}: {msg}"


def parse_federation(data: object, source: str = "<federation>") -> Federation:
    """Validate already-parsed YAML; errors name ``source`` and every bad field."""
    if not isinstance(data, dict):
        raise FederationError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Federation.model_validate(data)
    except ValidationError as exc:
        details = "\n  ".join(_describe(e) for e in exc.errors())
        raise FederationError(f"{source}: invalid federation:\n  {details}") from None


def federation_path(path: str | os.PathLike | None = None) -> Path:
    """The federation file in use: ``path``, else ``$CROSSCLOUD_FEDERATION``, else the embedded default."""
    return Path(path or os.environ.get("CROSSCLOUD_FEDERATION") or DEFAULT_FEDERATION).resolve()


def read_federation(path: str | os.PathLike | None = None) -> tuple[Federation, str]:
    """The federation file (see ``federation_path``), validated, and the sha256 of its bytes.

    The digest is what a run is admitted with: every later stage, on whichever
    host it runs, checks that it reads the same federation.
    """
    path = federation_path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FederationError(f"{path}: federation file not found (set CROSSCLOUD_FEDERATION or pass a path)") from None
    try:
        data = yaml.safe_load(raw.decode())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise FederationError(f"{path}: not valid YAML: {exc}") from None
    return parse_federation(data, str(path)), hashlib.sha256(raw).hexdigest()


def load_federation(path: str | os.PathLike | None = None) -> Federation:
    """Load and validate the federation file (see ``federation_path``)."""
    return read_federation(path)[0]
