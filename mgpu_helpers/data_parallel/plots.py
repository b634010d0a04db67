"""Used by notebooks 03a (the DataParallel flow) and 03b (phase timelines, peak-memory comparisons).

:class:`PhaseTimer` records named phases of one step (and :func:`~.comm.parallel_apply`'s per-thread
timings) as ``(label, lane, start, end)`` rows; :func:`plot_phases` draws them as a Gantt chart.
:func:`plot_peak_comparison` compares per-device peaks of several setups; :func:`draw_data_parallel_flow`
draws the ten steps of one ``nn.DataParallel`` iteration. matplotlib is imported only when drawing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

from .._checks import whole

__all__ = ["PhaseTimer", "draw_data_parallel_flow", "plot_peak_comparison", "plot_phases"]

_TIMING_KEYS = ("replica", "device", "thread", "start", "end")


class PhaseTimer:
    """Record named phases (``with timer("scatter"):``) as ``(label, lane, start, end)`` rows.

    Times are ``time.perf_counter()`` seconds; ``lane`` names the row of the chart (a thread).
    """

    rows: list[tuple[str, str, float, float]]

    def __init__(self) -> None:
        self.rows = []

    def __call__(self, label: str, lane: str = "main thread") -> Any:
        """A context manager that adds one row for the time spent inside it."""
        for name, value in (("label", label), ("lane", lane)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string such as 'scatter', not {value!r}")
            if not value:
                raise ValueError(f"{name} must be a non-empty string such as 'scatter'")
        timer = self

        class _Phase:
            def __enter__(self) -> None:
                self.start = time.perf_counter()

            def __exit__(self, *exc: Any) -> None:
                timer.rows.append((label, lane, self.start, time.perf_counter()))

        return _Phase()

    def add_threads(self, timings: Sequence[Mapping[str, Any]], label: str = "forward") -> None:
        """Add :func:`parallel_apply`'s per-replica ``timings`` as rows, one lane per thread."""
        if not isinstance(timings, Sequence) or isinstance(timings, str):
            raise TypeError("timings must be the list filled by parallel_apply(..., timings=timings)")
        for t in timings:
            if not isinstance(t, Mapping) or not all(k in t for k in _TIMING_KEYS):
                raise ValueError(
                    f"each timing must be a dict with keys {_TIMING_KEYS}, as parallel_apply writes"
                )
        if not isinstance(label, str) or not label:
            raise TypeError(f"label must be a non-empty string, not {label!r}")
        for t in sorted(timings, key=lambda t: t["replica"]):
            self.rows.append((label, f"{t['thread']} ({t['device']})", t["start"], t["end"]))


def _check_rows(rows: Any) -> list[tuple[str, str, float, float]]:
    if not isinstance(rows, Sequence) or isinstance(rows, str):
        raise TypeError(
            f"rows must be a list of (label, lane, start, end), e.g. PhaseTimer().rows; not {rows!r:.60}"
        )
    if not rows:
        raise ValueError("rows is empty: time at least one phase (with timer('scatter'): ...)")
    for row in rows:
        ok = isinstance(row, Sequence) and len(row) == 4
        if (
            not ok
            or not all(isinstance(v, str) for v in row[:2])
            or not all(isinstance(v, Real) for v in row[2:])
        ):
            raise TypeError(
                f"every row must be (label: str, lane: str, start: float, end: float), not {row!r}"
            )
        if row[3] < row[2]:
            raise ValueError(f"a phase ends before it starts: {row!r}")
    return list(rows)


def _check_ax(ax: Any) -> None:
    if ax is not None and not hasattr(ax, "add_patch"):
        raise TypeError(f"ax must be a matplotlib Axes or None, not {type(ax).__name__}")


