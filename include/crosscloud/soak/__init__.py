"""The fault soak's history and its checker: invariants judged over the whole history, not by eye.

A harness records what happened (runs, faults, objects, sub-tasks, reservations, rounds) as typed events in
a JSON-lines file; ``check`` reads them back and names every broken invariant and the benchmark's figures.
"""

from crosscloud.soak.checker import INVARIANTS, Report, Violation, check
from crosscloud.soak.history import (
    KINDS,
    BaselineLoss,
    CloudCapacity,
    Event,
    FaultInjected,
    FinalLoss,
    GlobalCommitted,
    History,
    HistoryEnded,
    HistoryError,
    ObjectCommitted,
    ObjectObserved,
    ObjectRetired,
    ReservationHeld,
    RoundSpent,
    RunEnded,
    RunSubmitted,
    SubtaskLived,
    decode,
    encode,
    read_history,
)

__all__ = [
    "INVARIANTS", "KINDS", "BaselineLoss", "CloudCapacity", "Event", "FaultInjected", "FinalLoss",
    "GlobalCommitted", "History", "HistoryEnded", "HistoryError", "ObjectCommitted", "ObjectObserved",
    "ObjectRetired", "Report", "ReservationHeld", "RoundSpent", "RunEnded", "RunSubmitted", "SubtaskLived",
    "Violation", "check", "decode", "encode", "read_history",
]
