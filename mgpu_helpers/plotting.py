"""Plots used across the notebooks: memory timelines and per-device bars.

Every function draws on a matplotlib ``Axes`` (a new figure when none is given) and returns it, so a
notebook can add titles or combine plots. Colours per memory category are fixed course-wide.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .memory import MemorySample

#: One colour per memory category, the same in every plot and in the widget.
CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#55A868",
    "other": "#C44E52",
}

_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _axes(ax: Any, figsize: tuple[float, float] = (8, 3.2)) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_memory_timeline(
    timeline: Sequence[MemorySample],
    marks: Sequence[MemorySample] = (),
    *,
    ax: Any = None,
    title: str | None = None,
    unit: str = "MiB",
) -> Any:
    """Stacked area of bytes per category against event number; marks drawn as labelled lines."""
    from .memory import CATEGORIES, CATEGORY_LABELS

    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {sorted(_UNITS)}, not {unit!r}")
    ax = _axes(ax)
    scale = _UNITS[unit]
    x = [s.event for s in timeline]
    ys = [[s.bytes[c] / scale for s in timeline] for c in CATEGORIES]
    if x:
        ax.stackplot(
            x,
            *ys,
            labels=[CATEGORY_LABELS[c] for c in CATEGORIES],
            colors=[CATEGORY_COLORS[c] for c in CATEGORIES],
            step="post",
            alpha=0.85,
        )
    label_marks = len(marks) <= 12  # beyond that, labels overlap: draw the lines only
    for m in marks if len(marks) <= 200 else ():
        ax.axvline(m.event, color="black", lw=0.7 if label_marks else 0.3, ls="--", alpha=0.6)
        if m.label and label_marks:
            ax.annotate(
                m.label,
                (m.event, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                va="top",
                ha="right",
            )
    ax.set_xlabel("allocation / free event")
    ax.set_ylabel(f"live tensor memory ({unit})")
    ax.set_title(title or "Memory by category over time")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.margins(x=0)
    return ax


def plot_device_bars(
    per_device: dict[str, dict[str, int]],
    *,
    ax: Any = None,
    title: str | None = None,
    unit: str = "MiB",
    note: str | None = None,
) -> Any:
    """Stacked bars: one bar per device, stacked by memory category.

    ``per_device`` maps a device name to bytes per category (missing categories count as 0).
    ``note`` is written under the title, e.g. "simulated: accounted per virtual device on CPU".
    """
    from .memory import CATEGORIES, CATEGORY_LABELS

    ax = _axes(ax, figsize=(6, 3.2))
    scale = _UNITS[unit]
    devices = list(per_device)
    bottom = [0.0] * len(devices)
    for cat in CATEGORIES:
        vals = [per_device[d].get(cat, 0) / scale for d in devices]
        ax.bar(devices, vals, bottom=bottom, color=CATEGORY_COLORS[cat], label=CATEGORY_LABELS[cat])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(title or "Memory per device", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax


def figure_to_png(fig: Any, dpi: int = 80) -> bytes:
    """Render a matplotlib figure to PNG bytes (used by widgets, which show images, not figures)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()
