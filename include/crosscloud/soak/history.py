"""The soak's history: one typed event per JSON line, appended durably while the deployment runs.

The checker judges only what was written here, so every event is fsynced before ``append`` returns: a
harness that dies mid-soak still leaves a history that can be read back and checked. Times ``t`` (and
``start``/``end``) are epoch seconds; an ``end`` of None means still going when the history ended.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Union


class HistoryError(ValueError):
    """A history line that cannot be read as an event: the message names the file and the line."""


@dataclass(frozen=True)
class FaultInjected:
    """A fault the harness injected into ``target``, active from ``start`` to ``end``."""

    kind: ClassVar[str] = "fault_injected"
    t: float
    name: str
    target: str
    start: float
    end: float | None


@dataclass(frozen=True)
class RunSubmitted:
    """A training run handed to the deployment: from now on it must end."""

    kind: ClassVar[str] = "run_submitted"
    t: float
    run: str
    tenant: str
    job: str


@dataclass(frozen=True)
class RunEnded:
    """A run's end: ``state`` is "succeeded" or "failed", and a failure states its ``reason``."""

    kind: ClassVar[str] = "run_ended"
    t: float
    run: str
    state: str
    reason: str


@dataclass(frozen=True)
class CloudCapacity:
    """A cloud's devices from ``t`` on (a drain or a join changes it)."""

    kind: ClassVar[str] = "cloud_capacity"
    t: float
    cloud: str
    devices: int


@dataclass(frozen=True)
class ObjectCommitted:
    """A store acknowledged a committed object: it must never change or vanish unless retired."""

    kind: ClassVar[str] = "object_committed"
    t: float
    store: str
    key: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ObjectObserved:
    """What a read of an object found: ``sha256`` (and ``size``) None means it was missing."""

    kind: ClassVar[str] = "object_observed"
    t: float
    store: str
    key: str
    sha256: str | None
    size: int | None


@dataclass(frozen=True)
class ObjectRetired:
    """An object deleted on purpose (retention of old globals, a run's cleanup): its absence is no loss."""

    kind: ClassVar[str] = "object_retired"
    t: float
    store: str
    key: str
    why: str


@dataclass(frozen=True)
class SubtaskLived:
    """A sub-task of ``run`` held ``devices`` on ``cloud`` from ``start`` to ``end``."""

    kind: ClassVar[str] = "subtask_lived"
    t: float
    run: str
    cloud: str
    devices: int
    start: float
    end: float | None


@dataclass(frozen=True)
class ReservationHeld:
    """A ledger reservation of ``run`` on ``cloud`` from ``start`` to ``end``, under a lease of ``lease_s``."""

    kind: ClassVar[str] = "reservation_held"
    t: float
    run: str
    cloud: str
    devices: int
    start: float
    end: float | None
    lease_s: float


@dataclass(frozen=True)
class GlobalCommitted:
    """A cloud's committed global of a run's round, by digest: every cloud's must agree."""

    kind: ClassVar[str] = "global_committed"
    t: float
    run: str
    round: int
    cloud: str
    digest: str


@dataclass(frozen=True)
class RoundSpent:
    """Device time a round took on a cloud; ``kept`` is False for a round thrown away and redone."""

    kind: ClassVar[str] = "round_spent"
    t: float
    run: str
    cloud: str
    round: int
    devices: int
    start: float
    end: float
    kept: bool


@dataclass(frozen=True)
class FinalLoss:
    """The final loss of a run of ``job``."""

    kind: ClassVar[str] = "final_loss"
    t: float
    run: str
    job: str
    loss: float


@dataclass(frozen=True)
class BaselineLoss:
    """The final loss of a fault-free run of ``job``: what a run under faults must come close to."""

    kind: ClassVar[str] = "baseline_loss"
    t: float
    job: str
    loss: float


@dataclass(frozen=True)
class HistoryEnded:
    """The end of the soak: anything still open now (a run, a reservation, a sub-task) is judged open."""

    kind: ClassVar[str] = "history_ended"
    t: float


Event = Union[
    FaultInjected, RunSubmitted, RunEnded, CloudCapacity, ObjectCommitted, ObjectObserved, ObjectRetired,
    SubtaskLived, ReservationHeld, GlobalCommitted, RoundSpent, FinalLoss, BaselineLoss, HistoryEnded,
]

KINDS: dict[str, type] = {c.kind: c for c in Event.__args__}

_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def encode(event: Event) -> str:
    """One JSON line (no newline) for an event, its kind first."""
    return json.dumps({"kind": event.kind, **dataclasses.asdict(event)}, separators=(",", ":"))


def _fits(value: Any, annotation: str) -> bool:
    """Whether a JSON value is of a field's type (bool is no number here, None only where optional)."""
    names = [n.strip() for n in annotation.split("|")]
    if value is None:
        return "None" in names
    if isinstance(value, bool):
        return "bool" in names
    return any(isinstance(value, _TYPES[n]) for n in names if n in _TYPES and n != "bool")


def decode(line: str, where: str = "history") -> Event:
    """The event of one JSON line; ``where`` (e.g. "soak.jsonl line 7") starts any error's message."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise HistoryError(f"{where}: not a JSON object: {e}: {line[:120]!r}") from None
    if not isinstance(record, dict):
        raise HistoryError(f"{where}: not a JSON object: {line[:120]!r}")
    kind = record.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise HistoryError(f"{where}: unknown event kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if set(record) != set(fields):
        missing, extra = sorted(set(fields) - set(record)), sorted(set(record) - set(fields))
        raise HistoryError(f"{where}: {kind} has missing fields {missing} and unknown fields {extra}")
    for name, value in record.items():
        if not _fits(value, str(fields[name].type)):
            raise HistoryError(f"{where}: {kind}.{name} must be {fields[name].type}, not {value!r}")
    return cls(**record)


def read_history(path: str | os.PathLike) -> list[Event]:
    """Every event of a history file in file order; blank lines are skipped, anything else must decode."""
    events = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                events.append(decode(line, f"{path} line {number}"))
    return events


class History:
    """An append-only history file: each event is one line, written whole with O_APPEND and fsynced.

    One ``os.write`` per line keeps lines whole when several threads (a lock) or processes append.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, event: Event) -> None:
        """Write the event and return only once it is durable."""
        data = (encode(event) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise HistoryError(f"{self.path}: the history is closed")
            written = os.write(self._fd, data)
            if written != len(data):  # a regular file takes all of it short of a full disk
                raise HistoryError(f"{self.path}: wrote {written} of {len(data)} bytes of an event")
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
