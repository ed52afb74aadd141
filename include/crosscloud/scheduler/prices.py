"""The hourly prices and carbon that deferrable runs are planned by, from the federation and the price feeds.

Each cloud with a ``grid`` section has a price region and a carbon zone. A
device-hour there costs its rental plus its energy (power x PUE) at the hour's
price, and emits its energy times the hour's carbon intensity. Hours are
known up to what is published (day-ahead prices at noon UTC) and forecast
beyond by the seasonal-naive forecast (``energy.prices``). The public data is
one year (2023): "now" is mapped onto that year by day of year and hour, as
the inventory does. A cloud without a grid section, a feed or a value for an
hour is left unpriced: no run waits for it.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from crosscloud.core.federation import Federation
from crosscloud.energy.power import energy_price_per_device_hour
from crosscloud.energy.prices import (CsvFeed, ElectricityError, PriceOracle, choose_lag, hour_index, known_until,
                                      map_to_data_year, seasonal_naive)
from crosscloud.scheduler.timing import MAX_HOURS, Rates


_FORECASTS: dict[tuple[str, int], tuple[int, float]] = {}  # (region, day) -> (lag, past MAE USD/MWh)


def _forecast(series, decision: int) -> tuple[int, float]:
    """The seasonal-naive lag for a region and its error on the four weeks before (chosen once a day)."""
    key = (series.region, decision // 24)
    if key not in _FORECASTS:
        try:
            lag, errors = choose_lag(series, decision - decision % 24)
            _FORECASTS[key] = (lag, errors[lag]["mae"])
        except ElectricityError:  # too little history: a day's lag, no band
            _FORECASTS[key] = (24, 0.0)
    return _FORECASTS[key]


def federation_rates(fed: Federation, now: float, feed: CsvFeed | None = None, hours: int = MAX_HOURS) -> Rates:
    """``Rates`` for every priced pool of ``fed``, from the hour of ``now`` on, as known or forecast then."""
    feed = feed or CsvFeed()
    decision = hour_index(map_to_data_year(datetime.fromtimestamp(now, timezone.utc), feed.year))
    usd, co2, band = {}, {}, {}
    for cloud in fed.clouds:
        if cloud.grid is None:
            continue
        try:
            series = feed.prices(cloud.grid.region)
            lag, mae = _forecast(series, decision)
            price = np.asarray(PriceOracle({series.region: series}, {series.region: lag})
                               .view(series.region, decision, decision, hours))
        except ElectricityError:
            continue
        intensity = _carbon(feed, cloud.grid.carbon_zone or cloud.grid.region, decision, hours)
        for pool in cloud.pools:
            key = (cloud.name, pool.accelerator)
            usd[key] = pool.price_per_device_hour + energy_price_per_device_hour(pool.power_w, price, cloud.grid.pue)
            band[key] = energy_price_per_device_hour(pool.power_w, mae, cloud.grid.pue)
            if intensity is not None:  # g/kWh x kWh per device-hour -> kg
                co2[key] = intensity * pool.power_w / 1000 * cloud.grid.pue / 1000
    return Rates(int(now // 3600), usd, co2, known_until(decision) - decision + 1, band)


def _carbon(feed: CsvFeed, zone: str, decision: int, hours: int):
    """The zone's carbon intensity (g/kWh) from ``decision`` on: known up to it, forecast beyond; None unknown."""
    try:
        return np.asarray(seasonal_naive(feed.carbon(zone), decision, range(decision, decision + hours)))
    except ElectricityError:
        return None
