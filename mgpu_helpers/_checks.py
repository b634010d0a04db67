"""Used by every notebook through the helpers' public functions: the one set of argument checks, whose
messages say what to pass instead (``TypeError`` for the wrong kind of value, ``ValueError`` for a value
out of range)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any


def whole(name: str, value: Any, minimum: int = 1, example: str = "", *, hint: str = "") -> int:
    """``value`` as an int if it is a whole number >= ``minimum`` (not a bool, str or float).

    ``example`` is shown as "such as …"; ``hint`` is appended to the message (e.g. why the minimum).
    """
    such_as = f" such as {example}" if example else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number >= {minimum}{such_as}, not {value!r}{hint}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}{such_as}, not {value}{hint}")
    return int(value)


def real(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    open_low: bool = False,
    example: str = "",
) -> float:
    """``value`` as a float if it is a finite number in ``[low, high]`` (``(low, high]`` if ``open_low``)."""
    such_as = f" such as {example}" if example else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number{such_as}, not {value!r}")
    value = float(value)
    too_low = value <= low if open_low else value < low
    if not math.isfinite(value) or too_low or value > high:
        bounds = f"{'>' if open_low else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
        raise ValueError(f"{name} must be a finite number {bounds}{such_as}, not {value}")
    return value


def sizes(name: str, values: Any, example: str = "(16, 32, 64)", minimum: int = 1) -> tuple[int, ...]:
    """A non-empty sequence of whole numbers >= ``minimum`` (e.g. batch sizes), as a tuple of ints."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | range):
        raise TypeError(f"{name} must be a list of whole numbers such as {example}, not {values!r}")
    if len(values) == 0:
        raise ValueError(f"{name} must not be empty; pass at least one value, e.g. {example}")
    return tuple(whole(f"every entry of {name}", v, minimum, example) for v in values)


def text(name: str, value: Any, example: str) -> str:
    """``value`` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty string such as {example!r}, not {value!r}")
    return value


def choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``; the message lists them."""
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, not {value!r}")
    return value


def axes(ax: Any, name: str = "ax") -> Any:
    """``ax`` if it is None or a matplotlib Axes (checked by duck typing, so matplotlib is not imported)."""
    if ax is not None and not (hasattr(ax, "add_patch") and hasattr(ax, "set_title")):
        raise TypeError(
            f"{name} must be a matplotlib Axes (e.g. from plt.subplots()) or None, not {type(ax).__name__}"
        )
    return ax
