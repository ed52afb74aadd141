"""A run's round records, one per round, kept beside its plan in the home cloud's store.

The watcher rewrites the list after each round it records; every
later reader (the run report, demand response, the final stage) reads it here.
"""

from __future__ import annotations

import json

from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectStore


def load_history(store: ObjectStore, plan: Plan) -> list[dict]:
    """The records of the rounds finished so far ([] before the first)."""
    key = plan.keys.history
    return json.loads(store.get(key)) if store.exists(key) else []


def save_history(store: ObjectStore, plan: Plan, history: list[dict]) -> None:
    store.put(plan.keys.history, json.dumps(history).encode())
