"""Used by notebook 08's exercise 08.2 (:mod:`~mgpu_helpers.graders.nb08` says how it is graded): a Ray
Tune trainable that reports every epoch with a checkpoint, run by a real ``tune.Tuner`` with ASHA."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Callable
from typing import Any

from ...exercises import Wrong, exercise
from ._common import _N_VAL, _digits, _full_accuracies


def _model() -> Any:
    """Section 1's ``make_model()``: the architecture whose weights 08.2's checkpoints hold."""
    from torch import nn

    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _state_dict(checkpoint: Any) -> Any:
    """The state dict in a trial's checkpoint folder: its one ``.pt``/``.pth`` file (or that file's
    ``"model"`` entry); a short description of what is there instead."""
    import torch

    if checkpoint is None:
        return "no checkpoint"
    with checkpoint.as_directory() as folder:
        files = sorted(f for f in os.listdir(folder) if f.endswith((".pt", ".pth")))
        if len(files) != 1:
            return f"{len(files)} .pt files ({sorted(os.listdir(folder))})"
        try:
            state = torch.load(os.path.join(folder, files[0]), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file is the student's to fix
            return f"a file torch.load cannot read ({type(exc).__name__})"
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    return state if isinstance(state, dict) else f"a {type(state).__name__}"


@exercise(
    "08.2",
    "a Tune trainable that ASHA can stop early",
    task="trainable(config, data) trains as tune_trial does (config['lr'], config['epochs']) so that ASHA "
    "can stop a poor learning rate after its first epoch, each report carrying a checkpoint of the model's "
    "state_dict() in one file. Run by tune.Tuner on this notebook's Ray, lr 0.2 then 1e-5, 3 epochs, "
    "grace_period=1: the grader checks what each trial reported and when (the good one must reach 0.8) and "
    "recomputes each reported accuracy from its checkpoint.",
    hint="a scheduler can only judge a trial by what it has reported so far: what should your trainable "
    "report, on which data, and how often?",
)
def grade_trainable(trainable: Callable[..., Any]) -> str:
    import torch
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from ...tuning import quiet_logs
    from ..nb06b import _by_value, _ray_here

    if not callable(trainable):
        raise Wrong(f"pass the function itself, not {type(trainable).__name__}.")
    data = _digits()
    good, poor, epochs = 0.2, 1e-5, 3
    printed = io.StringIO()  # Ray's console output stays out of the feedback
    with (
        _ray_here(),
        _by_value(trainable),
        quiet_logs(),
        tempfile.TemporaryDirectory(prefix="grader-08-2-") as storage,
        contextlib.redirect_stdout(printed),
    ):
        results = tune.Tuner(
            tune.with_resources(tune.with_parameters(trainable, data=data), {"cpu": 1}),
            param_space={"lr": tune.grid_search([good, poor]), "epochs": epochs},
            tune_config=tune.TuneConfig(
                scheduler=ASHAScheduler(metric="accuracy", mode="max", max_t=epochs, grace_period=1),
                max_concurrent_trials=1,  # the good trial first: ASHA compares the poor one with it
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(name="grader_08_2", storage_path=storage, verbose=0),
        ).fit()
        by_lr = {r.config["lr"]: r for r in results}
        errors = [r.error for r in results if r.error is not None]
        reports = {lr: r.metrics_dataframe for lr, r in by_lr.items()}
        saved = by_lr[good].best_checkpoints if good in by_lr and not errors else []
        saved = sorted(saved, key=lambda pair: pair[1].get("training_iteration", 0))  # in report order
        states = [_state_dict(checkpoint) for checkpoint, _ in saved]
        last_state = states[-1] if states and isinstance(states[-1], dict) else {}
    if errors:
        text = str(errors[0]).strip()
        raise Wrong(
            f"a trial failed inside Ray: {text.splitlines()[-1] if text else type(errors[0]).__name__}"
        )
    for lr, df in reports.items():
        if df is None or "accuracy" not in df.columns:
            raise Wrong(f"the trial with lr={lr:g} reported no 'accuracy'.")
    accuracies = [float(v) for v in reports[good]["accuracy"]]
    if len(accuracies) != epochs:
        raise Wrong(
            f"the trial with lr={good:g} trained {epochs} epochs and reported {len(accuracies)} time(s): "
            "ASHA could only judge it at the end."
        )
    for value in accuracies:
        if abs(value * _N_VAL - round(value * _N_VAL)) > 1e-6:
            raise Wrong(
                f"a reported accuracy, {value:.5f}, is not a number of correct samples out of the {_N_VAL} "
                "validation samples."
            )
    if accuracies[-1] < 0.8:
        raise Wrong(
            f"with lr={good:g} the accuracy after {epochs} epochs is {accuracies[-1]:.3f}, below 0.8."
        )
    if len(saved) != epochs:
        raise Wrong(
            f"the trial with lr={good:g} reported {epochs} times with {len(saved)} checkpoint(s); each "
            "report needs a tune.Checkpoint of the model's weights."
        )
    model = _model()
    for epoch, (state, accuracy) in enumerate(zip(states, accuracies, strict=True), start=1):
        if not isinstance(state, dict):
            raise Wrong(f"the checkpoint of epoch {epoch} holds {state}, not a torch.save'd state_dict().")
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise Wrong(
                f"the checkpoint's weights do not fit section 1's make_model(): {str(exc).splitlines()[0]}"
            ) from None
        final = state.keys() == last_state.keys() and all(torch.equal(state[k], last_state[k]) for k in state)
        if epoch < epochs and final:
            raise Wrong(
                f"the checkpoint reported after epoch {epoch} of {epochs} already holds the final weights: "
                "the trial trained first and reported afterwards. Report after each epoch's training, so "
                "that ASHA can stop a poor trial before it spends the remaining epochs."
            )
        full = _full_accuracies(model, data[2], data[3])
        if not any(abs(accuracy - a) < 1e-6 for a in full):
            raise Wrong(
                f"the accuracy reported after epoch {epoch} is {accuracy:.5f}, but the model in its "
                f"checkpoint classifies {full[0]:.5f} of the {_N_VAL} validation samples correctly "
                f"({full[1]:.5f} under bf16 autocast)."
            )
    stopped = len(reports[poor])
    if stopped != 1:
        raise Wrong(
            f"the trial with lr={poor:g} reported {stopped} times; ASHA should have stopped it after 1."
        )
    return (
        f"reports every epoch, with a checkpoint, on the {_N_VAL} validation samples "
        f"(lr={good:g}: {accuracies[-1]:.3f} after {epochs}); ASHA stopped lr={poor:g} after its first epoch"
    )
