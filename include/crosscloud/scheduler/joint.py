"""The waiting deferrable runs planned together: one LP (HiGHS) over their pools and start hours.

Planned one at a time in queue order, the oldest run takes the cheapest hour
even when it saves a cent there and a younger run would have saved a dollar,
and a run planned late finds the cheap hours taken. One linear program over
all of them puts each where the whole queue costs least: a variable per run,
option (its pools) and start hour is the share of the run started there; each
run's shares add up to one (or to an *unserved* variable at a large penalty,
so the program is always feasible); every pool and hour holds at most the
devices the running work leaves. This hour's starts are whole (a run starts
now or not: ``milp``); later hours stay fractional, since each pass plans
them again with what is known then. The pass reads, for each run, the option
and hour of its largest share (``Plan``); the deadline guard still decides
whether a run may wait at all.

The program may also hold the runs expected to arrive (``expected``): they
take their share of the pools and hours from their arrival on, and are never
started, so the runs planned now leave them what they will need.

The program's size is bounded: at most ``MAX_RUNS`` runs (the earliest
deadlines; the rest are planned one at a time), ``MAX_EXPECTED`` expected
ones, and a solver time limit, past which the relaxation's plan is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_RUNS = 200
MAX_EXPECTED = 200  # runs expected to arrive (``expected``) in one program, the earliest first
TIME_LIMIT_S = 2.0
EARLIER = 1e-4  # a start an hour later costs this share more: equal hours go to the earliest, not to the solver's
UNSERVED = 100.0  # the penalty of leaving a run out of the plan, times its dearest option


@dataclass(frozen=True)
class Option:
    """One way to run a run: on ``pools`` (calendar rows) with ``devices`` each, costing ``cost[s]`` from hour s."""

    pools: tuple[int, ...]
    devices: tuple[int, ...]
    cost: np.ndarray  # per start hour 0 .. last; inf where it may not start


@dataclass(frozen=True)
class Run:
    """A waiting run as the program sees it: its options and how long it holds its devices each hour."""

    key: tuple[str, str]
    options: tuple[Option, ...]
    occ: np.ndarray


Plan = dict[tuple[str, str], tuple[int, int]]  # run -> (option index, start hour) of its largest share


def solve(runs: list[Run], room: np.ndarray, time_limit_s: float = TIME_LIMIT_S) -> Plan:
    """Each run's option and start where all of them together cost least within ``room`` (pools x hours)."""
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp
    from scipy.sparse import coo_matrix

    if not runs:
        return {}
    hours, room = room.shape[1], np.maximum(room, 0).reshape(-1)
    finite = [o.cost[np.isfinite(o.cost)] for run in runs for o in run.options]
    unit = max(float(np.mean(np.concatenate(finite))), 1e-12) if any(len(f) for f in finite) else 1.0
    cost, rows, cols, vals, owner = [], [], [], [], []
    n = 0
    for r, run in enumerate(runs):
        dearest = max((float(o.cost[np.isfinite(o.cost)].max()) for o in run.options if np.isfinite(o.cost).any()),
                      default=1.0)
        span = np.arange(len(run.occ))
        for i, o in enumerate(run.options):
            starts = np.flatnonzero(np.isfinite(o.cost))
            starts = starts[starts + len(run.occ) <= hours]
            ids = n + np.arange(len(starts))
            cost.append(o.cost[starts] / unit * (1 + EARLIER * starts))  # in units of ~1: tolerances hold
            owner += [(r, i, int(s)) for s in starts]
            for p, devices in zip(o.pools, o.devices):  # the devices it takes each hour it runs
                rows.append((p * hours + starts[:, None] + span).ravel())
                cols.append(np.repeat(ids, len(span)))
                vals.append(np.tile(devices * run.occ, len(starts)))
            n += len(starts)
        cost.append(np.array([UNSERVED * max(dearest / unit, 1e-6)]))
        owner.append((r, -1, -1))
        n += 1
    cost = np.concatenate(cost)
    eq = np.array([r for r, _, _ in owner])  # each variable's run: its shares add up to one
    now = np.array([s == 0 for _, _, s in owner], dtype=int)
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(room.size, n)).tocsr()
    a_eq = coo_matrix((np.ones(n), (eq, np.arange(n))), shape=(len(runs), n)).tocsr()
    ones = np.ones(len(runs))
    res = milp(cost, integrality=now, bounds=Bounds(0, 1),
               constraints=[LinearConstraint(a_ub, -np.inf, room), LinearConstraint(a_eq, ones, ones)],
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-5})
    x = res.x
    if x is None:  # no whole plan within the limit: the relaxation's
        x = linprog(cost, A_ub=a_ub, b_ub=room, A_eq=a_eq, b_eq=ones, bounds=(0, 1), method="highs").x
    if x is None:
        return {}
    best: dict[int, tuple[float, int, int]] = {}
    for v, (r, i, s) in enumerate(owner):
        if x[v] > best.get(r, (1e-9, -1, -1))[0]:
            best[r] = (float(x[v]), i, s)
    return {runs[r].key: (i, s) for r, (_, i, s) in best.items() if i >= 0}
