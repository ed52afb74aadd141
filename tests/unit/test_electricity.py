"""Electricity feeds (CSV, HTTP), gaps and staleness, and the forecast and its error."""

from __future__ import annotations

import functools
import http.server
import threading
from datetime import datetime, timedelta, timezone

import pytest

from crosscloud.energy.prices import (
    CsvFeed,
    HttpFeed,
    PriceGapError,
    PriceOracle,
    UnknownRegionError,
    check,
    forecast_error,
    hour_index,
    known_until,
    map_to_data_year,
    parse_price_csv,
    seasonal_naive,
)

UTC = timezone.utc
HEADER = "Datetime (UTC),Datetime (Local),Price (USD/MWh)\n"


def _csv(values, start=datetime(2023, 1, 1, tzinfo=UTC), skip=()):
    lines = [HEADER]
    for k, v in enumerate(values):
        if k in skip:
            continue
        t = start + timedelta(hours=k)
        lines.append(f"{t:%Y-%m-%d %H:%M:%S}+00:00,{t:%Y-%m-%d %H:%M:%S}+00:00,{v}\n")
    return "".join(lines)


def _write(root, region, text, sub="prices"):
    folder = root / "electricity" / sub
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{region}_2023.csv").write_text(text)


def test_csv_feed_reads_prices(tmp_path):
    _write(tmp_path, "XX", _csv([10.0, -5.0, 20.0]))
    s = CsvFeed(tmp_path).prices("XX")
    assert s.at(datetime(2023, 1, 1, 1, tzinfo=UTC)) == -5.0
    assert s.window(datetime(2023, 1, 1, tzinfo=UTC), 3) == [10.0, -5.0, 20.0]
    assert s.gaps() == []


def test_gap_is_reported_and_never_used(tmp_path):
    _write(tmp_path, "XX", _csv([10.0, 11.0, 12.0, 13.0], skip={2}))
    s = CsvFeed(tmp_path).prices("XX")
    gap = datetime(2023, 1, 1, 2, tzinfo=UTC)
    assert s.gaps() == [gap]
    assert s.get(gap) is None
    with pytest.raises(PriceGapError, match="XX at 2023-01-01 02:00"):
        s.at(gap)
    with pytest.raises(PriceGapError):
        s.window(datetime(2023, 1, 1, tzinfo=UTC), 4)
    h = check(s, datetime(2023, 1, 1, 4, tzinfo=UTC))
    assert h.gaps == (gap,) and not h.stale and "1 missing hour" in h.describe()


def test_empty_value_is_a_gap():
    s = parse_price_csv(HEADER + "2023-01-01 00:00:00+00:00,x,1.0\n2023-01-01 01:00:00+00:00,x,\n"
                        "2023-01-01 02:00:00+00:00,x,3\n", "XX")
    assert s.get(hour_index(datetime(2023, 1, 1, 1))) is None and len(s.gaps()) == 1


def test_stale_data_is_detected(tmp_path):
    _write(tmp_path, "XX", _csv([1.0] * 5))
    s = CsvFeed(tmp_path).prices("XX")
    assert check(s, datetime(2023, 1, 1, 6, tzinfo=UTC), timedelta(hours=2)).stale is False
    h = check(s, datetime(2023, 1, 2, 0, tzinfo=UTC), timedelta(hours=2))
    assert h.stale and h.age == timedelta(hours=20) and "STALE" in h.describe()
    with pytest.raises(PriceGapError, match="outside the data"):
        s.at(datetime(2023, 1, 2, tzinfo=UTC))


def test_unknown_region_names_the_available_ones(tmp_path):
    _write(tmp_path, "XX", _csv([1.0]))
    with pytest.raises(UnknownRegionError, match="available: XX"):
        CsvFeed(tmp_path).prices("YY")


def test_http_feed_serves_the_same_rows(tmp_path):
    _write(tmp_path, "XX", _csv([10.0, 11.0, 12.0], skip={1}))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "electricity"))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        feed = HttpFeed(f"http://127.0.0.1:{server.server_address[1]}")
        s = feed.prices("XX")
        assert s.at(datetime(2023, 1, 1, 2, tzinfo=UTC)) == 12.0
        assert s.values == CsvFeed(tmp_path).prices("XX").values
        with pytest.raises(PriceGapError):
            s.at(datetime(2023, 1, 1, 1, tzinfo=UTC))
        with pytest.raises(UnknownRegionError):
            feed.prices("YY")
    finally:
        server.shutdown()
        server.server_close()


def test_forecast_error_on_a_hand_made_series():
    err = forecast_error([10.0, 20.0, -10.0, 0.0], [12.0, 20.0, -10.0, 0.0])
    assert err["mae"] == pytest.approx(0.5)
    # sMAPE: 2*2/22 for the first pair, 0 for the next two, the (0, 0) pair skipped
    assert err["smape_pct"] == pytest.approx(100 * (4 / 22) / 3)


def test_seasonal_naive_uses_only_known_hours():
    start = hour_index(datetime(2023, 1, 1))
    s = parse_price_csv(_csv([float(h % 24) + 100 * (h // 24) for h in range(24 * 3)]), "XX")
    known = start + 47  # two days known
    f = seasonal_naive(s, known, [start + 48, start + 60], lag=24)
    assert f == [100.0 + 0, 100.0 + 12]  # same hour of the last known day, not the actual (200 + ...)
    assert seasonal_naive(s, known, [start + 10]) == [10.0]  # known hours are the actual values


def test_known_until_day_ahead_rule():
    d = hour_index(datetime(2023, 7, 10))
    assert known_until(d + 11) == d + 23
    assert known_until(d + 12) == d + 47
    assert known_until(d + 12, day_ahead=False) == d + 12
    oracle = PriceOracle({}, {})
    assert oracle.known_until(d + 13) == d + 47


def test_map_now_onto_the_data_year():
    assert map_to_data_year(datetime(2026, 12, 3, 6, 30, tzinfo=UTC), 2023) == datetime(2023, 12, 3, 6, tzinfo=UTC)
    assert map_to_data_year(datetime(2024, 2, 29, 1, tzinfo=UTC), 2023) == datetime(2023, 2, 28, 1, tzinfo=UTC)
    assert map_to_data_year(datetime(2024, 12, 31, 1, tzinfo=UTC), 2023) == datetime(2023, 12, 31, 1, tzinfo=UTC)