def plot_phases(
    rows: Sequence[tuple[str, str, float, float]], *, ax: Any = None, title: str | None = None
) -> Any:
    """A Gantt chart of ``(label, lane, start, end)`` rows (from :class:`PhaseTimer`), in milliseconds."""
    rows = _check_rows(rows)
    _check_ax(ax)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len({r[1] for r in rows})))
    t0 = min(r[2] for r in rows)
    lanes = list(dict.fromkeys(r[1] for r in rows))
    labels = list(dict.fromkeys(r[0] for r in rows))
    colors = plt.get_cmap("tab10")
    for label, lane, start, end in rows:
        y = lanes.index(lane)
        c = colors(labels.index(label) % 10)
        ax.barh(y, (end - start) * 1e3, left=(start - t0) * 1e3, color=c, edgecolor="black", lw=0.4)
    handles = [Patch(color=colors(k % 10), label=label) for k, label in enumerate(labels)]
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "Where the time goes")
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_peak_comparison(
    peaks: Mapping[str, Mapping[str, int]],
    *,
    ax: Any = None,
    title: str | None = None,
    note: str | None = None,
) -> Any:
    """Grouped bars: for each setup (outer key), the peak bytes of every device (inner key), in MiB.

    ``peaks`` is e.g. ``{"DataParallel": {"vcuda:0": 2_000_000, "vcuda:1": 500_000}, ...}``, such as
    :meth:`Backend.step_peaks` returns per setup. Returns the axes.
    """
    if not isinstance(peaks, Mapping) or not peaks:
        raise TypeError(f"peaks must be a non-empty dict {{setup: {{device: bytes}}}}, not {peaks!r:.60}")
    for setup, per_device in peaks.items():
        if not isinstance(per_device, Mapping) or not all(
            isinstance(v, Real) and v >= 0 for v in per_device.values()
        ):
            raise TypeError(f"peaks[{setup!r}] must be a dict {{device: bytes >= 0}}, not {per_device!r:.60}")
    _check_ax(ax)
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    setups = list(peaks)
    devices = list(dict.fromkeys(d for p in peaks.values() for d in p))
    width = 0.8 / max(1, len(devices))
    for k, dev in enumerate(devices):
        xs = [i + (k - (len(devices) - 1) / 2) * width for i in range(len(setups))]
        ax.bar(xs, [peaks[s].get(dev, 0) / 2**20 for s in setups], width, label=dev)
    ax.set_xticks(range(len(setups)), setups, fontsize=8)
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(title or "Peak memory per device", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


_FLOW = [
    ("1 copy model", "bcast"),
    ("2 split batch", "scatter"),
    ("3 forward", "all"),
    ("4 gather outputs", "gather"),
    ("5 loss", "main"),
    ("6 send loss grads", "scatter"),
    ("7 backward", "all"),
    ("8 gather grads", "gather"),
    ("9 sum/average\n+ update", "main"),
    ("10 repeat", "loop"),
]


def draw_data_parallel_flow(n_devices: int = 3) -> Any:
    """The ten steps of one ``nn.DataParallel`` training iteration, one column per step.

    Rows are devices (device 0, the *main* device, on top); ``n_devices`` is 2 to 16. Green boxes:
    every device works, in its own thread. Orange boxes: only the main device works. Arrows: data
    crossing between devices (the model and the batch going out, outputs and gradients coming back).
    Returns the figure.
    """
    whole("n_devices", n_devices, 2, hint=": the flow shows copies between at least two devices")
    if n_devices > 16:
        raise ValueError(f"n_devices must be at most 16 (one row per device), not {n_devices}")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from ..figures import GPU_COLOR

    fig, ax = plt.subplots(figsize=(13, 1.2 + 0.75 * n_devices))
    ax.set_xlim(-1.6, len(_FLOW) - 0.4)
    ax.set_ylim(-0.8, n_devices + 0.2)
    ax.axis("off")
    ys = [n_devices - 1 - d for d in range(n_devices)]  # device 0 on top
    for d, y in enumerate(ys):
        ax.text(-0.5, y, f"device {d}" + (" (main)" if d == 0 else ""), ha="right", va="center", fontsize=8)
        ax.axhline(y, color="#DDDDDD", lw=0.6, zorder=0)
    for x, (label, kind) in enumerate(_FLOW):
        ax.text(x, n_devices - 0.35, label, ha="center", va="bottom", fontsize=8, weight="bold")
        if kind in ("all", "main"):
            rows = ys if kind == "all" else ys[:1]
            color = GPU_COLOR if kind == "all" else "#DD8452"
            for y in rows:
                ax.add_patch(
                    FancyBboxPatch(
                        (x - 0.32, y - 0.22), 0.64, 0.44, boxstyle="round,pad=0.02", fc=color, ec="none"
                    )
                )
            if kind == "all":
                note = "a thread per device" if x == 2 else "autograd, per device"
                ax.text(x, -0.65, note, ha="center", fontsize=7, style="italic")
        elif kind in ("bcast", "scatter", "gather"):
            for y in ys[1:]:
                start, end = (ys[0], y) if kind != "gather" else (y, ys[0])
                arrow = FancyArrowPatch(
                    (x - 0.15, start), (x + 0.15, end), arrowstyle="-|>", mutation_scale=10, color="#333333"
                )
                ax.add_patch(arrow)
            ax.plot([x], [ys[0]], "o", color="#333333", ms=4)
        elif kind == "loop":
            ax.annotate(
                "", xy=(0, -0.45), xytext=(x, -0.45),
                arrowprops={"arrowstyle": "-|>", "color": "#888888", "connectionstyle": "arc3,rad=0.0"},
            )  # fmt: skip
            ax.text(x, ys[0], "next\nbatch", ha="center", va="center", fontsize=8)
    ax.set_title("nn.DataParallel: one training iteration (one process; arrows = copies between devices)")
    fig.tight_layout()
    return fig
