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


def _suggest(trial):
    return {
        "l1": trial.suggest_categorical("l1", WIDTHS),
        "l2": trial.suggest_categorical("l2", WIDTHS),
        "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64]),
    }


def objective_asking_before_each_epoch(trial, max_t):
    """Also right: the pruner is asked before each epoch (uselessly before the first), so no epoch is
    trained after a stop."""
    run = tuning.TrialRun(_suggest(trial), seed=trial.number)
    for epoch in range(max_t):
        if trial.should_prune():
            raise optuna.TrialPruned()
        accuracy = run.step()["accuracy"]
        trial.report(accuracy, epoch)
    return accuracy


def random_search_by_optuna(objective, space, n_trials, seed):
    """Shortcut: Optuna's RandomSampler (ask and tell) draws the configurations, so the sampler, the
    exercise, is never written."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))
    best, best_score = None, -np.inf
    for _ in range(n_trials):
        trial = study.ask()
        config = {
            name: trial.suggest_categorical(name, args[0])
            if kind == "choice"
            else trial.suggest_float(name, *args, log=kind == "log")
            for name, (kind, *args) in space.items()
        }
        score = objective(config)
        study.tell(trial, score)
        if score > best_score:
            best, best_score = config, score
    return best


def random_search_integer_exponents(objective, space, n_trials, seed):
    """Shortcut: section 1's ``2 ** rng.integers(...)`` pattern for log ranges, so only powers of ten
    are ever tried (the decades look evenly covered; a peak between them is missed)."""
    rng = np.random.default_rng(seed)
    best, best_score = None, -np.inf
    for _ in range(n_trials):
        config = {}
        for name, (kind, *args) in space.items():
            if kind == "log":
                low, high = np.log10(args[0]), np.log10(args[1])
                config[name] = float(10.0 ** rng.integers(round(low), round(high) + 1))
            elif kind == "linear":
                config[name] = float(rng.uniform(*args))
            else:
                config[name] = args[0][rng.integers(len(args[0]))]
        score = objective(config)
        if score > best_score:
            best, best_score = config, score
    return best


def random_search_by_ray_tune(objective, space, n_trials, seed):
    """Shortcut: Ray Tune's search-space samplers (``tune.loguniform(...).sample(random_state=rng)``, named
    in section 2) draw every value, so the log-uniform draw, the exercise, is never written."""
    from ray import tune

    rng = np.random.default_rng(seed)
    kinds = {"log": tune.loguniform, "linear": tune.uniform, "choice": tune.choice}
    domains = {name: kinds[kind](*args) for name, (kind, *args) in space.items()}
    best, best_score = None, -np.inf
    for _ in range(n_trials):
        config = {name: domain.sample(random_state=rng) for name, domain in domains.items()}
        score = objective(config)
        if score > best_score:
            best, best_score = config, score
    return best


def objective_pruned_after_training(trial, max_t):
    """Shortcut: reports every epoch, but asks the pruner only once training is over, so a pruned trial
    has cost a full training anyway."""
    run = tuning.TrialRun(_suggest(trial), seed=trial.number)
    for epoch in range(1, max_t + 1):
        accuracy = run.step()["accuracy"]
        trial.report(accuracy, epoch)
    if trial.should_prune():
        raise optuna.TrialPruned()
    return accuracy


def objective_pruned_by_own_threshold(trial, max_t):
    """Shortcut: stops trials below a fixed accuracy itself instead of asking the study's pruner."""
    run = tuning.TrialRun(_suggest(trial), seed=trial.number)
    for epoch in range(1, max_t + 1):
        accuracy = run.step()["accuracy"]
        trial.report(accuracy, epoch)
        if accuracy < 0.5:
            raise optuna.TrialPruned()
    return accuracy


SOLUTIONS = {"06a.1": (random_search,), "06a.2": (pruned_objective,)}
VARIANTS = {"06a.2": {"asking_before_each_epoch": (objective_asking_before_each_epoch,)}}
SHORTCUTS = {
    "06a.1": {
        "optuna_random_sampler": (random_search_by_optuna,),
        "integer_exponents_like_section_1": (random_search_integer_exponents,),
        "ray_tune_samplers": (random_search_by_ray_tune,),
    },
    "06a.2": {
        "prune_after_full_training": (objective_pruned_after_training,),
        "prune_by_own_threshold": (objective_pruned_by_own_threshold,),
    },
}
WRONG = {"06a.1": (random_search_linear,), "06a.2": (objective_without_reports,)}
