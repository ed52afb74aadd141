"""A served model's demand, measured from the traffic it served and forecast for the next hour.

Why measured: the hourly placement sized replicas by a Param, a guess that
nobody updates. The replicas already count the tokens they answer (``meter``);
each placement reads those counters, and the tokens since the last reading,
spread over the hours that span covers, become the history of tokens/s per
hour. The next hour's demand is forecast from it by the seasonal-naive rule
(the same hour a day before, where known, else the last hour measured), whose
error on the history is reported with it. A Param still overrides it.

The history is one small JSON object per served model in the tenant's home
store, so every worker and host reads the same one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from crosscloud.store.base import ObjectNotFound, ObjectStore

DAY_H = 24
KEEP_H = 14 * DAY_H  # hours of history kept: two weeks, for the daily season and its error


@dataclass(frozen=True)
class Forecast:
    """The demand expected in one hour and how it was found."""

    tokens_per_s: float | None  # None: nothing measured yet
    method: str  # "same hour a day before", "last hour measured", or "no history"
    mape: float | None  # mean absolute percentage error of the rule over the measured hours (None: none to score)
    hours: int  # hours of history it had

    def describe(self) -> str:
        if self.tokens_per_s is None:
            return "no traffic measured yet"
        error = f", {100 * self.mape:.0f} % mean error on the {self.hours} h measured" if self.mape is not None else ""
        return f"{self.tokens_per_s:.1f} tokens/s forecast ({self.method}{error})"


class Demand:
    """The measured tokens per hour of one served model (see the module docstring)."""

    def __init__(self, store: ObjectStore, tenant: str, model: str):
        self.store, self.key = store, f"{tenant}/serving/{model}/demand.json"

    def _load(self) -> dict:
        try:
            return json.loads(self.store.get(self.key))
        except ObjectNotFound:
            return {"hours": {}, "counters": {}, "at": None}

    def observe(self, counters: dict[str, int], now: float) -> float | None:
        """Read the replicas' token counters (by replica and start, so a restarted one counts from 0) at ``now``
        (epoch seconds); the tokens/s since the last reading, None on the first. The span's tokens are spread over
        the hours it covers, in proportion to its time in each."""
        state = self._load()
        prev, at = state["counters"], state["at"]
        rate = None
        if at is not None and now > at:
            served = sum(n - prev[r] if r in prev and n >= prev[r] else n for r, n in counters.items())
            rate = served / (now - at)
            for hour, seconds in _hours(at, now):
                got = state["hours"].setdefault(str(hour), [0.0, 0.0])
                got[0] += rate * seconds
                got[1] += seconds
        last = math.floor(now / 3600)
        state["hours"] = {h: v for h, v in state["hours"].items() if int(h) > last - KEEP_H}
        state["counters"], state["at"] = dict(counters), now
        self.store.put(self.key, json.dumps(state).encode())
        return rate

    def history(self) -> dict[int, float]:
        """Tokens/s of each hour measured (epoch hours), from the readings that covered it."""
        return {int(h): tokens / seconds for h, (tokens, seconds) in self._load()["hours"].items() if seconds > 0}

    def forecast(self, start: float) -> Forecast:
        """The demand of the hour that starts at ``start`` (epoch seconds)."""
        return seasonal_naive(self.history(), math.floor(start / 3600))


def _hours(t0: float, t1: float) -> list[tuple[int, float]]:
    """(epoch hour, seconds of [t0, t1) in it) for each hour the span touches."""
    out, t = [], t0
    while t < t1:
        hour = math.floor(t / 3600)
        end = min(t1, (hour + 1) * 3600)
        out.append((hour, end - t))
        t = end
    return out


def _predict(history: dict[int, float], hour: int, before: int) -> tuple[float, str] | None:
    """The rule for ``hour`` from the hours measured before ``before``: the same hour a day before, else the last
    hour measured, raised by its rise over the hour before it, once per hour ahead of it up to two (the next hour
    of a run that sizes replicas ahead); never lowered: replicas are sized ahead of a rising demand, and a falling
    one only leaves some idle."""
    if hour - DAY_H in history:
        return history[hour - DAY_H], "same hour a day before"
    last = max((h for h in history if h < before), default=None)
    if last is None:
        return None
    prior = history.get(last - 1)
    rise = history[last] / prior if prior else 1.0
    return history[last] * max(1.0, rise) ** min(max(1, hour - last), 2), "last hour measured"


def seasonal_naive(history: dict[int, float], hour: int) -> Forecast:
    """The same hour a day before where measured, else the last hour measured and its rise (this one, if it has
    begun: a run started within the hour plans the rest of it); its error over the history, each hour from the
    ones before it."""
    got = _predict(history, hour, hour + 1)
    if got is None:
        return Forecast(None, "no history", None, len(history))
    errors = [abs(p[0] - actual) / actual for h, actual in history.items()
              if actual > 0 and (p := _predict(history, h, h)) is not None]
    return Forecast(got[0], got[1], sum(errors) / len(errors) if errors else None, len(history))


FIRST_HOURS_TPS = 200.0  # what a model with no traffic measured yet is sized for, until its replicas report


def expected_tokens_per_s(demand: Demand, counters: dict[str, int], now: float, start: float,
                          override: float | None) -> tuple[float, dict]:
    """The demand to plan the hour from ``start`` for, and how it was found (kept with the decision): the replicas'
    counters read at ``now`` into the history first, then the override where given, else the forecast. The record
    also holds the next hour's forecast, which the replicas are sized ahead for (``placement.hour_and_next``)."""
    demand.observe(counters, now)
    got, ahead = demand.forecast(start), demand.forecast(start + 3600)
    record = {"forecast_tokens_per_s": got.tokens_per_s, "method": got.method, "mape": got.mape, "hours": got.hours,
              "override": override, "next_hour_tokens_per_s": None if override is not None else ahead.tokens_per_s}
    if override is not None:
        record["why"] = f"{override:.1f} tokens/s as the tokens_per_s Param says (measured: {got.describe()})"
        return float(override), record
    if got.tokens_per_s is None or got.tokens_per_s <= 0:
        record["why"] = (f"{FIRST_HOURS_TPS:.0f} tokens/s assumed: {got.describe()} (set the tokens_per_s Param to "
                         "size the first hours)")
        return FIRST_HOURS_TPS, record
    record["why"] = got.describe()
    return got.tokens_per_s, record
