"""Used by notebooks 01, 02b, 03b, 05b and 07a (through the tracker, the estimator, the plots and the panel):
the four memory categories every number in the course is split into, their human names, one timeline
sample, and :func:`format_bytes`.

Imports nothing but the standard library, so every other memory module can build on it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CATEGORIES", "CATEGORY_LABELS", "MemorySample", "format_bytes"]

#: Category keys, in stacking order (bottom to top in plots).
CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer", "other")
#: Human names for the category keys.
CATEGORY_LABELS: dict[str, str] = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "other": "activations & other",
}


def format_bytes(n: float) -> str:
    """Format a byte count with binary units, e.g. ``format_bytes(4_004_000) == '3.82 MiB'``.

    Args:
        n: a number of bytes (int or float; negative for a difference).

    Returns:
        ``"512 B"``, ``"3.82 MiB"``, … (whole bytes below 1 KiB, two decimals above).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(f"format_bytes needs a number of bytes such as 4_004_000, not {n!r}")
    n = float(n)
    if not math.isfinite(n):
        raise ValueError(f"format_bytes needs a finite number of bytes, not {n}")
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass
class MemorySample:
    """Bytes per category after event number ``event`` (one event = one allocation or free).

    ``bytes`` is keyed by :data:`CATEGORIES`; ``label`` is set on samples made by
    :meth:`~mgpu_helpers.memory.MemoryTracker.mark`.
    """

    event: int
    bytes: dict[str, int]
    label: str | None = None

    @property
    def total(self) -> int:
        """Sum over categories."""
        return sum(self.bytes.values())


def _text_table(rows: Sequence[Sequence[str]], *, rule: bool = False) -> str:
    """Align rows of text cells: the first column left, the others right; ``rule`` underlines row 0."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if rule and i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
