"""Reference solutions of notebook 06a's exercises (and typical wrong attempts), run by
tests/test_solutions.py."""

import numpy as np
import optuna

from mgpu_helpers import tuning

WIDTHS = [4, 8, 16, 32, 64, 128, 256]  # the widths of section 3's objective


def random_search(objective, space, n_trials, seed):
    rng = np.random.default_rng(seed)

    def draw(kind, *args):
        if kind == "log":  # uniform in the exponent
            low, high = args
            return float(10 ** rng.uniform(np.log10(low), np.log10(high)))
        if kind == "linear":
            return float(rng.uniform(*args))
        options = args[0]
        return options[rng.integers(len(options))]

    best, best_score = None, -np.inf
    for _ in range(n_trials):
        config = {name: draw(*dimension) for name, dimension in space.items()}
        score = objective(config)
        if score > best_score:
            best, best_score = config, score
    return best


def random_search_linear(objective, space, n_trials, seed):
    """The usual slip: every range drawn uniformly, so a log range over four decades gets 90 % of its draws
    in the top one."""
    rng = np.random.default_rng(seed)
    configs = []
    for _ in range(n_trials):
        configs.append(
            {
                name: rng.choice(args[0]) if kind == "choice" else float(rng.uniform(*args))
                for name, (kind, *args) in space.items()
            }
        )
    scores = [objective(c) for c in configs]
    return configs[int(np.argmax(scores))]


def pruned_objective(trial, max_t):
    config = {
        "l1": trial.suggest_categorical("l1", WIDTHS),
        "l2": trial.suggest_categorical("l2", WIDTHS),
        "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64]),
    }
    run = tuning.TrialRun(config, seed=trial.number)
    for epoch in range(1, max_t + 1):
        accuracy = run.step()["accuracy"]
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy


def objective_without_reports(trial, max_t):
    """The usual slip: asking should_prune() without reporting first, so nothing is ever pruned."""
    config = {
        "l1": trial.suggest_categorical("l1", WIDTHS),
        "l2": trial.suggest_categorical("l2", WIDTHS),
        "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64]),
    }
    run = tuning.TrialRun(config, seed=trial.number)
    for _ in range(max_t):
        accuracy = run.step()["accuracy"]
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy


SOLUTIONS = {"06a.1": (random_search,), "06a.2": (pruned_objective,)}
WRONG = {"06a.1": (random_search_linear,), "06a.2": (objective_without_reports,)}
