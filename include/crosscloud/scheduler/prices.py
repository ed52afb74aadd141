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
from crosscloud.energy.prices import CsvFeed, ElectricityError, PriceOracle, hour_index, map_to_data_year, seasonal_naive
from crosscloud.scheduler.timing import MAX_HOURS, Rates


def federation_rates(fed: Federation, now: float, feed: CsvFeed | None = None, hours: int = MAX_HOURS) -> Rates:
    """``Rates`` for every priced pool of ``fed``, from the hour of ``now`` on, as known or forecast then."""
    feed = feed or CsvFeed()
    decision = hour_index(map_to_data_year(datetime.fromtimestamp(now, timezone.utc), feed.year))
    usd, co2 = {}, {}
    for cloud in fed.clouds:
        if cloud.grid is None:
            continue
        try:
            price = np.asarray(PriceOracle({cloud.grid.region: feed.prices(cloud.grid.region)})
                               .view(cloud.grid.region, decision, decision, hours))
        except ElectricityError:
            continue
        try:
            series = feed.carbon(cloud.grid.carbon_zone or cloud.grid.region)
            intensity = np.asarray(seasonal_naive(series, decision, range(decision, decision + hours)))
        except ElectricityError:
            intensity = None
        for pool in cloud.pools:
            key = (cloud.name, pool.accelerator)
            usd[key] = pool.price_per_device_hour + energy_price_per_device_hour(pool.power_w, price, cloud.grid.pue)
            if intensity is not None:  # g/kWh x kWh per device-hour -> kg
                co2[key] = intensity * pool.power_w / 1000 * cloud.grid.pue / 1000
    return Rates(int(now // 3600), usd, co2)
