"""A least-squares slope for tests that show why the product uses a robust trend instead.

Why here: the product decides with a Theil-Sen slope (acceptance/decide.py); the
least-squares line is only the foil the tests compare it with, so it lives with them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """Slope of the least-squares line through ``(t, y)`` points (two distinct t at least)."""
    return statistics.linear_regression([t for t, _ in points], [y for _, y in points]).slope
