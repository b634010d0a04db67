"""Used by notebook 06b (section 4 writes the same loop in cells) and ``benchmarks/tuning.py``: when does
ASHA's early stopping pay?

Two *regimes* (:data:`REGIMES`) and one search loop (:func:`search`): random configurations, trained
one after another, each epoch costing one unit of a fixed budget; with ``early_stopping=True`` Ray's
own :class:`~ray.tune.schedulers.ASHAScheduler` decides after every epoch whether the trial goes on
(it is driven by hand — ``on_trial_add`` / ``on_trial_result`` — so no Ray runtime starts and the
budget is exact). The result of a search is judged **at equal budget**: the best validation accuracy
among trials that trained the full ``max_t`` epochs; a trial cut by the end of the budget or stopped
by ASHA does not count.

* ``"toy"`` — the notes' widths and learning-rate range [1e-4, 1e-1], batch sizes 16-64 (the notes'
  2-16 make epochs slower) and short training (8 epochs):
  most configurations are fine and reach their level within a few epochs, so stopping bad ones
  early saves little;
* ``"favourable"`` — long training (27 epochs, rungs 1, 3, 9, 27) on a task that keeps improving,
  and a wide learning-rate range in which most configurations learn nothing or diverge in the first
  epochs: random search spends whole trainings on them, ASHA one to three epochs.

:func:`asha_gain` summarises a regime: the mean (over seeds) best accuracy of each method and their
*shortfall ratio* — ASHA's mean distance to the best model any run found, divided by random
search's (below 1: ASHA got closer). Ray is imported only by :func:`search`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from .._checks import whole
from ._optional import require
from .task import ToyTask, TrialRun


@dataclasses.dataclass(frozen=True)
class Regime:
    """A search problem: the task, the search space's learning-rate range and batch sizes, ``max_t``
    (epochs of a full training), ASHA's ``reduction_factor`` and the budget in full trainings."""

    task: ToyTask
    lr_range: tuple[float, float]
    batch_sizes: tuple[int, ...]
    max_t: int
    reduction_factor: int
    budget_trainings: int

    @property
    def budget(self) -> int:
        """The budget in epochs: ``budget_trainings * max_t``."""
        return self.budget_trainings * self.max_t


REGIMES: dict[str, Regime] = {
    "toy": Regime(ToyTask(), (1e-4, 1e-1), (16, 32, 64), max_t=8, reduction_factor=2, budget_trainings=6),
    "favourable": Regime(
        ToyTask(n_samples=1024, n_classes=8, noise=1.0, val_fraction=0.5),
        (1e-6, 1e2),
        (128,),
        max_t=27,
        reduction_factor=3,
        budget_trainings=6,
    ),
}


def sample_config(rng: np.random.Generator, regime: Regime) -> dict[str, Any]:
    """One random configuration: widths ``2 ** randint(2, 9)``, a log-uniform learning rate, a batch size."""
    lo, hi = np.log10(regime.lr_range)
    return {
        "l1": int(2 ** rng.integers(2, 9)),
        "l2": int(2 ** rng.integers(2, 9)),
        "lr": float(10 ** rng.uniform(lo, hi)),
        "batch_size": int(rng.choice(regime.batch_sizes)),
    }


@dataclasses.dataclass
class SearchResult:
    """What one search found: ``curve[i]`` is the best accuracy among finished trials after ``i + 1``
    epochs of the budget (NaN before the first finished trial); ``tried`` configurations."""

    curve: list[float]
    tried: int

    @property
    def best(self) -> float:
        """Best accuracy of a trial that trained ``max_t`` epochs within the budget (NaN if none)."""
        return self.curve[-1] if self.curve else float("nan")


def search(regime: Regime, seed: int, early_stopping: bool) -> SearchResult:
    """Random search under ``regime.budget`` epochs; with ``early_stopping``, Ray's ASHA stops trials.

    ASHA compares validation accuracy (``metric="accuracy", mode="max"``) at its rungs
    ``1, rf, rf**2, …`` up to ``max_t``. The same seed draws the same configurations with and without
    early stopping, so the two searches differ only in what ASHA stopped.
    """
    if not isinstance(regime, Regime):
        raise TypeError(f"regime must be a Regime such as REGIMES['toy'], not {type(regime).__name__}")
    seed = whole("seed", seed, 0, "0")
    if not isinstance(early_stopping, bool):
        raise TypeError(f"early_stopping must be True or False, not {early_stopping!r}")
    asha = None
    if early_stopping:
        schedulers = require("ray.tune.schedulers", "search")
        asha = schedulers.ASHAScheduler(
            metric="accuracy", mode="max", max_t=regime.max_t, grace_period=1,
            reduction_factor=regime.reduction_factor,
        )
    rng = np.random.default_rng(seed)
    spent, tried, best, curve = 0, 0, float("nan"), []
    while spent < regime.budget:
        config = sample_config(rng, regime)
        trial = SimpleNamespace(trial_id=f"trial_{tried}")
        tried += 1
        if asha is not None:
            asha.on_trial_add(None, trial)
        run = TrialRun(config, regime.task, seed=seed * 1000 + tried)
        for epoch in range(1, regime.max_t + 1):
            accuracy = run.step()["accuracy"]
            spent += 1
            if epoch == regime.max_t:  # finished: a model trained with the full budget of a trial
                best = accuracy if math.isnan(best) else max(best, accuracy)
            curve.append(best)
            if spent == regime.budget:
                break
            result = {"training_iteration": epoch, "accuracy": accuracy}
            if asha is not None and asha.on_trial_result(None, trial, result) == "STOP":
                break
    return SearchResult(curve, tried)


def asha_gain(random: Sequence[SearchResult], asha: Sequence[SearchResult]) -> dict[str, float]:
    """Mean best accuracy of each method over seeds, ASHA's gain, and the shortfall ratio.

    The shortfall of a search is how far its best model stays below the best model any search of
    the comparison found; the ratio is ASHA's mean shortfall over random search's (< 1: ASHA got
    closer; 1: no gain).
    """
    if not random or not asha or len(random) != len(asha):
        raise ValueError("pass one SearchResult per seed for each method (the same seeds, at least one)")
    best_r = np.nan_to_num([r.best for r in random])
    best_a = np.nan_to_num([r.best for r in asha])
    reference = max(best_r.max(), best_a.max())
    short_r, short_a = float(np.mean(reference - best_r)), float(np.mean(reference - best_a))
    return {
        "random": float(best_r.mean()),
        "asha": float(best_a.mean()),
        "gain": float(best_a.mean() - best_r.mean()),
        "ratio": short_a / short_r if short_r > 0 else 1.0,
        "tried_random": float(np.mean([r.tried for r in random])),
        "tried_asha": float(np.mean([r.tried for r in asha])),
    }
