"""Hourly electricity price and carbon signals per grid region, behind one interface, and a forecast.

A feed (``CsvFeed`` over the public green-dcc files, ``HttpFeed`` over the same
CSV served elsewhere) returns an hourly ``Series``; an hour without a value is
a gap that ``Series.at`` refuses, so no decision uses a price it does not
have. Hours past what is known (``known_until``: day-ahead prices publish at
noon UTC) come from a seasonal-naive forecast whose lag is chosen on past
weeks only. The file layout, gap rules and error measures are in
``docs/energy-and-grid.md``.
"""

from __future__ import annotations

import csv
import io
import math
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Protocol, Sequence

from crosscloud.core.paths import data_dir

UTC = timezone.utc
PRICE_COLUMN = "Price (USD/MWh)"
CARBON_LCA = "Carbon Intensity gCO₂eq/kWh (LCA)"
CARBON_DIRECT = "Carbon Intensity gCO₂eq/kWh (direct)"


class ElectricityError(ValueError):
    """A signal that cannot be used; the message names the region/zone and what is wrong."""


class UnknownRegionError(ElectricityError):
    """The feed has no file for this region or zone."""


class PriceGapError(ElectricityError):
    """No value for this region and hour (a gap, or outside the series)."""

    def __init__(self, region: str, hour: datetime, kind: str = "price", detail: str = ""):
        self.region, self.hour, self.kind = region, hour, kind
        super().__init__(f"no {kind} for {region} at {hour:%Y-%m-%d %H:00} UTC{': ' + detail if detail else ''}")


