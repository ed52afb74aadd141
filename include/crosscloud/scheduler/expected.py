"""The work expected to arrive, so that the runs deferred now leave it the cheap devices it will need.

Planned with only the runs waiting now, a deferrable run takes the cheapest
pool at the cheapest hours, and the urgent work that arrives a few hours later
finds that pool full and starts on a dearer one. Day-ahead capacity planning
(Google's carbon-intelligent computing) forecasts tomorrow's demand from
today's; here the forecast is seasonal-naive: every run submitted in the last
``LAG_H`` hours is expected again ``LAG_H`` hours after it was submitted, with
the same terms. Only work that cannot wait is expected (a run without a
deadline, or with at most ``SLACK_S`` of slack): flexible work is planned
when it arrives, into whatever cheap hours are left, while a run with a few
hours of slack has only the pools free when it comes. Expected runs enter
only the joint plan of deferred work (``timing.Timing.plan_jointly``): they
are never started, held or protected by the deadline guard, so a wrong
forecast costs money, never a deadline.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from crosscloud.scheduler.entry import Entry

LAG_H = 24
SLACK_S = 6 * 3600  # less slack than a quarter of a day: too little to wait for the next cheap hours
PREFIX = "expected/"  # run ids of expected runs: a real run's id has no "/", so the two never meet


def expected_work(recent: Iterable[Entry], now: float, lag_h: float = LAG_H) -> list[Entry]:
    """The runs expected in the next ``lag_h`` hours: each run of ``recent`` submitted within the last ``lag_h``
    hours with at most ``SLACK_S`` of slack, again ``lag_h`` hours later. A run without a deadline is expected to
    start when it arrives."""
    lag = lag_h * 3600
    out = []
    for e in recent:
        if e.parts is not None or not now - lag <= e.submitted_at < now:
            continue
        if e.deadline is not None and e.deadline - e.submitted_at - e.runtime_s > SLACK_S:
            continue
        deadline = e.deadline + lag if e.deadline is not None else e.submitted_at + lag + e.runtime_s
        out.append(replace(e, run_id=PREFIX + e.run_id, submitted_at=e.submitted_at + lag, deadline=deadline,
                           deferrable=True))
    return out
