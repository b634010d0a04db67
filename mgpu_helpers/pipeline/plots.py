"""Used by notebook 02a (:func:`plot_timeline`, :func:`draw_alexnet_split`); :func:`plot_sweep` and
:func:`plot_activation_traces` draw :func:`~mgpu_helpers.pipeline.run_pipeline` results for scripts.
Pictures of measured pipelines: a timeline as a Gantt chart, a micro-batch sweep against the theory,
activations held per stage, and AlexNet's split over two GPUs. matplotlib is imported only when
drawing; every function returns its axes or figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._checks import axes, real, whole
from .runner import PipelineRun
from .schedule_plots import plot_gantt
from .schedules import Task, gpipe_bubble, pipeline_speedup
from .stages import Timeline

__all__ = ["draw_alexnet_split", "plot_activation_traces", "plot_sweep", "plot_timeline"]

_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def plot_timeline(
    timeline: Timeline | Sequence[Task],
    *,
    ax: Any = None,
    title: str | None = None,
    note: str | None = None,
    stage_names: Sequence[str] | None = None,
) -> Any:
    """Gantt chart of a measured timeline in milliseconds; idle stages show as white space.

    ``note`` should say where it was measured (e.g. ``"measured on " + hardware_label()``).
    """
    if isinstance(timeline, Timeline):
        tl = timeline
    elif isinstance(timeline, Sequence) and not isinstance(timeline, (str, bytes)):
        tl = Timeline(list(timeline))
    else:
        raise TypeError(f"timeline must be a Timeline or a list of Task, not {type(timeline).__name__}")
    axes(ax)
    if title is None:
        idle = ", ".join(f"stage {s} idle {tl.idle_fraction(s):.0%}" for s in range(tl.stages))
        title = f"{tl.label or 'measured step'}: {tl.makespan * 1e3:.0f} ms — {idle}"
    return plot_gantt(
        tl.tasks, ax=ax, title=title, time_unit="ms", scale=1e3, note=note, stage_names=stage_names
    )


def _numbers(values: Any, name: str, n: int | None = None) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty list of numbers, not {values!r}")
    if n is not None and len(values) != n:
        raise ValueError(f"{name} must hold one value per m ({n}), not {len(values)}")
    return [real(f"each of {name}", v, 0) for v in values]


def plot_sweep(
    ms: Sequence[int],
    speedups: Sequence[float],
    bubbles: Sequence[float],
    p: int,
    *,
    note: str | None = None,
) -> Any:
    """Two panels: measured speed-up vs ``m·p/(m+p-1)``, measured idle share vs ``(p-1)/(m+p-1)``.

    ``ms`` are the micro-batch counts (ints >= 1), ``speedups`` and ``bubbles`` one measured value per m.
    """
    if isinstance(ms, (str, bytes)) or not isinstance(ms, Sequence) or not ms:
        raise TypeError(f"ms must be a non-empty list of micro-batch counts, not {ms!r}")
    ms = [whole("each m in ms (micro-batches)", m, 1) for m in ms]
    speedups = _numbers(speedups, "speedups", len(ms))
    bubbles = _numbers(bubbles, "bubbles", len(ms))
    whole("p (pipeline stages)", p, 1)
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    fine = [1 + i * (max(ms) - 1) / 100 for i in range(101)]
    a.plot(fine, [f * p / (f + p - 1) for f in fine], color="#999999", label="theory m·p/(m+p−1)")
    a.plot(ms, [pipeline_speedup(p, m) for m in ms], "o", color="#999999")
    a.plot(ms, speedups, "o-", color="#4C72B0", label="measured")
    a.axhline(p, ls=":", color="black", lw=0.8)
    a.text(ms[0], p, f" limit p = {p}", va="bottom", fontsize=8)
    a.set(
        xlabel="micro-batches m",
        ylabel="speed-up over naive split",
        title="Speed-up",
        xscale="log",
        ylim=(0, max(p, *speedups) * 1.1),
    )
    a.minorticks_off()
    a.set_xticks(list(ms), [str(m) for m in ms])
    a.legend(fontsize=8)
    b.plot(fine, [(p - 1) / (f + p - 1) for f in fine], color="#999999", label="theory (p−1)/(m+p−1)")
    b.plot(ms, [gpipe_bubble(p, m) for m in ms], "o", color="#999999")
    b.plot(ms, bubbles, "o-", color="#DD8452", label="measured idle share")
    b.set(
        xlabel="micro-batches m",
        ylabel="bubble: idle share of the step",
        title="Bubble",
        xscale="log",
        ylim=(0, 1),
    )
    b.minorticks_off()
    b.set_xticks(list(ms), [str(m) for m in ms])
    b.legend(fontsize=8)
    if note:
        fig.suptitle(note, fontsize=8, style="italic")
    fig.tight_layout()
    return fig


def plot_activation_traces(runs: Sequence[PipelineRun], *, unit: str = "MiB", note: str | None = None) -> Any:
    """One panel per stage: activation bytes held after each pass, one line per run (e.g. GPipe vs 1F1B).

    Needs runs made with ``PipelineSpec(track_memory=True)``.
    """
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Sequence) or not runs:
        raise TypeError(f"runs must be a non-empty list of PipelineRun from run_pipeline(...), not {runs!r}")
    bad = next((r for r in runs if not isinstance(r, PipelineRun)), None)
    if bad is not None:
        raise TypeError(f"runs must hold PipelineRun objects (from run_pipeline), not {type(bad).__name__}")
    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {list(_UNITS)}, not {unit!r}")
    if not all(run.activation_traces and all(run.activation_traces) for run in runs):
        raise ValueError("these runs have no memory traces: run them with PipelineSpec(track_memory=True)")
    import matplotlib.pyplot as plt

    scale = _UNITS[unit]
    stages = len(runs[0].activation_traces)
    fig, axes = plt.subplots(1, stages, figsize=(5 * stages, 3.2), sharey=True, squeeze=False)
    for s, ax in enumerate(axes[0]):
        for run, color in zip(runs, ("#C44E52", "#4C72B0", "#55A868", "#8172B3"), strict=False):
            trace = [(label, b) for label, b in run.activation_traces[s] if label != "end"]
            ax.step(
                range(len(trace) + 1),
                [0.0] + [b / scale for _, b in trace],
                where="post",
                color=color,
                label=f"{run.timeline.label}: holds at most {run.peak_in_flight[s]} micro-batch(es)",
            )
        ax.set(title=f"stage {s}", xlabel="passes done on this stage (F and B)")
        ax.legend(fontsize=8, loc="upper right")
    axes[0][0].set_ylabel(f"activations held ({unit})")
    fig.suptitle(note or "Activations held between passes", fontsize=9)
    fig.tight_layout()
    return fig


def draw_alexnet_split(ax: Any = None) -> Any:
    """AlexNet (2012) as trained on two GPUs: each GPU holds half of every layer's kernels.

    Most layers only see the half on their own GPU; the two halves exchange activations only where
    arrows cross: into conv3 (from both halves of conv2) and into each fully connected layer.
    Returns the axes.
    """
    axes(ax)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from ..figures import GPU_COLOR

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.4))
    layers = ["input", "C1", "C2", "C3", "C4", "C5", "FC6", "FC7", "FC8"]
    cross_into = {"C3", "FC6", "FC7", "FC8"}  # layers that read both GPUs' halves
    xs = {name: i * 1.25 for i, name in enumerate(layers)}
    rows = {0: 1.6, 1: 0.3}
    colors = {0: GPU_COLOR, 1: "#4C9A2A"}
    w, h = 0.8, 0.6
    for gpu, y in rows.items():
        ax.text(-0.6, y + h / 2, f"GPU {gpu}", ha="right", va="center", fontsize=10, weight="bold")
        for name in layers[1:]:
            ax.add_patch(
                FancyBboxPatch((xs[name], y), w, h, boxstyle="round,pad=0.03", fc=colors[gpu], ec="none")
            )
            ax.text(
                xs[name] + w / 2,
                y + h / 2,
                name,
                ha="center",
                va="center",
                color="white",
                fontsize=9,
                weight="bold",
            )
    ax.add_patch(
        FancyBboxPatch((xs["input"], 0.55), w, 1.1, boxstyle="round,pad=0.03", fc="#9DB4D8", ec="none")
    )
    ax.text(xs["input"] + w / 2, 1.1, "image", ha="center", va="center", fontsize=9)

    def arrow(x0: float, y0: float, x1: float, y1: float, color: str, lw: float = 1.2) -> None:
        ax.add_patch(
            FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=9, color=color, lw=lw)
        )

    for y in rows.values():
        arrow(xs["input"] + w, 1.1, xs["C1"], y + h / 2, "#555555")
    for prev, name in zip(layers[1:-1], layers[2:], strict=True):
        for gpu, y in rows.items():
            arrow(xs[prev] + w, y + h / 2, xs[name], y + h / 2, "#555555")
            if name in cross_into:
                other = rows[1 - gpu]
                arrow(xs[prev] + w, y + h / 2, xs[name], other + h / 2, "#B22222", 1.6)
    mid = (xs["C2"] + w + xs["C3"]) / 2
    ax.annotate(
        "halves exchange activations\n(C2 → C3 and into every FC layer)",
        (mid, 1.25),
        xytext=(mid + 0.9, 2.55),
        fontsize=8,
        color="#B22222",
        ha="left",
        arrowprops={"arrowstyle": "-", "color": "#B22222", "lw": 0.8},
    )
    ax.set_xlim(-1.6, xs["FC8"] + 1.2)
    ax.set_ylim(0.0, 2.9)
    ax.axis("off")
    ax.set_title("AlexNet split over two GPUs (Krizhevsky et al., 2012) — drawn, not measured", fontsize=10)
    return ax
