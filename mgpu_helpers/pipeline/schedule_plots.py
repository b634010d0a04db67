"""Used by notebooks 02a (through :func:`~mgpu_helpers.pipeline.plot_timeline`) and 02b
(:func:`plot_schedule` in §3, and the simulator widget). Gantt charts of pipeline schedules, simulated
(:func:`plot_schedule`) or measured (:func:`plot_gantt` of any list of tasks).

One row per stage, a bar per forward (blue) and backward (orange) pass; white space is the *bubble*.
matplotlib is imported only when drawing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._checks import axes, real
from .schedules import SCHEDULES, ScheduleResult, Task

__all__ = ["plot_gantt", "plot_schedule"]

#: Bar colours in Gantt charts: forward and backward passes.
_KIND_COLORS: dict[str, str] = {"F": "#4C72B0", "B": "#DD8452"}


def _check_tasks(tasks: Any) -> list[Task]:
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
        raise TypeError(
            f"tasks must be a list of Task (e.g. simulate(...).tasks or a Timeline's .tasks), "
            f"not {type(tasks).__name__}"
        )
    if not tasks:
        raise ValueError("no tasks to draw: pass a non-empty list of Task")
    bad = next((t for t in tasks if not isinstance(t, Task)), None)
    if bad is not None:
        raise TypeError(f"tasks must contain Task objects only, found {type(bad).__name__}")
    return list(tasks)


def plot_gantt(
    tasks: Sequence[Task],
    *,
    ax: Any = None,
    title: str | None = None,
    time_unit: str = "time",
    scale: float = 1.0,
    note: str | None = None,
    stage_names: Sequence[str] | None = None,
    label_microbatches: bool = True,
) -> Any:
    """Draw a Gantt chart: one row per stage (stage 0 on top), a bar per forward (blue) / backward (orange).

    White space in a row is idle time — the pipeline *bubble*. Bars of chunk > 0 (interleaved
    schedules) are drawn lighter. ``scale`` multiplies times (e.g. 1000 to show seconds as ms). ``note``
    is written under the title (e.g. "measured on …" or "simulated"). Returns the axes.
    """
    tasks = _check_tasks(tasks)
    axes(ax)
    scale = real("scale (factor applied to times, e.g. 1000 for s -> ms)", scale, 0, open_low=True)
    stages = 1 + max(t.stage for t in tasks)
    if stage_names is not None:
        if isinstance(stage_names, str) or len(stage_names) < stages:
            raise ValueError(f"stage_names must be a list of at least {stages} names (one per stage)")
        stage_names = [str(n) for n in stage_names[:stages]]
    from matplotlib.patches import Patch

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(10, 0.55 * stages + 1.4))
    t0 = min(t.start for t in tasks)
    span = (max(t.end for t in tasks) - t0) * scale
    groups: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    for t in tasks:  # one bar collection per stage, kind and chunk shade: fast to draw
        x, w = (t.start - t0) * scale, t.duration * scale
        groups.setdefault((t.stage, t.kind, t.chunk > 0), []).append((x, w))
        if label_microbatches and w > span / 60:
            ax.text(
                x + w / 2, t.stage, str(t.microbatch), ha="center", va="center", fontsize=7, color="white"
            )
    for (stage, kind, later_chunk), bars in groups.items():
        ax.broken_barh(
            bars,
            (stage - 0.4, 0.8),
            facecolors=_lighter(_KIND_COLORS[kind], 0.45 if later_chunk else 0.0),
            edgecolors="white",
            linewidth=0.6,
        )
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels(stage_names or [f"stage {s}" for s in range(stages)])
    ax.set_xlim(0, span * 1.01 if span > 0 else 1)
    ax.set_xlabel(time_unit)
    ax.set_title(title or "Pipeline schedule", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    handles = [
        Patch(color=_KIND_COLORS["F"], label="forward"),
        Patch(color=_KIND_COLORS["B"], label="backward"),
    ]
    if any(t.chunk for t in tasks):
        handles.append(Patch(color=_lighter(_KIND_COLORS["F"], 0.45), label="forward, chunk ≥ 1"))
        handles.append(Patch(color=_lighter(_KIND_COLORS["B"], 0.45), label="backward, chunk ≥ 1"))
    handles.append(Patch(facecolor="white", edgecolor="#BBBBBB", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax


def _lighter(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` blended with white: ``amount`` 0 keeps it, 1 gives white."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1.0 - c) * amount for c in to_rgb(color))  # type: ignore[return-value]


def plot_schedule(result: ScheduleResult, *, ax: Any = None) -> Any:
    """Gantt chart of a simulated schedule, titled with its bubble and peak in-flight micro-batches."""
    if not isinstance(result, ScheduleResult):
        raise TypeError(
            f"result must be a ScheduleResult from simulate(...), not {type(result).__name__}; "
            "draw measured tasks with plot_gantt(tasks) or plot_timeline(timeline)"
        )
    title = (
        f"{SCHEDULES[result.schedule]}: p={result.p}, m={result.m}"
        + (f", v={result.v}" if result.schedule == "interleaved" else "")
        + f" — bubble {result.bubble_fraction:.0%} of the step ({result.bubble_ratio:.0%} of ideal),"
        f" peak in flight {max(result.peak_activations):g}"
    )
    return plot_gantt(
        result.tasks,
        ax=ax,
        title=title,
        time_unit=f"time (one forward pass of a stage = 1; backward = {result.backward / result.forward:g})",
        note="simulated: uniform stages, free communication",
        label_microbatches=result.m * result.v <= 32,
    )
