"""Used by every notebook through :mod:`mgpu_helpers.hardware`: the row one GPU library reports for one
device, and the small text helpers the hardware modules share. Imports nothing heavy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

MIB = 1024**2
GIB = 1024**3
UNKNOWN_GPU_NAME = "unknown CUDA device"
_T = TypeVar("_T")


@dataclass
class _Row:
    """One device as a single library reported it (index in that library's numbering)."""

    index: int
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: float | None = None
    uuid: str | None = None


def _err(exc: BaseException) -> str:
    """``"TypeName: message"`` for an exception, without a trailing colon when empty."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _as_str(value: Any) -> str:
    """Decode bytes (old pynvml versions return bytes) and strip."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return str(value).strip()


def _finite(value: Any) -> float | None:
    """``float(value)`` or None when it is missing, not a number, or NaN (GPUtil's "[N/A]")."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _try(fn: Callable[[], _T]) -> _T | None:
    """Call ``fn`` and return None on any exception (for optional per-device fields)."""
    try:
        return fn()
    except Exception:
        return None


def _plural(n: int, word: str) -> str:
    """``"1 GPU"``, ``"2 GPUs"``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def _names_summary(rows: list[_Row]) -> str:
    """``"2× NVIDIA A100, 1× Tesla T4"`` style summary of the names in ``rows``."""
    groups: dict[str, int] = {}
    for row in rows:
        name = row.name or UNKNOWN_GPU_NAME
        groups[name] = groups.get(name, 0) + 1
    return ", ".join(f"{count}× {name}" for name, count in groups.items())
