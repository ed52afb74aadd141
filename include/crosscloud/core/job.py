"""What a user asks for when they trigger a training run: the job spec.

The DAG's Params map one to one onto these fields; everything is checked here,
before anything starts, with a message that names the field and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Literal

from crosscloud.core.keys import validate_name
from crosscloud.core.presets import PRESETS

if TYPE_CHECKING:
    from crosscloud.core.federation import Federation

MODES = ("cross_cloud", "single_cluster")
PLACEMENTS = ("spread", "auto")
LR_SCALINGS = ("none", "sqrt", "linear")
DEFAULT_PROGRAM = "examples/byte_lm/train.py"
DEFAULT_DATASET = "python-stdlib"  # what a job reads when neither it nor its program names a dataset


class JobSpecError(ValueError):
    """A job parameter that is out of range or inconsistent."""


def key_values(items: list[str], flag: str = "--arg") -> dict:
    """``K=V`` command-line pairs (``crosscloud train --arg``, the benchmarks' ``--arg``) as a dict: each value JSON
    where it parses (numbers, booleans, lists), else the text itself."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobSpecError(f"{flag} {item!r} is not key=value")
        try:
            pairs[key] = json.loads(value)
        except ValueError:
            pairs[key] = value
    return pairs


def carbon_weight(objective: str) -> float:
    """How much carbon counts against cost, 0..1: ``cost`` is 0, ``carbon`` 1, a number in between its weight."""
    text = str(objective).strip().lower()
    if text in ("", "cost"):
        return 0.0
    if text == "carbon":
        return 1.0
    try:
        w = float(text)
    except ValueError:
        raise JobSpecError(f"job parameter objective: {objective!r} is unknown; use cost, carbon, "
                           "or a carbon weight between 0 and 1") from None
    if not 0.0 <= w <= 1.0 or math.isnan(w):
        raise JobSpecError(f"job parameter objective: a carbon weight must be between 0 and 1, got {objective!r}")
    return w


def deadline_at(deadline: str, submitted_at: float) -> float | None:
    """Epoch seconds of a job's deadline: empty is none, a number is hours after submission, else an ISO 8601 time
    (UTC unless it says otherwise)."""
    text = str(deadline).strip()
    if not text:
        return None
    try:
        hours = float(text)
    except ValueError:
        hours = None
    if hours is not None:
        if not hours > 0 or math.isinf(hours):
            raise JobSpecError(f"job parameter deadline: {deadline!r} hours after submission must be > 0")
        return submitted_at + hours * 3600
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise JobSpecError(f"job parameter deadline: {deadline!r} is neither hours after submission (e.g. 12) "
                           "nor a time (e.g. 2026-12-07T06:00Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


@dataclass(frozen=True)
class OuterConfig:
    """The outer step's Nesterov SGD: lr and momentum applied to the averaged pseudo-gradient.

    No defaults of its own: a run's values are its job spec's (``JobSpec.outer``), so the
    outer step has one set of defaults, ``outer_lr`` and ``outer_momentum`` below.
    """

    lr: float
    momentum: float

    def to_dict(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum}


# what each job field's annotation accepts, and how an error says it (a Literal is a str of its choices)
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
    "str": ((str,), "a string"), "list[str]": ((list,), "a list of names"), "dict": ((dict,), "a JSON object"),
}
_NUMBER_OR_TEXT = {"deadline"}  # hours after submission may come as a number (a command line's 12)


def _type_error(name: str, annotation: str, value) -> str | None:
    """Why ``value`` is not of the field's type, or None: before any comparison, which would raise a TypeError
    that names no field."""
    kind = "str" if annotation.startswith("Literal") else annotation
    if kind not in _KINDS or (name in _NUMBER_OR_TEXT and isinstance(value, (int, float)) and not isinstance(value, bool)):
        return None
    allowed, words = _KINDS[kind]
    wrong = not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)
    wrong = wrong or (kind == "list[str]" and not all(isinstance(v, str) for v in value))
    return f"job parameter {name}: must be {words}, got {value!r}" if wrong else None


