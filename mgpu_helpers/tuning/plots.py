"""Used by notebooks 06a (section 2: the grid-vs-random picture) and 06b (learning curves), and by tests:
progress, tables and plots.

:func:`epoch_progress` (a tqdm bar as a Ray Tune callback), :func:`results_table` (a ``ResultGrid``
as a DataFrame), :func:`plot_learning_curves` (coloured by the ASHA rung where a trial stopped),
:func:`plot_search_layouts` (Bergstra & Bengio's grid-vs-random picture) and
:func:`plot_best_vs_epochs` (the equal-budget comparison). Matplotlib, pandas, tqdm and Ray are
imported inside the functions.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._checks import real, sizes, text, whole
from ._optional import require
from .studies import Comparison

#: One colour per method, the same in every plot.
_METHOD_COLORS: dict[str, str] = {
    "grid": "#8C8C8C",
    "random": "#4C72B0",
    "asha": "#DD8452",
    "tpe": "#55A868",
    "tpe+asha": "#C44E52",
}


def epoch_progress(total: int | None = None, desc: str = "epochs reported") -> Any:
    """A ``ray.tune.Callback`` that shows a tqdm bar counting reported epochs (``RunConfig(callbacks=…)``).

    Tune's own tables are off in the notebook (``verbose=0``); this bar shows progress instead.
    ``total`` is an upper bound (with ASHA most trials stop early, so the bar ends short of it).
    """
    if total is not None:
        total = whole("total (epochs, or None)", total, 1, "64")
    desc = text("desc", desc, "epochs (ASHA)")
    return _epoch_progress_class()(total, desc)


@functools.lru_cache(maxsize=1)
def _epoch_progress_class() -> type:
    tune = require("ray.tune", "epoch_progress")

    class EpochProgress(tune.Callback):
        """Counts ``on_trial_result`` calls (one per reported epoch) on a tqdm bar."""

        def __init__(self, total: int | None, desc: str) -> None:
            self.total, self.desc, self.bar, self.epochs = total, desc, None, 0

        def __getstate__(self) -> dict[str, Any]:  # Tune saves callbacks with the run; a bar can't be
            return {**self.__dict__, "bar": None}

        def setup(self, **info: Any) -> None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.desc)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **kw: Any) -> None:
            self.epochs += 1
            if self.bar is not None:
                self.bar.update(1)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self.bar is not None:
                self.bar.close()

    return EpochProgress


def _results(results: Any) -> list[Any]:
    """The ``Result`` objects of a ``ResultGrid`` (or of any iterable of results), checked."""
    kind = type(results).__name__
    if isinstance(results, str | bytes | Mapping):
        raise TypeError(f"results must be a ResultGrid (what Tuner(...).fit() returns), not {kind}")
    try:
        items = list(results)
    except TypeError:
        raise TypeError(f"results must be a ResultGrid (what Tuner(...).fit() returns), not {kind}") from None
    bad = [r for r in items if not (hasattr(r, "config") and hasattr(r, "metrics"))]
    if bad:
        raise TypeError(f"results must hold Ray Tune Results (with .config and .metrics), not {bad[0]!r}")
    return items


def results_table(results: Any, columns: Sequence[str] = ("loss", "accuracy")) -> Any:
    """A ``ResultGrid`` as a pandas DataFrame: one row per trial, its config and last metrics.

    Columns: the hyperparameters ``l1, l2, lr, batch_size`` (those the configs have), the given
    metric columns, ``epochs`` (``training_iteration``: how long the trial ran) and ``status``. The
    lecture notes' ``CLIReporter(metric_columns=…)`` printed the same table while the run went on.
    """
    items = _results(results)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f'columns must be metric names such as ["loss", "accuracy"], not {columns!r}')
    pd = require("pandas", "results_table")
    rows = []
    for r in items:
        metrics = r.metrics or {}
        row = {k: r.config[k] for k in ("l1", "l2", "lr", "batch_size") if k in r.config}
        row.update({c: metrics.get(c, float("nan")) for c in columns})
        row["epochs"] = int(metrics.get("training_iteration", 0))
        row["status"] = "ERROR" if r.error else "OK"
        rows.append(row)
    ids = [(r.metrics or {}).get("trial_id", str(i)) for i, r in enumerate(items)]
    return pd.DataFrame(rows, index=pd.Index(ids, name="trial"))


def _learning_curves(items: list[Any], metric: str) -> list[tuple[dict[str, Any], list[float]]]:
    """``(config, [metric after epoch 1, 2, …])`` for every trial."""
    curves = []
    for r in items:
        df = r.metrics_dataframe
        values = [] if df is None or metric not in df else [float(v) for v in df[metric]]
        curves.append((dict(r.config), values))
    return curves


def plot_learning_curves(
    results: Any,
    metric: str = "accuracy",
    milestones: Sequence[int] | None = None,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """Learning curves of all trials of a ``ResultGrid``, coloured by the epoch at which each stopped.

    With ASHA the stopping epochs are its rungs (``milestones``, drawn as dotted lines): the plot
    shows which trials were cut at the first rung, which at the second, and which ran to the end.
    Returns the axes.
    """
    items = _results(results)
    metric = text("metric", metric, "accuracy")
    rungs = () if milestones is None else sizes("milestones", milestones, "[1, 2, 4, 8]")
    if title is not None:
        title = text("title", title, "ASHA")
    plt = require("matplotlib.pyplot", "plot_learning_curves")
    curves = _learning_curves(items, metric)
    stops = sorted({len(v) for _, v in curves if v})
    scale = sorted(set(rungs) | set(stops))  # same colour for the same rung in every plot
    cmap = plt.get_cmap("viridis", max(len(scale), 2))
    colour = {s: cmap(scale.index(s)) for s in stops}
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6))
    for _, values in curves:
        if values:
            epochs = range(1, len(values) + 1)
            ax.plot(epochs, values, "-o", ms=3, lw=1.2, color=colour[len(values)], alpha=0.85)
    for m in rungs:
        ax.axvline(m, color="grey", ls=":", lw=0.8)
    handles = [
        plt.Line2D([], [], color=colour[s], marker="o", ms=3, label=f"stopped after {s}") for s in stops
    ]
    ax.legend(handles=handles, fontsize=8, title="epochs trained", title_fontsize=8, loc="lower right")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation {metric}")
    ax.set_title(title or f"{len(curves)} trials")
    return ax


def _layouts(layouts: Any) -> dict[str, np.ndarray]:
    if not isinstance(layouts, Mapping) or not layouts:
        raise TypeError('layouts must be a non-empty dict of title -> (n, 2) points, e.g. {"grid": points}')
    out = {}
    for title, pts in layouts.items():
        arr = np.asarray(pts, dtype=float)
        if arr.ndim != 2 or arr.shape[1] != 2 or len(arr) == 0:
            raise ValueError(f"layouts[{title!r}] must be an array of shape (n, 2), n >= 1, not {arr.shape}")
        out[str(title)] = arr
    return out


def plot_search_layouts(
    f: Any,
    layouts: Mapping[str, np.ndarray],
    *,
    important: Any | None = None,
    extent: tuple[float, float, float, float] = (0.0, 1.0, 0.0, 1.0),
    labels: tuple[str, str] = ("important parameter", "unimportant parameter"),
    axes: Sequence[Any] | None = None,
) -> list[Any]:
    """Draw point sets over a 2-D objective ``f(x, y)``, one panel each (Bergstra & Bengio's picture).

    Each panel shows ``f`` as a heat map, the points tried, and along the top the 1-D curve of the
    important parameter (``important(x)``, if given) with a tick wherever a point projects onto it:
    a 3 × 3 grid puts only three distinct values there, nine random points put nine.

    Args:
        f: vectorised objective of two arrays.
        layouts: panel title -> points, an array of shape (n, 2).
        important: the 1-D effect of the first parameter, drawn along the top of every panel.
        extent: ``(x_min, x_max, y_min, y_max)`` of the heat map.
        labels: axis labels.
        axes: existing axes, one per layout.
    """
    if not callable(f) or (important is not None and not callable(important)):
        raise TypeError("f (and important, if given) must be functions of arrays, e.g. lambda x, y: x + y")
    points = _layouts(layouts)
    if len(extent) != 4 or not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in extent):
        raise ValueError(f"extent must be 4 finite numbers (x_min, x_max, y_min, y_max), not {extent!r}")
    x0, x1, y0, y1 = (float(v) for v in extent)
    if not (x0 < x1 and y0 < y1):
        raise ValueError(f"extent must have x_min < x_max and y_min < y_max, not {extent!r}")
    if len(labels) != 2 or not all(isinstance(s, str) for s in labels):
        raise TypeError(f"labels must be two strings (x label, y label), not {labels!r}")
    if axes is not None and len(axes) != len(points):
        raise ValueError(f"axes must hold one axis per layout ({len(points)}), not {len(axes)}")
    plt = require("matplotlib.pyplot", "plot_search_layouts")
    if axes is None:
        _, grid = plt.subplots(1, len(points), figsize=(4.2 * len(points), 3.9), squeeze=False)
        axes = list(grid[0])
    xs, ys = np.meshgrid(np.linspace(x0, x1, 200), np.linspace(y0, y1, 200))
    values = f(xs, ys)
    for ax, (title, pts) in zip(axes, points.items(), strict=True):
        ax.imshow(values, extent=(x0, x1, y0, y1), origin="lower", aspect="auto", cmap="Greens", alpha=0.8)
        ax.scatter(pts[:, 0], pts[:, 1], color="#C44E52", edgecolor="black", zorder=3, s=36)
        if important is not None:
            top = ax.inset_axes((0.0, 1.02, 1.0, 0.22), sharex=ax)
            line = np.linspace(x0, x1, 200)
            top.plot(line, important(line), color="#4C72B0")
            top.vlines(pts[:, 0], *top.get_ylim(), color="#C44E52", lw=1)
            top.axis("off")
        distinct = len(np.unique(np.round(pts[:, 0], 9)))
        ax.set_title(f"{title}: {distinct} distinct values of x", y=1.26, fontsize=10)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
    return list(axes)


def plot_best_vs_epochs(comparison: Comparison, tolerance: float = 0.01, axes: Any = None) -> Any:
    """Best validation accuracy found vs epochs spent: mean over seeds (line) and min–max (band).

    Two panels: the whole budget, and a zoom on the top (where "within ``tolerance`` of the best",
    the dashed line, is decided). Returns the two axes.
    """
    if not isinstance(comparison, Comparison):
        kind = type(comparison).__name__
        raise TypeError(f"comparison must be a Comparison (from compare_methods), not {kind}")
    tolerance = real("tolerance", tolerance, 0.0, 1.0, example="0.01")
    if axes is not None and len(axes) != 2:
        raise ValueError(f"axes must be two axes (whole budget, zoom), not {len(axes)}")
    plt = require("matplotlib.pyplot", "plot_best_vs_epochs")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    target = comparison.reference - tolerance
    for ax in axes:
        for m in comparison.methods:
            traces = comparison.traces_of(m)
            xs = np.arange(1, max(t.budget for t in traces) + 1)
            ys = np.array([[t.best_after(int(x)) for x in xs] for t in traces])
            ax.plot(xs, ys.mean(axis=0), color=_METHOD_COLORS[m], label=m, lw=1.8)
            ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=_METHOD_COLORS[m], alpha=0.12)
        ax.axhline(target, color="black", ls="--", lw=0.8, label=f"best − {tolerance:.0%}")
        ax.set_xlabel("training epochs spent (the budget)")
    seeds = len({t.seed for t in comparison.traces})
    axes[0].set_ylabel("best validation accuracy so far")
    axes[0].set_title(f"Equal budgets: mean of {seeds} seeds (line), min–max (band)")
    axes[1].set_ylim(target - 0.06, comparison.reference + 0.005)
    axes[1].set_title("zoom on the top")
    axes[1].legend(fontsize=8, loc="lower right")
    return axes
