"""Used by notebook 06a's exercises: a random search over a described search space (06a.1) and an
Optuna objective that reports every epoch so that ASHA can prune it (06a.2). Both graders run the
student's function for real; 06a.1 refuses ready-made samplers (an Optuna study, Ray Tune's)."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..exercises import Wrong, calls_during, exercise

WIDTHS = (4, 8, 16, 32, 64, 128, 256)
LR_RANGE = (1e-4, 1e-1)


def _peak(config: dict[str, Any]) -> float:
    """An objective where only the learning rate matters, with a narrow peak between grid points."""
    return float(math.exp(-(((math.log10(config["lr"]) + 2.3) / 0.15) ** 2)))


def _grid_best() -> float:
    """Best of a 3 x 3 log grid (cell centres of the three decades x three widths) on :func:`_peak`."""
    return max(_peak({"lr": 10**e, "width": w}) for e in (-3.5, -2.5, -1.5) for w in (8, 32, 128))


#: The grader's own mixed space: a log range over four decades, a linear range, two sets of options.
_SPACE = {
    "lr": ("log", 1e-5, 1e-1),
    "dropout": ("linear", 0.05, 0.5),
    "optimizer": ("choice", ["sgd", "adam", "rmsprop"]),
    "width": ("choice", [16, 32, 64, 128]),
}


def _spread(seen: list[dict[str, Any]]) -> list[str]:
    """Check how the draws of every dimension of :data:`_SPACE` spread; return one summary per dimension."""
    summary = []
    for name, (kind, *args) in _SPACE.items():
        values = [c[name] for c in seen]
        if kind == "choice":
            options = args[0]
            if any(v not in options for v in values):
                odd = sorted({str(v) for v in values if v not in options})[:4]
                raise Wrong(f"'{name}' is a choice among {options}, but your draws include {odd}.")
            shares = [values.count(o) / len(values) for o in options]
            if min(shares) < 0.5 / len(options):
                raise Wrong(
                    f"'{name}' ({kind} among {options}): your draws picked them "
                    f"{', '.join(f'{s:.0%}' for s in shares)} of the time."
                )
            summary.append(f"{name}: {len(options)} options")
            continue
        low, high = args
        x = np.array(values, dtype=float)
        if x.min() < low * (1 - 1e-9) or x.max() > high * (1 + 1e-9):  # 10.0 ** -5 < 1e-5 by one ulp
            raise Wrong(
                f"'{name}' ranges over [{low}, {high}]; your draws go from {x.min():.3g} to {x.max():.3g}."
            )
        if kind == "log":
            edges = np.logspace(np.log10(low), np.log10(high), 5)
            shares = [
                float(np.mean((x >= lo) & (x < hi))) for lo, hi in zip(edges[:-1], edges[1:], strict=True)
            ]
            if min(shares) < 0.17:
                raise Wrong(
                    f"'{name}' is a log dimension over [{low}, {high}]; of {len(x)} draws, its four "
                    f"decades got {', '.join(f'{s:.0%}' for s in shares)}."
                )
            summary.append(f"{name}: {', '.join(f'{s:.0%}' for s in shares)} per decade")
        else:
            lower = float(np.mean(x < (low + high) / 2))
            if not 0.4 < lower < 0.6:
                raise Wrong(
                    f"'{name}' is a linear dimension over [{low}, {high}]; {lower:.0%} of your {len(x)} "
                    "draws fell in the lower half of the range."
                )
            summary.append(f"{name}: {lower:.0%} in the lower half")
    return summary


def _ray_sampler(code: Any) -> bool:
    """Whether ``code`` belongs to Ray Tune's search-space sampling (``tune.loguniform(...).sample()``)."""
    return code.co_filename.replace("\\", "/").endswith("ray/tune/search/sample.py")


class _StudyCreated(BaseException):
    """Raised (past any ``except Exception`` in the student's code) when an Optuna study is created."""


@contextlib.contextmanager
def _without_optuna_studies() -> Iterator[None]:
    """Refuse Optuna studies while 06a.1 runs: its sampler is the exercise (Optuna is imported by then)."""
    optuna = sys.modules.get("optuna")
    if optuna is None:
        yield
        return
    study_class = optuna.study.Study
    original = study_class.__init__

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise _StudyCreated

    study_class.__init__ = refuse
    try:
        yield
    except _StudyCreated:
        raise Wrong(
            "your random_search created an Optuna study: this exercise is the sampler itself. Draw each "
            "configuration yourself from np.random.default_rng(seed)."
        ) from None
    finally:
        study_class.__init__ = original