@dataclass(frozen=True)
class JobSpec:
    tenant: str = "team-a"
    clouds: list[str] = field(default_factory=list)  # empty: every active cloud the tenant may use
    rounds: int = 10
    inner_steps: int = 20
    model_size: str = "small"
    global_batch: int = 24
    devices_per_cloud: int = 1
    placement: Literal["spread", "auto"] = "spread"  # spread: every eligible cloud; auto: crosscloud chooses
    devices: int = 2  # devices in all for placement auto (one cloud when one suffices, else a split)
    dataset: str = ""  # empty: the program's own DATASET, else python-stdlib
    seed: int = 0
    mode: Literal["cross_cloud", "single_cluster"] = "cross_cloud"
    inner_lr: float = 3e-3
    # a cloud's AdamW lr against its part of the global batch, see local_lr
    local_lr_scaling: Literal["none", "sqrt", "linear"] = "none"
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    round_timeout_s: float = 600.0
    # the home cloud evaluates the global on the held-out bytes when this many more steps are trained, and
    # after the last round: evaluating is forward passes only, cheap next to the rounds between
    eval_every_steps: int = 40
    # an evaluation past this many seconds is recorded as failed and training goes on (the program may bound its
    # own work with EVAL_BATCHES, which it reads as run.eval_batches)
    eval_timeout_s: float = 600.0
    # > 0: before the run's first placement on an accelerator type no run has measured its program and model on,
    # a probe run of this many of the program's first steps measures it there (pipeline.probe); 0: no probe
    probe_steps: int = 0
    overlap: bool = True
    # overlap: the share of its own drift a cloud keeps when a late global is folded in, see worker.DelayedGlobal
    fold_mix: float = 0.5
    compression: Literal["int8", "none"] = "int8"
    adapt_shares: bool = False
    follow_prices: bool = False  # between rounds, a dear cloud's share may move to cheaper ones (grid.following_prices)
    # the training program every cloud runs: a file relative to the project folder, or package.module (crosscloud.sdk)
    program: str = DEFAULT_PROGRAM
    program_args: dict = field(default_factory=dict)  # handed to the program as run.args, over the job's own knobs
    # a sub-task that died (not one whose program raised) is started again this many times before its cloud is lost
    subtask_retries: int = 2
    # rounds of deltas and globals each cloud keeps in its store (the final model stays): 2 is what restarts need
    keep_rounds: int = 2
    # the queue (crosscloud.scheduler): higher priority goes first; a deadline (hours after submission, or a time);
    # deferrable work may wait for cheaper or cleaner hours before its deadline, by the objective's measure
    priority: int = 0
    deadline: str = ""
    deferrable: bool = False
    objective: str = "cost"

    def __post_init__(self) -> None:
        for name, f in self.__dataclass_fields__.items():
            if why := _type_error(name, str(f.type), getattr(self, name)):
                raise JobSpecError(why)
        checks = [
            (self.rounds > 0, "rounds", f"must be > 0, got {self.rounds}"),
            (self.inner_steps > 0, "inner_steps", f"must be > 0, got {self.inner_steps}"),
            (self.global_batch > 0, "global_batch", f"must be > 0, got {self.global_batch}"),
            (self.devices_per_cloud > 0, "devices_per_cloud", f"must be > 0, got {self.devices_per_cloud}"),
            (self.model_size in PRESETS, "model_size", f"{self.model_size!r} is unknown; choose one of {sorted(PRESETS)}"),
            (self.devices > 0, "devices", f"must be > 0, got {self.devices}"),
            (self.placement in PLACEMENTS, "placement", f"{self.placement!r} is unknown; choose one of {list(PLACEMENTS)}"),
            (self.mode in MODES, "mode", f"{self.mode!r} is unknown; choose one of {list(MODES)}"),
            (self.inner_lr > 0, "inner_lr", f"must be > 0, got {self.inner_lr}"),
            (self.outer_lr > 0, "outer_lr", f"must be > 0, got {self.outer_lr}"),
            (0 <= self.outer_momentum < 1, "outer_momentum", f"must be in [0, 1), got {self.outer_momentum}"),
            (self.eval_every_steps > 0, "eval_every_steps", f"must be > 0, got {self.eval_every_steps}"),
            (self.eval_timeout_s > 0, "eval_timeout_s", f"must be > 0, got {self.eval_timeout_s}"),
            (self.probe_steps == 0 or self.probe_steps >= 2, "probe_steps",
             f"must be 0 (no probe) or >= 2 (the first step warms up and is not measured), got {self.probe_steps}"),
            (0 <= self.fold_mix < 1, "fold_mix", f"must be in [0, 1), got {self.fold_mix}"),
            (self.round_timeout_s > 0, "round_timeout_s", f"must be > 0, got {self.round_timeout_s}"),
            (self.local_lr_scaling in LR_SCALINGS, "local_lr_scaling", f"{self.local_lr_scaling!r} is unknown; choose one of {list(LR_SCALINGS)}"),
            (self.compression in ("int8", "none"), "compression", f"{self.compression!r} is unknown; choose int8 or none"),
            (len(set(self.clouds)) == len(self.clouds), "clouds", f"lists a cloud twice: {self.clouds}"),
            (bool(self.program.strip()), "program", "must name a program file or package.module"),
            (isinstance(self.program_args, dict), "program_args", f"must be a JSON object, got {self.program_args!r}"),
            (self.subtask_retries >= 0, "subtask_retries", f"must be >= 0, got {self.subtask_retries}"),
            (self.keep_rounds >= 2, "keep_rounds", f"must be >= 2 (a restarted cloud reads the last two), got {self.keep_rounds}"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise JobSpecError(f"job parameter {name}: {message}")
        carbon_weight(self.objective)
        deadline_at(self.deadline, 0.0)
        if self.deferrable and not str(self.deadline).strip():
            raise JobSpecError("job parameter deferrable: deferrable work needs a deadline to wait within; give one")
        try:
            validate_name(self.tenant, "tenant")
        except ValueError as exc:
            raise JobSpecError(f"job parameter tenant: {exc}") from None

    @classmethod
    def from_params(cls, params: dict) -> JobSpec:
        """Build from a DAG run's params, ignoring keys that are not job fields."""
        known = cls.__dataclass_fields__
        unknown = sorted(set(params) - set(known))
        values = {k: v for k, v in params.items() if k in known}
        if unknown:
            raise JobSpecError(f"unknown job parameter(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**values)
        except TypeError as exc:
            raise JobSpecError(f"job parameters: {exc}") from None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def outer(self) -> OuterConfig:
        """The outer step this job asks for (the last round's is fixed by ``training.outer.round_config``)."""
        return OuterConfig(lr=self.outer_lr, momentum=self.outer_momentum)

    @property
    def dataset_name(self) -> str:
        """The dataset this job reads; admission settles an empty one to the program's own DATASET first."""
        return self.dataset or DEFAULT_DATASET

    def usable_clouds(self, fed: Federation) -> list[str]:
        """The clouds the job names, else every cloud its tenant has quota on."""
        return self.clouds or [c for c, n in fed.tenant(self.tenant).quotas.items() if n > 0]

    def program_run_args(self) -> dict:
        """What the program reads as ``run.args``: the job's own knobs, overridden by its ``program_args``."""
        return {"seed": self.seed, "lr": self.inner_lr, "model_size": self.model_size, **self.program_args}

    def evaluates_after(self, round_: int) -> bool:
        """Whether the global after ``round_`` is evaluated: every ``eval_every_steps`` steps, and the last."""
        steps, every = self.inner_steps, self.eval_every_steps
        return round_ == self.rounds - 1 or (round_ + 1) * steps // every > round_ * steps // every


def local_lr(spec: JobSpec, share: int) -> float:
    """The inner AdamW lr of a cloud that trains ``share`` sequences of the global batch per step.

    Adam divides each step by the gradient's root mean square, which the noise of a smaller
    batch inflates: a cloud alone on part of the batch steps less far along what every cloud
    agrees on than the global batch would, and averaging the clouds' progress cannot give
    that back. Its lr can be scaled by (global_batch / share) ** k: k = 0 (none, the default),
    1/2 (sqrt: what that denominator costs when noise dominates) or 1 (linear). Scaling
    helps a job whose inner_lr is below the best one and hurts one above it, so the
    default leaves the user's lr alone. A single cluster trains the whole batch and keeps
    inner_lr whatever the rule.
    """
    k = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}[spec.local_lr_scaling]
    return spec.inner_lr * (spec.global_batch / max(1, share)) ** k

