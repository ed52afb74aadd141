"""A benchmark figure over repeats: median, range, and the flag that says the range is wider than the goal's margin."""

import pytest
from spread import Spread


def test_median_and_range_of_the_repeats():
    s = Spread.of([3.0, -1.0, 1.5])
    assert (s.median, s.low, s.high, s.width) == (1.5, -1.0, 3.0, 4.0)
    assert s.fields("sdk_overhead_pct") == ("sdk_overhead_pct=1.50 sdk_overhead_pct_range=-1.00..3.00 "
                                            "sdk_overhead_pct_repeats=3")


def test_even_repeats_take_the_mean_of_the_middle_two():
    assert Spread.of([1, 2, 4, 10]).median == 3.0


def test_a_range_wider_than_the_distance_to_the_goal_is_flagged():
    # median 1.5 meets a goal of 3, but the repeats span 4 points: the verdict is not firm
    assert Spread.of([3.0, -1.0, 1.5]).wider_than_margin(3.0)
    assert "x_spread_wider_than_margin=1" in Spread.of([3.0, -1.0, 1.5]).fields("x", goal=3.0)


def test_a_tight_range_well_inside_the_goal_is_not_flagged():
    s = Spread.of([0.9, 1.1, 1.0])
    assert s.margin(3.0) == pytest.approx(2.0)
    assert not s.wider_than_margin(3.0)
    assert s.fields("x", goal=3.0).endswith("x_spread_wider_than_margin=0")


def test_a_missed_goal_is_flagged_the_same_way_from_the_other_side():
    assert not Spread.of([5.0, 5.2, 5.1]).wider_than_margin(3.0)  # firmly missed
    assert Spread.of([2.0, 5.0, 3.5]).wider_than_margin(3.0)  # straddles it


def test_one_repeat_is_never_flagged_and_says_it_is_one():
    s = Spread.of([2.9])
    assert not s.wider_than_margin(3.0)
    assert "x_repeats=1" in s.fields("x", goal=3.0)


def test_digits_and_no_repeats():
    assert Spread.of([1.00049, 1.0211]).fields("loss_ratio", digits=4).startswith("loss_ratio=1.0108 ")
    with pytest.raises(ValueError):
        Spread.of([])