@exercise(
    "06a.1",
    "random search over a described space",
    task="random_search(objective, space, n_trials, seed) returns the best configuration (a dict with "
    "exactly the space's names) after one objective(config) call per trial, every value drawn from "
    "np.random.default_rng(seed); Optuna's and Ray Tune's samplers are refused. Checked with 600 trials on "
    "the grader's own mixed space (calls counted, each dimension's spread over its range, best returned, "
    "seeding), then 9 trials on 40 seeds against a 3 × 3 log grid.",
    hint="treat each kind of dimension on its own scale: a log range is uniform in the exponent (section 2), "
    "a linear range in the value, a choice gives every option the same odds; and remember the best score",
)
def grade_random_search(random_search: Callable[..., Any]) -> str:
    def recorder(seen: list[tuple[dict[str, Any], float]]) -> Callable[[Any], float]:
        def objective(config: Any) -> float:
            if not isinstance(config, dict) or set(config) != set(_SPACE):
                shown = sorted(config) if isinstance(config, dict) else config
                raise Wrong(
                    f"objective was called with {shown!r}; a config has exactly the names {sorted(_SPACE)}."
                )
            score = -abs(math.log10(float(config["lr"])) + 3) - abs(float(config["dropout"]) - 0.2)
            score += 0.01 * (config["optimizer"] == "adam") + 0.001 * math.log2(float(config["width"]))
            seen.append((dict(config), score))
            return score

        return objective

    seen: list[tuple[dict[str, Any], float]] = []
    with _without_optuna_studies():
        best, library = calls_during(random_search, _ray_sampler, recorder(seen), _SPACE, 600, 0)
    if library:
        raise Wrong(
            "your random_search drew with Ray Tune's sampler (tune.loguniform, tune.choice, …): this "
            "exercise is the sampler itself. Draw each value yourself from np.random.default_rng(seed)."
        )
    if len(seen) != 600:
        raise Wrong(f"with n_trials=600 the objective was called {len(seen)} times.")
    summary = _spread([c for c, _ in seen])
    top = max(seen, key=lambda item: item[1])[0]
    if not isinstance(best, dict) or best != top:
        raise Wrong(f"you returned {best!r}, but the config with the highest score was {top!r}.")
    again: list[tuple[dict[str, Any], float]] = []
    other: list[tuple[dict[str, Any], float]] = []
    random_search(recorder(again), _SPACE, 600, 0)
    random_search(recorder(other), _SPACE, 600, 1)
    if again != seen:
        raise Wrong(
            "the same seed gave a different search: draw everything from np.random.default_rng(seed)."
        )
    if other == seen:
        raise Wrong("seeds 0 and 1 gave the same search: the draws do not depend on the seed.")
    results = []
    for seed in range(1, 41):  # nine trials, as many as a 3 x 3 grid
        chosen = random_search(
            _peak_only, {"lr": ("log", *LR_RANGE), "width": ("choice", list(WIDTHS))}, 9, seed
        )
        results.append(_peak(chosen))
    grid = _grid_best()
    if np.mean(results) <= grid:
        raise Wrong(
            f"with 9 trials your search found {np.mean(results):.2f} on average (40 seeds), a 3 x 3 "
            f"log grid {grid:.2f}; random search should beat it here."
        )
    return (
        f"600 calls on a mixed space ({'; '.join(summary)}), best config returned, seeded; "
        f"9 trials beat a 3 x 3 log grid on average ({np.mean(results):.2f} vs {grid:.2f})"
    )


def _peak_only(config: dict[str, Any]) -> float:
    return _peak(config)


@exercise(
    "06a.2",
    "an objective ASHA can prune",
    task="pruned_objective(trial, max_t): section 3's search space, a TrialRun(config, seed=trial.number) "
    "trained for up to max_t epochs, its validation accuracy made known to the pruner after every epoch, the "
    "final accuracy returned. Run in a 10-trial study under Optuna's SuccessiveHalvingPruner (max_t=4); the "
    "grader checks the distributions, each trial's reported steps, when it asked the pruner and how it "
    "ended, and the values against TrialRun.",
    hint="a pruner judges only what the trial told Optuna during training, and it cannot stop your loop "
    "itself: read how intermediate values and pruning work in Optuna's tutorial",
)
def grade_pruned_objective(pruned_objective: Callable[..., Any]) -> str:
    import optuna

    from ..tuning import TrialRun

    class Watched(optuna.pruners.BasePruner):  # ASHA, noting every question and its answer
        def __init__(self) -> None:
            self.inner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2)
            self.asked: dict[int, list[tuple[int | None, bool]]] = {}

        def prune(self, study: Any, trial: Any) -> bool:
            decision = bool(self.inner.prune(study, trial))
            self.asked.setdefault(trial.number, []).append((trial.last_step, decision))
            return decision

    max_t, n_trials = 4, 10
    pruner = Watched()
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0), pruner=pruner
        )
        study.optimize(lambda t: pruned_objective(t, max_t), n_trials=1, catch=())
        if not study.trials[0].intermediate_values:  # say so after one training, not ten
            raise Wrong("your first trial reported no intermediate value, so a pruner can never stop it.")
        study.optimize(lambda t: pruned_objective(t, max_t), n_trials=n_trials - 1, catch=())
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
    for t in trials:
        asked = pruner.asked.get(t.number, [])
        after = {step for step, _ in asked}
        unasked = [s for s in steps[t.number][:-1] if s not in after]
        if unasked:
            raise Wrong(
                f"trial {t.number} trained on after reporting step {unasked[0]} without asking the pruner "
                "(trial.should_prune()), so ASHA could not stop it there."
            )
        stops = [step for step, decision in asked if decision]
        if stops and (stops[0] != steps[t.number][-1] or t.state != optuna.trial.TrialState.PRUNED):
            raise Wrong(
                f"the pruner said stop to trial {t.number} after step {stops[0]}, but it reported up to step "
                f"{steps[t.number][-1]} and ended {t.state.name}: stop it at once, the way Optuna expects."
            )
        if t.state == optuna.trial.TrialState.PRUNED and not stops:
            raise Wrong(f"trial {t.number} ended pruned although the pruner never said so: let ASHA decide.")
    if not pruned:
        raise Wrong(
            f"none of {n_trials} trials was pruned, although this ASHA pruner stops about half of the trials "
            "at each rung: its decisions were not acted on."
        )
    if any(len(steps[t.number]) != max_t for t in complete):
        raise Wrong(
            f"a completed trial reported {[len(steps[t.number]) for t in complete]} epochs, "
            f"not max_t={max_t}."
        )
    t = complete[-1]  # not trial 0, whose seed trial.number is also the default seed 0
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
