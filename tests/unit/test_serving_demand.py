"""A served model's demand from the traffic it served: the hourly history, the seasonal-naive forecast, overrides."""

from __future__ import annotations

import pytest

from crosscloud.serving.demand import FIRST_HOURS_TPS, Demand, expected_tokens_per_s, seasonal_naive
from crosscloud.store.base import LocalStore

pytestmark = pytest.mark.inference

H = 3600.0
T0 = 480_000 * H  # on the hour


@pytest.fixture()
def demand(tmp_path) -> Demand:
    return Demand(LocalStore(tmp_path / "home", "beijing"), "team-a", "byte-lm")


def test_the_tokens_between_two_readings_are_spread_over_the_hours_they_cover(demand):
    assert demand.observe({"beijing-0@1": 1000}, T0 + 0.5 * H) is None  # the first reading: nothing to compare
    # 3,600 tokens in the next hour and a half: 0.5 h of them in the first hour, 1 h in the second
    rate = demand.observe({"beijing-0@1": 1000 + 3600, "shanghai-0@7": 1800}, T0 + 2 * H)
    assert rate == pytest.approx((3600 + 1800) / (1.5 * H))
    assert demand.history() == pytest.approx({480_000: rate, 480_001: rate})
    # a replica restarted (a new start) counts from 0; one that went away adds nothing
    demand.observe({"beijing-0@9": 720}, T0 + 2.5 * H)
    assert demand.history()[480_002] == pytest.approx(720 / (0.5 * H))


def test_the_forecast_is_the_same_hour_a_day_before_else_the_last_hour_and_its_rise_with_its_error():
    assert seasonal_naive({}, 100).tokens_per_s is None
    assert seasonal_naive({97: 10.0, 98: 30.0}, 99).tokens_per_s == 90.0  # 30, risen threefold: sized ahead
    rising = seasonal_naive({97: 10.0, 98: 30.0}, 100)  # two hours on (the next hour of a run in hour 99): twice
    assert (rising.tokens_per_s, rising.method) == (270.0, "last hour measured")
    assert seasonal_naive({90: 10.0, 91: 30.0}, 100).tokens_per_s == 270.0  # never raised more than twice
    assert rising.mape == pytest.approx(20 / 30)  # scored on hour 98 alone, predicted by hour 97
    assert seasonal_naive({97: 30.0, 98: 10.0}, 100).tokens_per_s == 10.0  # a fall is not extrapolated
    day = {h: 10.0 + (h % 24) for h in range(48)}  # the same daily shape twice
    got = seasonal_naive(day, 50)
    assert (got.tokens_per_s, got.method) == (day[26], "same hour a day before")
    first_day = [abs(day[0] - day[1]) / day[1]] + [abs(day[h - 1] * day[h - 1] / day[h - 2] - day[h]) / day[h]
                                                   for h in range(2, 24)]
    assert got.mape == pytest.approx(sum(first_day) / 47, rel=1e-9)  # the second day is exact


def test_the_param_overrides_the_forecast_and_no_history_sizes_for_the_first_hours(demand):
    tps, why = expected_tokens_per_s(demand, {}, T0, T0, None)
    assert tps == FIRST_HOURS_TPS and "no traffic measured yet" in why["why"]
    tps, why = expected_tokens_per_s(demand, {"beijing-0@1": 7200}, T0 + H, T0 + H, None)
    assert tps == pytest.approx(2.0) and why["method"] == "last hour measured"
    tps, why = expected_tokens_per_s(demand, {"beijing-0@1": 7200}, T0 + 2 * H, T0 + 2 * H, 500.0)
    assert tps == 500.0 and "Param" in why["why"] and why["forecast_tokens_per_s"] == pytest.approx(0.0)


def test_the_history_is_shared_through_the_store_and_keeps_two_weeks(demand, tmp_path):
    demand.observe({"r@1": 0}, T0)
    demand.observe({"r@1": 3600}, T0 + H)
    other = Demand(LocalStore(tmp_path / "home", "beijing"), "team-a", "byte-lm")  # another worker, the same store
    assert other.history() == pytest.approx({480_000: 1.0})
    other.observe({"r@1": 3600}, T0 + 15 * 24 * H)
    assert 480_000 not in other.history()


def test_a_run_within_the_hour_plans_the_rest_of_it_by_what_it_served_so_far():
    got = seasonal_naive({100: 12.0}, 100)
    assert (got.tokens_per_s, got.method, got.mape) == (12.0, "last hour measured", None)  # nothing before to score
