"""Used by ``benchmarks/tuning.py`` (notebook 06a writes its own, smaller study loop in cells): equal budgets.

:func:`run_study` / :func:`compare_methods`: grid, random, ASHA, TPE (Bayesian) and TPE+ASHA
(BOHB-style), each given the same total number of training epochs, run in this process with
Optuna's samplers and its ASHA pruner so that budgets are exact; :class:`Comparison` and
:func:`method_summary` turn the traces into the notebook's table. Optuna is imported by
:func:`run_study` when it runs, never when this module is imported.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import real, sizes, whole
from ._optional import require
from .task import DEFAULT_TASK, LR_RANGE, WIDTHS, ToyTask, TrialRun, _task

#: Search methods that :func:`run_study` knows, in the order plots and tables use.
METHODS: tuple[str, ...] = ("grid", "random", "asha", "tpe", "tpe+asha")
#: Batch sizes of the equal-budget study: larger than the notes', so that hundreds of epochs fit in seconds.
COMPARISON_BATCH_SIZES: tuple[int, ...] = (16, 32, 64)


def _method(method: Any) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    return str(method)


@dataclasses.dataclass
class TrialRecord:
    """One trial of a study: its config and the validation accuracy after each epoch it trained."""

    number: int
    config: dict[str, Any]
    accuracies: list[float]
    pruned: bool = False
    truncated: bool = False  # stopped because the study's budget ran out

    @property
    def epochs(self) -> int:
        """Epochs this trial trained."""
        return len(self.accuracies)


@dataclasses.dataclass
class StudyTrace:
    """What one search method found, epoch by epoch, under a budget of ``budget`` training epochs."""

    method: str
    seed: int
    budget: int
    max_t: int
    trials: list[TrialRecord]
    best_curve: list[float]  # best validation accuracy seen after 1, 2, … epochs spent
    wall_s: float

    def __post_init__(self) -> None:
        _method(self.method)
        whole("budget", self.budget, 1, "48")
        whole("max_t", self.max_t, 1, "8")

    @property
    def spent(self) -> int:
        """Epochs actually trained (the budget, or less if a grid ran out of points)."""
        return len(self.best_curve)

    @property
    def best(self) -> float:
        """Best validation accuracy found with the whole budget (NaN if nothing was trained)."""
        return self.best_curve[-1] if self.best_curve else float("nan")

    def best_after(self, epochs: int) -> float:
        """Best accuracy found within the first ``epochs`` (>= 1) epochs of the budget."""
        epochs = whole("epochs", epochs, 1, "8")
        if not self.best_curve:
            return float("nan")
        return self.best_curve[min(epochs, len(self.best_curve)) - 1]

    def epochs_to(self, target: float) -> int | None:
        """Epochs spent until the best accuracy first reached ``target``; ``None`` if it never did."""
        target = real("target (an accuracy)", target, example="0.85")
        for i, value in enumerate(self.best_curve, start=1):
            if value >= target:
                return i
        return None


def grid_design(n_points: int, batch_size: int = 32) -> list[dict[str, Any]]:
    """A log-scale grid of at most ``n_points`` configs over learning rate × width.

    ``n_w = floor(sqrt(n))`` widths and ``n // n_w`` learning rates (the learning rate gets the extra
    points: it matters most), each at the centres of equal cells of the log-scaled range, so the
    grid covers the box evenly; ``l1 = l2`` = width and the batch size is fixed.
    """
    n_points = whole("n_points (grid points)", n_points, 1, "6")
    batch_size = whole("batch_size", batch_size, 1, "32")
    n_w = max(1, int(math.isqrt(n_points)))
    n_lr = max(1, n_points // n_w)
    lo, hi = math.log10(LR_RANGE[0]), math.log10(LR_RANGE[1])
    lrs = [10 ** (lo + (hi - lo) * (i + 0.5) / n_lr) for i in range(n_lr)]
    e_lo, e_hi = 2, 8  # widths 2**2 .. 2**8
    widths = sorted({2 ** round(e_lo + (e_hi - e_lo) * (i + 0.5) / n_w) for i in range(n_w)})
    return [{"l1": w, "l2": w, "lr": lr, "batch_size": batch_size} for lr in lrs for w in widths]


def _suggest(trial: Any, batch_sizes: Sequence[int]) -> dict[str, Any]:
    return {
        "l1": trial.suggest_categorical("l1", list(WIDTHS)),
        "l2": trial.suggest_categorical("l2", list(WIDTHS)),
        "lr": trial.suggest_float("lr", *LR_RANGE, log=True),
        "batch_size": trial.suggest_categorical("batch_size", list(batch_sizes)),
    }


def run_study(
    method: str,
    *,
    budget: int,
    seed: int = 0,
    max_t: int = 8,
    reduction_factor: int = 2,
    task: ToyTask = DEFAULT_TASK,
    batch_sizes: Sequence[int] = COMPARISON_BATCH_SIZES,
) -> StudyTrace:
    """Run one search ``method`` until ``budget`` training epochs are spent; return its trace.

    Methods (all through Optuna, in this process, one trial at a time):

    * ``"grid"`` — :func:`grid_design` with ``budget // max_t`` points, visited in random order
      (``GridSampler``), each trained ``max_t`` epochs;
    * ``"random"`` — ``RandomSampler``, each trial ``max_t`` epochs;
    * ``"asha"`` — random configs, stopped early by ``SuccessiveHalvingPruner`` (asynchronous
      successive halving, the algorithm of Ray's ``ASHAScheduler``) at rungs 1, rf, rf², … epochs;
    * ``"tpe"`` — ``TPESampler`` (Bayesian: a density model of good vs bad configs), full trials;
      its first ``max(2, n // 3)`` trials are random, ``n = budget // max_t``;
    * ``"tpe+asha"`` — TPE proposals with ASHA stopping: the idea of BOHB.

    Every epoch of every trial costs one unit; when the budget is used up the running trial stops
    (it is ``truncated``) and so does the study. ``seed`` drives the sampler and each trial's
    initial weights and data order.
    """
    method = _method(method)
    budget = whole("budget (training epochs)", budget, 1, "48")
    seed = whole("seed", seed, 0, "0")
    max_t = whole("max_t (epochs of a full trial)", max_t, 1, "8")
    reduction_factor = whole("reduction_factor", reduction_factor, 2, "2")
    task = _task(task)
    batch_sizes = sizes("batch_sizes", batch_sizes, "(16, 32, 64)")
    optuna = require("optuna", "run_study")
    n_full = max(1, budget // max_t)
    pruner: Any = optuna.pruners.NopPruner()
    if method.endswith("asha"):
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=1, reduction_factor=reduction_factor, min_early_stopping_rate=0
        )
    grid = grid_design(n_full, batch_size=sorted(batch_sizes)[len(batch_sizes) // 2])
    if method == "grid":
        sampler: Any = optuna.samplers.GridSampler({"point": list(range(len(grid)))}, seed=seed)
    elif method.startswith("tpe"):
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, n_full // 3))
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)

    trials: list[TrialRecord] = []
    best_curve: list[float] = []

    def objective(trial: Any) -> float:
        if method == "grid":
            config = dict(grid[trial.suggest_categorical("point", list(range(len(grid))))])
        else:
            config = _suggest(trial, batch_sizes)
        record = TrialRecord(trial.number, config, [])
        trials.append(record)
        run = TrialRun(config, task, seed=seed * 10_000 + trial.number)
        for epoch in range(1, max_t + 1):
            if len(best_curve) >= budget:
                record.truncated = True
                trial.study.stop()
                break
            acc = run.step()["accuracy"]
            record.accuracies.append(acc)
            best_curve.append(max(acc, best_curve[-1]) if best_curve else acc)
            trial.report(acc, epoch)
            if epoch < max_t and trial.should_prune():
                record.pruned = True
                raise optuna.TrialPruned()
        if len(best_curve) >= budget:
            trial.study.stop()
        return record.accuracies[-1] if record.accuracies else 0.0

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    try:
        study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
        study.optimize(objective, n_trials=None if method != "grid" else len(grid), gc_after_trial=False)
    finally:
        optuna.logging.set_verbosity(level)
    trials = [t for t in trials if t.accuracies]
    return StudyTrace(method, seed, budget, max_t, trials, best_curve, time.perf_counter() - start)


@dataclasses.dataclass
class Comparison:
    """Several methods × seeds under one budget; the numbers behind the equal-budget plot and table."""

    traces: list[StudyTrace]

    def __post_init__(self) -> None:
        if isinstance(self.traces, str | bytes) or not isinstance(self.traces, Sequence) or not self.traces:
            raise ValueError("Comparison needs a non-empty list of StudyTrace (from run_study)")
        bad = [t for t in self.traces if not isinstance(t, StudyTrace)]
        if bad:
            kind = type(bad[0]).__name__
            raise TypeError(f"Comparison takes StudyTrace objects (from run_study), not {kind}")
        self.traces = list(self.traces)

    @property
    def methods(self) -> list[str]:
        """The methods compared, in the order of :data:`METHODS`."""
        return [m for m in METHODS if any(t.method == m for t in self.traces)]

    @property
    def reference(self) -> float:
        """The best validation accuracy any method found with any seed: the yardstick."""
        return max(t.best for t in self.traces)

    def traces_of(self, method: str) -> list[StudyTrace]:
        """The traces of ``method`` (one per seed)."""
        if method not in self.methods:
            raise ValueError(f"method {method!r} is not in this comparison; choose one of {self.methods}")
        return [t for t in self.traces if t.method == method]

    def epochs_to_target(self, method: str, tolerance: float = 0.01) -> list[int | None]:
        """Per seed: epochs until ``method`` came within ``tolerance`` (absolute) of :attr:`reference`."""
        tolerance = real("tolerance", tolerance, 0.0, 1.0, example="0.01")
        target = self.reference - tolerance
        return [t.epochs_to(target) for t in self.traces_of(method)]

    def mean_epochs_to_target(self, method: str, tolerance: float = 0.01) -> tuple[float, int]:
        """``(mean epochs, seeds that reached it)``; a seed that never got there counts as the budget
        (so the mean is a lower bound whenever fewer than all seeds reached the target)."""
        values = self.epochs_to_target(method, tolerance)
        censored = [
            v if v is not None else t.budget for v, t in zip(values, self.traces_of(method), strict=True)
        ]
        return float(np.mean(censored)), sum(v is not None for v in values)

    def table(self, tolerance: float = 0.01) -> list[dict[str, Any]]:
        """One row per method: trials tried, best accuracy, epochs to within ``tolerance`` of the best."""
        rows = []
        for m in self.methods:
            traces = self.traces_of(m)
            mean, reached = self.mean_epochs_to_target(m, tolerance)
            rows.append(
                {
                    "method": m,
                    "seeds": len(traces),
                    "epochs spent": int(np.mean([t.spent for t in traces])),
                    "trials tried": float(np.mean([len(t.trials) for t in traces])),
                    "best acc (mean)": float(np.mean([t.best for t in traces])),
                    "best acc (worst seed)": float(min(t.best for t in traces)),
                    f"epochs to best-{tolerance:.0%}": mean,
                    "seeds reaching it": f"{reached}/{len(traces)}",
                }
            )
        return rows


def compare_methods(
    methods: Sequence[str] = METHODS,
    *,
    budget: int,
    seeds: Sequence[int] = (0, 1, 2),
    max_t: int = 8,
    reduction_factor: int = 2,
    task: ToyTask = DEFAULT_TASK,
    batch_sizes: Sequence[int] = COMPARISON_BATCH_SIZES,
    progress: bool = True,
) -> Comparison:
    """:func:`run_study` for every method and seed (same budget for all); a tqdm bar over the runs."""
    if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
        raise ValueError(f"methods must be a non-empty list of method names from {METHODS}, not {methods!r}")
    methods = [_method(m) for m in methods]
    seeds = sizes("seeds", seeds, "(0, 1, 2)", minimum=0)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, not {progress!r}")
    tqdm = require("tqdm.auto", "compare_methods").tqdm
    jobs = [(m, s) for s in seeds for m in methods]
    traces = []
    for m, s in tqdm(jobs, desc="studies", disable=not progress):
        traces.append(
            run_study(
                m,
                budget=budget,
                seed=s,
                max_t=max_t,
                reduction_factor=reduction_factor,
                task=task,
                batch_sizes=batch_sizes,
            )
        )
    return Comparison(traces)


def method_summary(comparison: Comparison, tolerance: float = 0.01) -> str:
    """The :meth:`Comparison.table` as aligned text."""
    if not isinstance(comparison, Comparison):
        kind = type(comparison).__name__
        raise TypeError(f"comparison must be a Comparison (from compare_methods), not {kind}")
    rows = comparison.table(tolerance)
    keys = list(rows[0])
    cells = [[_fmt(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1.5 else f"{value:.1f}"
    return str(value)