def hour_index(when: datetime) -> int:
    """Hours since the epoch (UTC) of the hour containing ``when`` (naive means UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return math.floor(when.timestamp() / 3600)


def hour_of(index: int) -> datetime:
    return datetime.fromtimestamp(index * 3600, UTC)


def parse_hour(text: str) -> datetime:
    when = datetime.fromisoformat(text.strip())
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


@dataclass
class Series:
    """Hourly values of one region (or zone) from hour index ``start``; ``None`` is a gap."""

    region: str
    values: list[float | None]
    start: int  # hour_index of values[0]
    kind: str = "price"  # "price" (USD/MWh) or "carbon" (gCO2eq/kWh)
    source: str = ""
    duplicates: list[int] = field(default_factory=list)  # hours that had more than one row (first kept)

    @property
    def end(self) -> int:
        """One past the last hour index."""
        return self.start + len(self.values)

    def get(self, hour: datetime | int) -> float | None:
        i = hour if isinstance(hour, int) else hour_index(hour)
        if self.start <= i < self.end:
            return self.values[i - self.start]
        return None

    def at(self, hour: datetime | int) -> float:
        """The value at ``hour``; ``PriceGapError`` (naming region and hour) when there is none."""
        i = hour if isinstance(hour, int) else hour_index(hour)
        v = self.get(i)
        if v is None:
            where = "a gap in the data" if self.start <= i < self.end else (
                f"outside the data ({hour_of(self.start):%Y-%m-%d %H:00} to {hour_of(self.end - 1):%Y-%m-%d %H:00} UTC)"
                if self.values else "the series is empty")
            raise PriceGapError(self.region, hour_of(i), self.kind, f"{where} ({self.source})" if self.source else where)
        return v

    def window(self, start: datetime | int, hours: int) -> list[float]:
        """``hours`` consecutive values from ``start``; raises on the first missing hour."""
        s = start if isinstance(start, int) else hour_index(start)
        return [self.at(s + k) for k in range(hours)]

    def gaps(self) -> list[datetime]:
        return [hour_of(self.start + k) for k, v in enumerate(self.values) if v is None]

    def latest(self) -> int | None:
        """Hour index of the last hour with a value."""
        for k in range(len(self.values) - 1, -1, -1):
            if self.values[k] is not None:
                return self.start + k
        return None


def _parse(text: str, region: str, kind: str, column: str, source: str) -> Series:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise ElectricityError(f"{source}: empty file, expected a header with 'Datetime (UTC)' and {column!r}") from None
    header = [h.strip().lstrip("\ufeff") for h in header]
    if "Datetime (UTC)" not in header or column not in header:
        raise ElectricityError(f"{source}: expected columns 'Datetime (UTC)' and {column!r}, found {header}")
    ti, vi = header.index("Datetime (UTC)"), header.index(column)
    rows: dict[int, float | None] = {}
    dupes = []
    for n, row in enumerate(reader, start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            i = hour_index(parse_hour(row[ti]))
        except (ValueError, IndexError):
            raise ElectricityError(f"{source}:{n}: cannot read the time {row[ti] if len(row) > ti else ''!r}") from None
        try:
            v: float | None = float(row[vi])
            if not math.isfinite(v):
                v = None
        except (ValueError, IndexError):
            v = None  # an empty or unreadable value is a gap, reported as such
        if i in rows:
            dupes.append(i)
            continue
        rows[i] = v
    if not rows:
        return Series(region, [], 0, kind, source)
    start, end = min(rows), max(rows) + 1
    return Series(region, [rows.get(i) for i in range(start, end)], start, kind, source, dupes)


def parse_price_csv(text: str, region: str, source: str = "") -> Series:
    return _parse(text, region, "price", PRICE_COLUMN, source or region)


def parse_carbon_csv(text: str, zone: str, source: str = "", column: str = CARBON_LCA) -> Series:
    return _parse(text, zone, "carbon", column, source or zone)


class Feed(Protocol):
    def prices(self, region: str) -> Series: ...
    def carbon(self, zone: str) -> Series: ...


class CsvFeed:
    """Price and carbon files under ``<root>/electricity`` (``root`` defaults to ``data_dir()``)."""

    def __init__(self, root: str | os.PathLike | None = None, year: int = 2023, carbon_column: str = CARBON_LCA):
        self.root = Path(root) if root is not None else data_dir()
        self.year = year
        self.carbon_column = carbon_column
        self._cache: dict[tuple[str, str], Series] = {}

    def _available(self, sub: str) -> list[str]:
        folder = self.root / "electricity" / sub
        suffix = f"_{self.year}.csv"
        return sorted(p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}")) if folder.is_dir() else []

    def regions(self) -> list[str]:
        return self._available("prices")

    def zones(self) -> list[str]:
        return self._available("carbon")

    def _read(self, sub: str, name: str) -> str:
        path = self.root / "electricity" / sub / f"{name}_{self.year}.csv"
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            have = self._available(sub)
            raise UnknownRegionError(
                f"no {sub} file for {name!r} ({path}); available: {', '.join(have) or 'none'} "
                f"(set CROSSCLOUD_DATA_DIR to the folder holding electricity/{sub}/<NAME>_{self.year}.csv)") from None

    def prices(self, region: str) -> Series:
        key = ("prices", region)
        if key not in self._cache:
            path = self.root / "electricity" / "prices" / f"{region}_{self.year}.csv"
            self._cache[key] = parse_price_csv(self._read("prices", region), region, str(path))
        return self._cache[key]

    def carbon(self, zone: str) -> Series:
        key = ("carbon", zone)
        if key not in self._cache:
            path = self.root / "electricity" / "carbon" / f"{zone}_{self.year}.csv"
            self._cache[key] = parse_carbon_csv(self._read("carbon", zone), zone, str(path), self.carbon_column)
        return self._cache[key]


class HttpFeed:
    """The same CSV rows over HTTP: ``GET <base_url>/prices/<REGION>_<YEAR>.csv`` (and ``/carbon/``)."""

    def __init__(self, base_url: str, year: int = 2023, timeout_s: float = 10.0, carbon_column: str = CARBON_LCA):
        self.base_url = base_url.rstrip("/")
        self.year = year
        self.timeout_s = timeout_s
        self.carbon_column = carbon_column

    def _get(self, sub: str, name: str) -> tuple[str, str]:
        url = f"{self.base_url}/{sub}/{urllib.request.quote(name)}_{self.year}.csv"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                return resp.read().decode("utf-8"), url
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise UnknownRegionError(f"no {sub} for {name!r} at {url} (HTTP 404)") from None
            raise ElectricityError(f"{url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ElectricityError(f"{url}: cannot fetch: {getattr(e, 'reason', e)}") from None

    def prices(self, region: str) -> Series:
        text, url = self._get("prices", region)
        return parse_price_csv(text, region, url)

    def carbon(self, zone: str) -> Series:
        text, url = self._get("carbon", zone)
        return parse_carbon_csv(text, zone, url, self.carbon_column)


@dataclass(frozen=True)
class Health:
    region: str
    gaps: tuple[datetime, ...]
    latest: datetime | None
    age: timedelta | None  # now - latest hour with a value
    stale: bool
    duplicates: int = 0

    def describe(self) -> str:
        parts = [f"{self.region}:"]
        parts.append(f"latest {self.latest:%Y-%m-%d %H:00} UTC" if self.latest else "no values")
        if self.age is not None:
            parts.append(f"({self.age.total_seconds() / 3600:.0f} h old{', STALE' if self.stale else ''})")
        if self.gaps:
            shown = ", ".join(f"{g:%m-%d %H:00}" for g in self.gaps[:5])
            parts.append(f"{len(self.gaps)} missing hour(s): {shown}{' ...' if len(self.gaps) > 5 else ''}")
        if self.duplicates:
            parts.append(f"{self.duplicates} duplicate hour(s) (first kept)")
        return " ".join(parts)


def check(series: Series, now: datetime, max_age: timedelta = timedelta(hours=2)) -> Health:
    """Gaps of ``series``, its latest hour and whether it is stale at ``now``."""
    latest = series.latest()
    latest_dt = hour_of(latest) if latest is not None else None
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    age = (now - latest_dt) if latest_dt is not None else None
    stale = latest_dt is None or age > max_age
    return Health(series.region, tuple(series.gaps()), latest_dt, age, stale, len(series.duplicates))


def map_to_data_year(now: datetime, year: int) -> datetime:
    """The same day-of-year and hour of ``now`` in ``year`` (UTC); 29 Feb -> 28 Feb, day 366 -> 31 Dec."""
    now = now.astimezone(UTC) if now.tzinfo else now.replace(tzinfo=UTC)
    doy = min(now.timetuple().tm_yday, 366)
    leap_now = now.year % 4 == 0 and (now.year % 100 != 0 or now.year % 400 == 0)
    leap_data = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if leap_now and not leap_data and doy >= 60:
        doy = max(doy - 1, 59)  # 29 Feb -> 28 Feb, later days keep their date
    days_in = 366 if leap_data else 365
    doy = min(doy, days_in)
    return datetime(year, 1, 1, now.hour, tzinfo=UTC) + timedelta(days=doy - 1)


# -- what is known when, and the forecast -------------------------------------------------

def known_until(decision_hour: int, day_ahead: bool = True, publish_hour_utc: int = 12) -> int:
    """Last hour index whose price is known at ``decision_hour`` (see the module docstring)."""
    if not day_ahead:
        return decision_hour
    day_end = (decision_hour // 24 + 1) * 24 - 1
    return day_end + 24 if decision_hour % 24 >= publish_hour_utc else day_end


def seasonal_naive(series: Series, known: int, hours: Sequence[int], lag: int = 24) -> list[float]:
    """Value of each hour in ``hours``: actual when ``<= known``, else the value ``lag`` (x k) hours earlier.

    Steps back whole seasons past hours that are after ``known`` or gaps; raises
    ``PriceGapError`` when no earlier season has a value (never invents one).
    """
    out = []
    for t in hours:
        if t <= known:
            out.append(series.at(t))
            continue
        s = t - lag * math.ceil((t - known) / lag)
        v = series.get(s)
        while v is None and s - lag >= series.start:
            s -= lag
            v = series.get(s)
        if v is None:
            raise PriceGapError(series.region, hour_of(t), series.kind,
                                f"no earlier value {lag} h apart to forecast from (known until {hour_of(known):%Y-%m-%d %H:00})")
        out.append(v)
    return out


def forecast_error(actual: Sequence[float], predicted: Sequence[float]) -> dict[str, float]:
    """MAE and sMAPE (%) of ``predicted`` against ``actual`` (pairs with |a|+|f| = 0 skipped in sMAPE)."""
    if len(actual) != len(predicted) or not actual:
        raise ValueError("actual and predicted must be non-empty and of equal length")
    mae = sum(abs(f - a) for a, f in zip(actual, predicted)) / len(actual)
    terms = [2 * abs(f - a) / (abs(f) + abs(a)) for a, f in zip(actual, predicted) if abs(f) + abs(a) > 0]
    smape = 100 * sum(terms) / len(terms) if terms else 0.0
    return {"mae": mae, "smape_pct": smape, "n": len(actual)}


def evaluate_forecast(series: Series, start: int, end: int, lag: int, horizon: int = 48,
                      day_ahead: bool = True, publish_hour_utc: int = 12) -> dict[str, float]:
    """Error of the seasonal-naive forecast as decisions would see it, on the real data.

    One forecast origin per day in ``[start, end)`` at ``publish_hour_utc`` (after
    publication); each predicts the ``horizon`` hours after what is known then
    (``known_until``), which are compared with the actual values. Hours without
    an actual value are skipped.
    """
    actual, predicted = [], []
    first_day = start // 24
    for day in range(first_day, (end - 1) // 24 + 1):
        origin = day * 24 + publish_hour_utc
        if origin < start or origin >= end:
            continue
        known = known_until(origin, day_ahead, publish_hour_utc)
        for t in range(known + 1, known + 1 + horizon):
            a = series.get(t)
            if a is None:
                continue
            try:
                f = seasonal_naive(series, known, [t], lag)[0]
            except PriceGapError:
                continue
            actual.append(a)
            predicted.append(f)
    if not actual:
        raise ElectricityError(f"{series.region}: no hours with actual values to measure the forecast on")
    return forecast_error(actual, predicted)


def choose_lag(series: Series, before: int, lags: Sequence[int] = (24, 168), weeks: int = 4, horizon: int = 48,
               day_ahead: bool = True) -> tuple[int, dict[int, dict[str, float]]]:
    """The lag with the smaller MAE over the ``weeks`` before hour ``before`` (only past data is used)."""
    errors = {}
    for lag in lags:
        # forecast targets must lie before ``before``: the last origin is ``horizon`` + a day earlier
        errors[lag] = evaluate_forecast(series, before - weeks * 168, before - horizon - 48, lag, horizon, day_ahead)
    best = min(lags, key=lambda lag: errors[lag]["mae"])
    return best, errors


class PriceOracle:
    """Prices of several regions as a decision at a given hour sees them: known, else forecast.

    ``view(region, decision_hour, hours)`` returns actual values for hours up to
    ``known_until(decision_hour)`` and the seasonal-naive forecast (with the
    region's ``lags[region]``) beyond. ``actual(region, hours)`` is the truth,
    for accounting and for the perfect-knowledge optimum.
    """

    def __init__(self, series: dict[str, Series], lags: dict[str, int] | None = None, day_ahead: bool = True,
                 publish_hour_utc: int = 12):
        self.series = series
        self.lags = lags or {r: 24 for r in series}
        self.day_ahead = day_ahead
        self.publish_hour_utc = publish_hour_utc
        self._cache: dict[tuple[str, int, int, int], list[float]] = {}

    def known_until(self, decision_hour: int) -> int:
        return known_until(decision_hour, self.day_ahead, self.publish_hour_utc)

    def actual(self, region: str, start: int, hours: int) -> list[float]:
        return self.series[region].window(start, hours)

    def view(self, region: str, decision_hour: int, start: int, hours: int) -> list[float]:
        known = self.known_until(decision_hour)
        key = (region, known, start, hours)
        if key not in self._cache:
            self._cache[key] = seasonal_naive(self.series[region], known, range(start, start + hours), self.lags[region])
        return self._cache[key]
