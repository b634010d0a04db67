"""Used by notebook 06a's exercises: a random search (06a.1) and an Optuna objective that reports every
epoch so that ASHA can prune it (06a.2). Both graders run the student's function for real."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..exercises import Wrong, exercise

WIDTHS = (4, 8, 16, 32, 64, 128, 256)
LR_RANGE = (1e-4, 1e-1)


def _peak(config: dict[str, Any]) -> float:
    """An objective where only the learning rate matters, with a narrow peak between grid points."""
    return float(math.exp(-(((math.log10(config["lr"]) + 2.3) / 0.15) ** 2)))


def _grid_best() -> float:
    """Best of a 3 x 3 log grid (cell centres of the three decades x three widths) on :func:`_peak`."""
    return max(_peak({"lr": 10**e, "width": w}) for e in (-3.5, -2.5, -1.5) for w in (8, 32, 128))


@exercise(
    "06a.1",
    "random search",
    hint="draw the exponent uniformly: lr = 10 ** rng.uniform(-4, -1); "
    "call the objective once per trial and keep the best config",
)
def grade_random_search(random_search: Callable[..., Any]) -> str:
    seen: list[tuple[dict[str, Any], float]] = []

    def objective(config: Any) -> float:
        if not isinstance(config, dict) or not {"lr", "width"} <= set(config):
            raise Wrong(f"objective was called with {config!r}; pass a dict with the keys 'lr' and 'width'.")
        score = _peak(config) + 0.001 * math.log2(config["width"])  # wider is a little better
        seen.append((dict(config), score))
        return score

    best = random_search(objective, 600, 0)
    if len(seen) != 600:
        raise Wrong(f"with n_trials=600 the objective was called {len(seen)} times.")
    lrs = np.array([c["lr"] for c, _ in seen], dtype=float)
    if lrs.min() < LR_RANGE[0] or lrs.max() > LR_RANGE[1]:
        raise Wrong(f"learning rates outside [1e-4, 1e-1]: from {lrs.min():.3g} to {lrs.max():.3g}.")
    decades = [float(np.mean((lrs >= 10**e) & (lrs < 10 ** (e + 1)))) for e in (-4, -3, -2)]
    if min(decades) < 0.25:
        shares = ", ".join(f"{s:.0%}" for s in decades)
        raise Wrong(
            f"of 600 learning rates, the decades [1e-4, 1e-3), [1e-3, 1e-2), [1e-2, 1e-1) got "
            f"{shares}; a log-uniform draw puts about a third in each."
        )
    widths = [c["width"] for c, _ in seen]
    if not set(widths) <= set(WIDTHS) or len(set(widths)) < 6:
        raise Wrong(f"widths tried: {sorted(set(widths))}; draw them from {list(WIDTHS)}.")
    top = max(seen, key=lambda item: item[1])[0]
    if not isinstance(best, dict) or best.get("lr") != top["lr"] or best.get("width") != top["width"]:
        raise Wrong(f"you returned {best!r}, but the config with the highest score was {top!r}.")
    again: list[float] = []
    random_search(lambda c: again.append(c["lr"]) or 0.0, 5, 0)
    if again != [c["lr"] for c, _ in seen[:5]]:
        raise Wrong(
            "the same seed gave different learning rates: draw everything from np.random.default_rng(seed)."
        )
    results = []
    for seed in range(1, 41):  # nine trials, as many as a 3 x 3 grid
        chosen = random_search(_peak_only, 9, seed)
        results.append(_peak(chosen))
    grid = _grid_best()
    if np.mean(results) <= grid:
        raise Wrong(
            f"with 9 trials your search found {np.mean(results):.2f} on average (40 seeds), a 3 x 3 "
            f"log grid {grid:.2f}; random search should beat it here."
        )
    return (
        f"600 calls, learning rates log-uniform ({', '.join(f'{s:.0%}' for s in decades)} per decade), "
        f"best config returned; 9 trials beat a 3 x 3 grid on average ({np.mean(results):.2f} vs {grid:.2f})"
    )


def _peak_only(config: dict[str, Any]) -> float:
    return _peak(config)


@exercise(
    "06a.2",
    "an objective ASHA can prune",
    hint="inside the epoch loop: trial.report(accuracy, epoch), "
    "then if trial.should_prune(): raise optuna.TrialPruned()",
)
def grade_pruned_objective(pruned_objective: Callable[..., Any]) -> str:
    import optuna

    from ..tuning import TrialRun

    max_t, n_trials = 4, 10
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            direction="maximize",
            sampler=optuna.samplers.RandomSampler(seed=0),
            pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2),
        )
        study.optimize(lambda t: pruned_objective(t, max_t), n_trials=n_trials, catch=())
    finally:
        optuna.logging.set_verbosity(level)
    trials = study.trials
    space = trials[0].distributions
    if set(space) != {"l1", "l2", "lr", "batch_size"}:
        raise Wrong(f"your trials suggested {sorted(space)}; suggest l1, l2, lr and batch_size.")
    lr = space["lr"]
    if not isinstance(lr, optuna.distributions.FloatDistribution) or not lr.log:
        raise Wrong(f"lr is suggested as {lr!r}: that is not a log-uniform float distribution.")
    if (lr.low, lr.high) != LR_RANGE:
        raise Wrong(f"lr ranges over [{lr.low}, {lr.high}], not [1e-4, 1e-1].")
    for name, choices in (("l1", WIDTHS), ("l2", WIDTHS), ("batch_size", (16, 32, 64))):
        dist = space[name]
        if (
            not isinstance(dist, optuna.distributions.CategoricalDistribution)
            or tuple(dist.choices) != choices
        ):
            raise Wrong(f"{name} is suggested as {dist!r}, not as a choice among {list(choices)}.")
    steps = {t.number: sorted(t.intermediate_values) for t in trials}
    if any(not s for s in steps.values()):
        raise Wrong("some trials reported no intermediate value, so a pruner can never stop them.")
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    for t in trials:
        if steps[t.number] != list(range(1, len(steps[t.number]) + 1)) and steps[t.number] != list(
            range(len(steps[t.number]))
        ):
            raise Wrong(f"trial {t.number} reported at steps {steps[t.number]}; report once per epoch.")
    if not pruned:
        raise Wrong(f"none of {n_trials} trials was pruned: check trial.should_prune() after each report.")
    if any(len(steps[t.number]) != max_t for t in complete):
        raise Wrong(
            f"a completed trial reported {[len(steps[t.number]) for t in complete]} epochs, "
            f"not max_t={max_t}."
        )
    t = complete[0]
    reference = TrialRun({k: t.params[k] for k in ("l1", "l2", "lr", "batch_size")}, seed=t.number)
    expected = [reference.step()["accuracy"] for _ in range(max_t)]
    got = [t.intermediate_values[s] for s in steps[t.number]]
    if not np.allclose(got, expected, atol=1e-6):
        raise Wrong(
            f"trial {t.number} reported {np.round(got, 3).tolist()}, but TrialRun(config, "
            f"seed=trial.number) gives validation accuracies {np.round(expected, 3).tolist()}."
        )
    if t.value is None or abs(t.value - expected[-1]) > 1e-6:
        raise Wrong(f"trial {t.number} returned {t.value}, not its final accuracy {expected[-1]:.4f}.")
    return (
        f"{len(complete)} trials ran {max_t} epochs, {len(pruned)} were pruned by ASHA at "
        f"{sorted({len(steps[t.number]) for t in pruned})} epochs; lr log-uniform; reports match TrialRun"
    )
