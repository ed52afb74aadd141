"""Electricity price files in the public data's layout, for tests that need prices they choose."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path


def write_flat_prices(folder: Path, prices: dict[str, float], year: int = 2023) -> list[Path]:
    """A year of hourly prices, one flat price per region (USD/MWh), as ``electricity/prices/<REGION>_<year>.csv``
    under ``folder``; the files written."""
    out = folder / "electricity" / "prices"
    out.mkdir(parents=True, exist_ok=True)
    start = datetime(year, 1, 1, tzinfo=timezone.utc)
    hours = [start + timedelta(hours=h) for h in range(int((datetime(year + 1, 1, 1, tzinfo=timezone.utc) - start)
                                                            .total_seconds() // 3600))]
    written = []
    for region, price in prices.items():
        rows = [f"{t:%Y-%m-%d %H:%M:%S}+00:00,,{price}" for t in hours]
        path = out / f"{region}_{year}.csv"
        path.write_text("Datetime (UTC),Datetime (Local),Price (USD/MWh)\n" + "\n".join(rows) + "\n")
        written.append(path)
    return written
