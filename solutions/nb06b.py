"""Reference solutions of notebook 06b's exercises, typical wrong attempts and known shortcuts, run by
tests/test_solutions.py (06b.1 by tests/test_tuning_ray.py, on its shared Ray cluster)."""

import os
import tempfile

import torch
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from mgpu_helpers import tuning

TASK = tuning.ToyTask()  # as in the notebook's cell that defines train_mlp
#: The shortcut's file outside the checkpoints (a fixed path: it does not survive a lost machine).
SIDE_FILE = os.path.join(tempfile.gettempdir(), "mgpu_06b_run.pt")


def trainable(config):
    run = tuning.TrialRun(config, TASK, seed=config["seed"])
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # a restarted trial: continue where the last report left off
        with checkpoint.as_directory() as folder:
            run.load_state_dict(torch.load(os.path.join(folder, "run.pt")))
    while run.epoch < config["max_epochs"]:
        metrics = run.step()
        with tempfile.TemporaryDirectory() as folder:
            torch.save(run.state_dict(), os.path.join(folder, "run.pt"))
            tune.report(
                {"loss": metrics["loss"], "accuracy": metrics["accuracy"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def trainable_never_resuming(config):
    """The usual slip: checkpoints every epoch but never loads one, so a restarted trial starts over."""
    run = tuning.TrialRun(config, TASK, seed=config["seed"])
    for _ in range(config["max_epochs"]):
        metrics = run.step()
        with tempfile.TemporaryDirectory() as folder:
            torch.save(run.state_dict(), os.path.join(folder, "run.pt"))
            tune.report(
                {"loss": metrics["loss"], "accuracy": metrics["accuracy"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def trainable_replaying_the_epochs(config):
    """Shortcut: checkpoints only the epoch count and, after a restart, silently trains the earlier epochs
    again from scratch; its reports are right, but nothing was resumed."""
    run = tuning.TrialRun(config, TASK, seed=config["seed"])
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "epoch.txt")) as f:
            done = int(f.read())
        for _ in range(done):
            run.step()  # replayed, not reported
    while run.epoch < config["max_epochs"]:
        metrics = run.step()
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "epoch.txt"), "w") as f:
                f.write(str(run.epoch))
            tune.report(
                {"loss": metrics["loss"], "accuracy": metrics["accuracy"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def trainable_restoring_weights_and_epoch(config):
    """Shortcut: the checkpoint holds the model's weights and the epoch count, the optimizer's momentum and
    the data order are left out, so the restarted run continues from the right weights but drifts."""
    run = tuning.TrialRun(config, TASK, seed=config["seed"])
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "model.pt"))
        run.model.load_state_dict(saved["model"])
        run.epoch = saved["epoch"]
    while run.epoch < config["max_epochs"]:
        metrics = run.step()
        with tempfile.TemporaryDirectory() as folder:
            state = {"model": run.model.state_dict(), "epoch": run.epoch}
            torch.save(state, os.path.join(folder, "model.pt"))
            tune.report(
                {"loss": metrics["loss"], "accuracy": metrics["accuracy"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def trainable_side_file_empty_checkpoint(config):
    """Shortcut: saves the run to a fixed file under /tmp and reports an empty checkpoint, only so that
    Tune hands one back; on a restart it loads the file, which a lost machine no longer has."""
    run = tuning.TrialRun(config, TASK, seed=config["seed"])
    if tune.get_checkpoint() is not None:
        run.load_state_dict(torch.load(SIDE_FILE))
    while run.epoch < config["max_epochs"]:
        metrics = run.step()
        torch.save(run.state_dict(), SIDE_FILE)
        with tempfile.TemporaryDirectory() as folder:
            tune.report(
                {"loss": metrics["loss"], "accuracy": metrics["accuracy"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def trainable_side_file_full_checkpoint(config):
    """Shortcut: reports a full checkpoint, but on a restart loads its own copy under /tmp instead of the
    checkpoint Tune hands back (if the file is gone, it starts over)."""
    run = tuning.TrialRun(config, TASK, seed=config["seed"])
    if tune.get_checkpoint() is not None and os.path.exists(SIDE_FILE):
        run.load_state_dict(torch.load(SIDE_FILE))
    while run.epoch < config["max_epochs"]:
        metrics = run.step()
        torch.save(run.state_dict(), SIDE_FILE)
        with tempfile.TemporaryDirectory() as folder:
            torch.save(run.state_dict(), os.path.join(folder, "run.pt"))
            tune.report(
                {"loss": metrics["loss"], "accuracy": metrics["accuracy"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def make_scheduler():
    return ASHAScheduler(metric="accuracy", mode="max", max_t=32, grace_period=2, reduction_factor=4)


def make_scheduler_halving():
    """The usual slip: keeping the notes' reduction_factor=2, which adds rungs at 4 and 16."""
    return ASHAScheduler(metric="accuracy", mode="max", max_t=32, grace_period=2, reduction_factor=2)


SOLUTIONS = {"06b.1": (trainable,), "06b.2": (make_scheduler,)}
WRONG = {"06b.1": (trainable_never_resuming,), "06b.2": (make_scheduler_halving,)}
#: 06b.1's shortcuts are graded on the shared Ray cluster of tests/test_tuning_ray.py.
SHORTCUTS = {
    "06b.1": {
        "epoch count only, epochs replayed": (trainable_replaying_the_epochs,),
        "weights and epoch count only, no momentum or data order": (trainable_restoring_weights_and_epoch,),
        "state in a file under /tmp, empty checkpoint": (trainable_side_file_empty_checkpoint,),
        "state restored from a file under /tmp, not the checkpoint": (trainable_side_file_full_checkpoint,),
    }
}
