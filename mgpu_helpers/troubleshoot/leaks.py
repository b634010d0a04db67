"""Used by notebook 07a (memory problems), §4, and its grader of exercise 07a.1: does memory keep
growing from step to step (a leak)?

:func:`memory_growth` fits a straight line through one memory reading per step (e.g. a
``MemoryTracker``'s ``mark(...).total``) and says whether it rises: the classic leak is
``total += loss`` in an evaluation loop, which keeps every batch's graph alive.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MemoryGrowth", "memory_growth"]


@dataclass
class MemoryGrowth:
    """Trend of a memory series taken once per step (see :func:`memory_growth`)."""

    bytes_per_step: float
    total_growth: int
    steps: int
    growing: bool

    def __str__(self) -> str:
        verdict = "GROWING: something keeps memory across steps" if self.growing else "flat"
        return (
            f"{self.bytes_per_step:,.0f} B/step over {self.steps} steps ({self.total_growth:+,} B): {verdict}"
        )


def _check_readings(values: object, min_bytes_per_step: object) -> list[float]:
    try:
        if isinstance(values, str | bytes | dict):
            raise TypeError
        readings = list(values)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            "values must be a list of per-step memory readings in bytes "
            f"(e.g. [m.total for m in tracker.marks]), not {type(values).__name__}"
        ) from None
    if len(readings) < 2:
        raise ValueError(f"memory_growth needs at least two readings (one per step), got {len(readings)}")
    for i, v in enumerate(readings):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"values[{i}] must be a number of bytes, not {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"values[{i}] must be a finite number of bytes, not {v}")
    if isinstance(min_bytes_per_step, bool) or not isinstance(min_bytes_per_step, numbers.Real):
        raise TypeError(f"min_bytes_per_step must be a number of bytes, not {min_bytes_per_step!r}")
    if not (min_bytes_per_step >= 0 and math.isfinite(min_bytes_per_step)):
        raise ValueError(
            f"min_bytes_per_step must be a finite number of bytes >= 0 (e.g. 1, or above RSS noise), "
            f"not {min_bytes_per_step}"
        )
    return [float(v) for v in readings]


def memory_growth(values: Iterable[float], *, min_bytes_per_step: float = 1.0) -> MemoryGrowth:
    """Least-squares slope of per-step memory readings (e.g. ``tracker.mark(...).total`` each step).

    ``growing`` is True when the slope is at least ``min_bytes_per_step`` and memory rose from the first
    to the last reading. In a healthy loop the reading at the same point of each step is the same
    (tracked bytes) or close to it (RSS: choose a threshold above its noise).
    """
    ys = _check_readings(values, min_bytes_per_step)
    n = len(ys)
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    var = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(ys)) / var
    total = int(ys[-1] - ys[0])
    return MemoryGrowth(slope, total, n, slope >= min_bytes_per_step and total > 0)
