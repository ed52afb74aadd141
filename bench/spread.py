"""A figure over repeats on a shared machine: its median, its range, and whether the range allows a verdict.

On a 2-core machine shared with other work, one repeat of a benchmark can
swing by more than the margin between its result and its goal. A figure is
therefore quoted as the median of its repeats with their range, and its last
line says when the range is wider than the margin: the distance from the
median to the goal. Such a figure meets (or misses) its goal only as a
median, not reliably.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """The repeats of one figure."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values) -> Spread:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("a spread needs at least one repeat")
        return cls(values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def width(self) -> float:
        return self.high - self.low

    def margin(self, goal: float) -> float:
        """How far the median is from the goal, on either side."""
        return abs(goal - self.median)

    def wider_than_margin(self, goal: float) -> bool:
        """Whether the repeats straddle more than the median's distance to the goal: the verdict is not firm.

        One repeat has no spread to speak of and is never flagged; it is not a
        measurement of its spread either, which ``fields`` shows as its count.
        """
        return len(self.values) > 1 and self.width > self.margin(goal)

    def fields(self, name: str, goal: float | None = None, digits: int = 2) -> str:
        """``name=<median> name_range=<low>..<high> name_repeats=<n>`` and, against a goal, the flag
        ``name_spread_wider_than_margin=<0|1>``: key=value fields for a benchmark's last line."""
        f = f"{{:.{digits}f}}"
        out = (f"{name}={f.format(self.median)} {name}_range={f.format(self.low)}..{f.format(self.high)} "
               f"{name}_repeats={len(self.values)}")
        if goal is not None:
            out += f" {name}_spread_wider_than_margin={int(self.wider_than_margin(goal))}"
        return out
