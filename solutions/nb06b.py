"""Reference solutions of notebook 06b's exercises (and typical wrong attempts), run by
tests/test_solutions.py."""

from ray import tune
from ray.tune.schedulers import ASHAScheduler

from mgpu_helpers import tuning


def trainable(config):
    run = tuning.TrialRun(config, seed=config["seed"])
    for _ in range(config["max_epochs"]):
        metrics = run.step()
        tune.report({"loss": metrics["loss"], "accuracy": metrics["accuracy"]})


def trainable_reporting_once(config):
    """The usual slip: train everything, then report once — no scheduler can stop such a trial early."""
    run = tuning.TrialRun(config, seed=config["seed"])
    for _ in range(config["max_epochs"]):
        metrics = run.step()
    tune.report({"loss": metrics["loss"], "accuracy": metrics["accuracy"]})


def make_scheduler():
    return ASHAScheduler(metric="accuracy", mode="max", max_t=32, grace_period=2, reduction_factor=4)


def make_scheduler_halving():
    """The usual slip: keeping the notes' reduction_factor=2, which adds rungs at 4 and 16."""
    return ASHAScheduler(metric="accuracy", mode="max", max_t=32, grace_period=2, reduction_factor=2)


SOLUTIONS = {"06b.1": (trainable,), "06b.2": (make_scheduler,)}
WRONG = {"06b.1": (trainable_reporting_once,), "06b.2": (make_scheduler_halving,)}
