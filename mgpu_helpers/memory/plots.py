"""Used by notebooks 01, 05b and 07a (07a through the memory panel): memory plots — a stacked timeline
of bytes per category (:func:`plot_memory_timeline`) and stacked bars per device (:func:`plot_device_bars`).

Every function draws on a matplotlib ``Axes`` (a new figure when none is given) and returns it, so a
notebook can add titles or combine plots. Colours per memory category are fixed course-wide
(:data:`CATEGORY_COLORS`). matplotlib is imported inside the functions.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from .categories import CATEGORIES, CATEGORY_LABELS, MemorySample

__all__ = ["CATEGORY_COLORS", "plot_device_bars", "plot_memory_timeline"]

#: One colour per memory category, the same in every plot and in the memory panel.
CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#55A868",
    "other": "#C44E52",
}

_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _check_common(ax: Any, title: Any, unit: Any) -> None:
    if not isinstance(unit, str) or unit not in _UNITS:
        raise ValueError(f"unit must be one of {sorted(_UNITS)}, not {unit!r}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string or None, not {title!r}")
    if ax is not None:
        from matplotlib.axes import Axes

        if not isinstance(ax, Axes):
            raise TypeError(
                f"ax must be a matplotlib Axes (e.g. plt.subplots()[1]) or None, not {type(ax).__name__}"
            )


def _samples(name: str, values: Any, *, allow_empty: bool) -> list[MemorySample]:
    if hasattr(values, "timeline") and hasattr(values, "marks"):
        raise TypeError(
            f"{name} must be a list of MemorySample: pass tracker.timeline and tracker.marks, not the tracker"
        )
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise TypeError(
            f"{name} must be a list of MemorySample (e.g. tracker.{name}), not {type(values).__name__}"
        )
    bad = next((v for v in values if not isinstance(v, MemorySample)), None)
    if bad is not None:
        raise TypeError(
            f"{name} must hold MemorySample objects (e.g. tracker.{name}), not {type(bad).__name__}"
        )
    if not values and not allow_empty:
        raise ValueError(f"{name} is empty: pass tracker.{name} after tracking some work")
    return list(values)


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
    """Stacked area of bytes per category against event number; marks drawn as labelled lines.

    Args:
        timeline: samples from :attr:`MemoryTracker.timeline` (or a non-empty slice of it).
        marks: samples from :attr:`MemoryTracker.marks`, drawn as dashed vertical lines.
        ax: axes to draw on (default: a new figure).
        title: plot title (default: "Memory by category over time").
        unit: one of ``"B"``, ``"KiB"``, ``"MiB"``, ``"GiB"``.

    Returns:
        The matplotlib axes.
    """
    timeline = _samples("timeline", timeline, allow_empty=False)
    marks = _samples("marks", marks, allow_empty=True)
    _check_common(ax, title, unit)
    ax = _axes(ax)
    scale = _UNITS[unit]
    x = [s.event for s in timeline]
    ys = [[s.bytes.get(c, 0) / scale for s in timeline] for c in CATEGORIES]
    ax.stackplot(
        x,
        *ys,
        labels=[_legend_label(c, y) for c, y in zip(CATEGORIES, ys, strict=True)],
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
    _legend(ax)
    ax.margins(x=0)
    return ax


def _legend_label(category: str, values: Any) -> str:
    """The legend entry of a category, or matplotlib's "no entry" where the plot never shows it."""
    return CATEGORY_LABELS[category] if any(values) else "_nolegend_"


def _legend(ax: Any) -> None:
    """The categories the plot shows, beside it (none where every value is zero)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _check_per_device(per_device: Any) -> None:
    if not isinstance(per_device, Mapping):
        raise TypeError(
            "per_device must map a device name to bytes per category, e.g. {'cuda:0': {'parameters': 4096}} "
            f"or tracker.peak_breakdown_by_device, not {type(per_device).__name__}"
        )
    if not per_device:
        raise ValueError(
            "per_device is empty: pass at least one device, e.g. {'cuda:0': {'parameters': 4096}}"
        )
    for device, row in per_device.items():
        if not isinstance(row, Mapping):
            raise TypeError(f"per_device[{device!r}] must map categories to bytes, not {type(row).__name__}")
        unknown = sorted(set(row) - set(CATEGORIES))
        if unknown:
            raise ValueError(f"per_device[{device!r}] has unknown categories {unknown}: use {CATEGORIES}")
        for cat, value in row.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
                raise ValueError(f"per_device[{device!r}][{cat!r}] must be a byte count >= 0, not {value!r}")


def plot_device_bars(
    per_device: Mapping[str, Mapping[str, float]],
    *,
    ax: Any = None,
    title: str | None = None,
    unit: str = "MiB",
    note: str | None = None,
) -> Any:
    """Stacked bars: one bar per device, stacked by memory category.

    Args:
        per_device: device name -> bytes per category (keys from :data:`CATEGORIES`; missing ones count
            as 0), e.g. :attr:`MemoryTracker.peak_breakdown_by_device`.
        ax: axes to draw on (default: a new figure).
        title: plot title (default: "Memory per device").
        unit: one of ``"B"``, ``"KiB"``, ``"MiB"``, ``"GiB"``.
        note: written under the title, e.g. "simulated: accounted per virtual device on CPU".

    Returns:
        The matplotlib axes.
    """
    _check_per_device(per_device)
    _check_common(ax, title, unit)
    if note is not None and not isinstance(note, str):
        raise TypeError(f"note must be a string or None, not {note!r}")
    ax = _axes(ax, figsize=(6, 3.2))
    scale = _UNITS[unit]
    devices = [str(d) for d in per_device]
    rows = list(per_device.values())
    bottom = [0.0] * len(devices)
    for cat in CATEGORIES:
        vals = [row.get(cat, 0) / scale for row in rows]
        ax.bar(devices, vals, bottom=bottom, color=CATEGORY_COLORS[cat], label=_legend_label(cat, vals))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(title or "Memory per device", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    _legend(ax)
    return ax
