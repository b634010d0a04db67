"""Used by notebook 06b's exercises: a Ray Tune trainable that checkpoints and resumes, run by a real
``tune.Tuner`` with a simulated crash (06b.1), and an ``ASHAScheduler`` configured for given rungs,
checked against Ray's own scheduler (06b.2).

06b.1 uses the Ray the notebook is connected to (its ``LocalRayCluster``); with none, it starts one for
the check with :func:`mgpu_helpers.tuning.local_ray` (127.0.0.1, two CPUs) and stops it afterwards. A
trainable defined outside ``__main__`` (e.g. in a module next to the notebook) is shipped to Ray's
workers by value, as a notebook function is.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..exercises import Wrong, exercise

_CONFIG = {"l1": 16, "l2": 16, "lr": 0.05, "batch_size": 64, "max_epochs": 4, "seed": 1}
_CRASH_BEFORE = 3  # the simulated crash hits when epoch 3 starts, after two reports


@contextlib.contextmanager
def _ray_here() -> Iterator[None]:
    """The Ray this process is connected to, or a private one for the duration of the block."""
    import ray

    from ..tuning import local_ray

    if ray.is_initialized():
        yield
    else:
        with local_ray(num_cpus=2):
            yield


@contextlib.contextmanager
def _by_value(fn: Callable[..., Any]) -> Iterator[None]:
    """Pickle ``fn``'s module by value while the block runs (Ray's workers may not import it)."""
    from ray import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    own = (
        module is not None
        and module.__name__ not in ("__main__", "builtins")
        and not (module.__name__.startswith(("mgpu_helpers", "ray", "torch")))
    )
    if own:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        if own:
            cloudpickle.unregister_pickle_by_value(module)


def _crash_once(trainable: Callable[..., Any], marker: str) -> Callable[[dict[str, Any]], None]:
    """``trainable`` wrapped so that its first attempt to train epoch :data:`_CRASH_BEFORE` raises.

    The crash is raised by :meth:`TrialRun.step` (patched in the trial's worker process only, while the
    trial runs), so it hits the student's loop wherever it is; ``marker`` (a file path) records that it
    happened, because the retried trial runs in a new actor. After the crash, every epoch trained is
    logged to ``marker + ".after"``: the epochs the run had done and a fingerprint of its weights when the
    epoch started, so that the grader sees whether the restart restored the model or trained it again.

    Like a lost machine, the restart finds none of the files the first attempt wrote with ``torch.save``
    outside Tune's storage (the folder of ``marker``): they are deleted before the trainable runs again,
    and listed in ``marker + ".deleted"``. Only what the trial put in its checkpoints survives.
    """

    def crashing(config: dict[str, Any]) -> None:
        from pathlib import Path

        import torch

        from mgpu_helpers.tuning import SimulatedCrash, TrialRun

        storage = os.path.realpath(os.path.dirname(marker))
        if Path(marker).exists():  # the restart: the first attempt's machine is gone
            _delete_saved_outside(marker, storage)
        original, original_save = TrialRun.step, torch.save

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            path = f if isinstance(f, str | os.PathLike) else getattr(f, "name", None)
            if isinstance(path, str | os.PathLike) and not Path(marker).exists():
                with open(marker + ".saved", "a") as log:
                    log.write(os.path.realpath(path) + "\n")
            return original_save(obj, f, *args, **kwargs)

        def step(self: Any) -> dict[str, float]:
            if Path(marker).exists():
                with open(marker + ".after", "a") as log:
                    log.write(f"{self.epoch} {_fingerprint(self.model)!r}\n")
            elif self.epoch == _CRASH_BEFORE - 1:
                Path(marker).touch()
                raise SimulatedCrash(f"simulated crash before epoch {_CRASH_BEFORE} (by the grader)")
            return original(self)

        TrialRun.step, torch.save = step, save
        try:
            trainable(config)
        finally:
            TrialRun.step, torch.save = original, original_save

    return crashing


def _delete_saved_outside(marker: str, storage: str) -> None:
    """Delete the files logged in ``marker + ".saved"`` that lie outside ``storage``; log them."""
    if not os.path.exists(marker + ".saved"):
        return
    with open(marker + ".saved") as log:
        saved = sorted({line.strip() for line in log if line.strip()})
    for path in saved:
        if os.path.commonpath([path, storage]) != storage and os.path.isfile(path):
            os.remove(path)
            with open(marker + ".deleted", "a") as log:
                log.write(path + "\n")


def _deleted(marker: str) -> list[str]:
    """The files :func:`_delete_saved_outside` deleted before the restart."""
    if not os.path.exists(marker + ".deleted"):
        return []
    with open(marker + ".deleted") as log:
        return [line.strip() for line in log if line.strip()]


def _tensors_in(folder: str) -> list[Any]:
    """Every tensor in the files of ``folder`` that ``torch.load`` can read (nested dicts, lists, tuples)."""
    import torch

    found: list[Any] = []

    def collect(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            found.append(obj.detach().cpu())
        elif isinstance(obj, dict):
            for value in obj.values():
                collect(value)
        elif isinstance(obj, list | tuple):
            for value in obj:
                collect(value)

    for root, _, files in os.walk(folder):
        for name in files:
            try:
                collect(torch.load(os.path.join(root, name), map_location="cpu", weights_only=False))
            except Exception:  # not a torch file: Tune's own metadata, or the student's other files
                continue
    return found


def _local_weights(epochs: int) -> list[list[Any]]:
    """The model's parameters after each of ``epochs`` epochs of one uninterrupted run outside Ray."""
    from ..tuning import TrialRun

    run = TrialRun({k: _CONFIG[k] for k in ("l1", "l2", "lr", "batch_size")}, seed=_CONFIG["seed"])
    weights = []
    for _ in range(epochs):
        run.step()
        weights.append([p.detach().cpu().clone() for p in run.model.parameters()])
    return weights


def _check_checkpoints_hold_the_model(checkpoints: list[tuple[Any, dict[str, Any]]], epochs: int) -> None:
    """Raise :class:`Wrong` unless every checkpoint the trial reported holds the model's weights of its epoch
    (so that a restart on another machine can restore them from the checkpoint alone)."""
    import torch

    weights = _local_weights(epochs)
    for checkpoint, metrics in sorted(checkpoints, key=lambda c: c[1].get("training_iteration", 0)):
        epoch = int(metrics.get("training_iteration", 0))
        if not 1 <= epoch <= epochs:
            continue
        with checkpoint.as_directory() as folder:
            got = _tensors_in(folder)
        missing = [
            tuple(w.shape)
            for w in weights[epoch - 1]
            if not any(t.shape == w.shape and torch.allclose(t.double(), w.double(), atol=1e-6) for t in got)
        ]
        if missing:
            raise Wrong(
                f"the checkpoint reported with epoch {epoch} does not hold the model's weights after that "
                f"epoch (no tensor in its folder equals the weights of shapes {missing[:3]}): on another "
                "machine a restarted trial can restore only what tune.get_checkpoint() hands back."
            )


def _fingerprint(model: Any) -> float:
    """A number that changes when any weight changes: the sum of all weights, each scaled by its index."""
    import torch

    with torch.no_grad():
        flat = torch.cat([p.detach().double().cpu().flatten() for p in model.parameters()])
        return float((flat * torch.arange(1, len(flat) + 1, dtype=torch.float64)).sum())


def _trained_after_restart(marker: str) -> list[tuple[int, float]]:
    """(epochs done, weight fingerprint) at the start of each epoch trained after the crash."""
    if not os.path.exists(marker + ".after"):
        return []
    with open(marker + ".after") as log:
        return [(int(e), float(f)) for e, f in (line.split() for line in log if line.strip())]


def _check_resumed(trained: list[tuple[int, float]], epochs: int) -> None:
    """Raise :class:`Wrong` unless the restarted trial continued from restored weights, training each
    remaining epoch once (an epoch count alone, with the earlier epochs replayed, is not a resume)."""
    from ..tuning import TrialRun

    if not trained:
        raise Wrong("after the crash, your trainable trained no epoch: did it return early after restoring?")
    done = [e for e, _ in trained]
    if done[0] == 0 or done != list(range(done[0], epochs)):
        raise Wrong(
            f"after the restart your trainable trained epochs {[e + 1 for e in done]}: it trained the epochs "
            f"before the crash again instead of restoring the model from the checkpoint."
        )
    local = TrialRun({k: _CONFIG[k] for k in ("l1", "l2", "lr", "batch_size")}, seed=_CONFIG["seed"])
    for _ in range(done[0]):
        local.step()
    if not np.isclose(trained[0][1], _fingerprint(local.model), rtol=1e-6, atol=1e-6):
        raise Wrong(
            f"after the restart, the model that trained epoch {done[0] + 1} did not have the weights of "
            f"the run after epoch {done[0]}: restore the model from the checkpoint, not just the epoch."
        )


@exercise(
    "06b.1",
    "a trainable that survives a crash",
    task="trainable(config) trains TrialRun(config, TASK, seed=config['seed']) for config['max_epochs'] "
    "epochs, reports loss and accuracy with a checkpoint after each, and, restarted by Tune, continues from "
    "its last checkpoint. tune.Tuner runs it on the running Ray and crashes it once as epoch 3 of 4 starts, "
    "deleting the files it saved outside checkpoints; every report must equal an uninterrupted run's, and "
    "the restart must begin from the weights its checkpoint holds.",
    hint="a retried trial calls your function again from the top, and Tune can hand it the checkpoint "
    "reported last: read 'function API checkpointing' in Ray Tune's docs, and save everything that "
    "makes the next epoch what it would have been",
    forbid=("train_mlp",),
)
def grade_trainable(trainable: Callable[..., Any]) -> str:
    from ray import tune

    from ..tuning import quiet_logs, train_locally

    if not callable(trainable):
        raise Wrong(f"pass the function itself, not {type(trainable).__name__}.")
    printed = io.StringIO()  # Ray's console output (an experiment banner) stays out of the feedback
    with (
        _ray_here(),
        _by_value(trainable),
        quiet_logs(),
        tempfile.TemporaryDirectory() as storage,
        contextlib.redirect_stdout(printed),
    ):
        marker = os.path.join(storage, "crashed")
        result = tune.Tuner(
            tune.with_resources(_crash_once(trainable, marker), {"cpu": 1}),
            param_space=dict(_CONFIG),
            run_config=tune.RunConfig(
                name="grader_06b_1",
                storage_path=storage,
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=1),
            ),
        ).fit()[0]
        crashed, error, df = os.path.exists(marker), result.error, result.metrics_dataframe
        checkpoint, trained, deleted = result.checkpoint, _trained_after_restart(marker), _deleted(marker)
        epochs = _CONFIG["max_epochs"]
        problem = None
        if error is None and checkpoint is not None:  # read the checkpoints while the storage exists
            try:
                _check_checkpoints_hold_the_model(result.best_checkpoints, epochs)
            except Wrong as wrong:
                problem = str(wrong)
    lost = (
        f" Before the restart the grader deleted the files your trainable had saved outside its checkpoints "
        f"({', '.join(deleted[:3])}), as a lost machine would: restore from what tune.get_checkpoint() "
        "hands back."
        if deleted
        else ""
    )
    if error is not None:
        last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise Wrong(f"the trial failed inside Ray{' after its restart' if crashed else ''}: {last}.{lost}")
    if not crashed:
        raise Wrong(f"your trainable never started epoch {_CRASH_BEFORE} of {epochs}: the crash never came.")
    if df is None or not {"loss", "accuracy"} <= set(df.columns):
        columns = [] if df is None else sorted(c for c in df.columns if "/" not in c)[:8]
        raise Wrong(f"the trial reported no 'loss' and 'accuracy' (columns: {columns}).")
    if checkpoint is None:
        raise Wrong(
            f"the trial reported no checkpoint, so when it crashed before epoch {_CRASH_BEFORE}, Tune could "
            "only start it again from scratch."
        )
    hyper = {k: _CONFIG[k] for k in ("l1", "l2", "lr", "batch_size")}
    expected = train_locally(hyper, epochs, seed=_CONFIG["seed"])
    # Rows are matched by Tune's training_iteration, which a restored trial continues from its checkpoint.
    # (A report made just before a crash can be missing from the history: a race inside Ray.)
    # The reports are compared before the checkpoints: a restart that restored only part of the run (the
    # weights, not the momentum or the data order) drifts, and its later checkpoints differ for that reason.
    iterations = [int(i) for i in df["training_iteration"]]
    for column in ("loss", "accuracy"):
        got = [float(v) for v in df[column]]
        want = [expected[i - 1][column] if 1 <= i <= epochs else float("nan") for i in iterations]
        if iterations[-1] != epochs or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            before = [g for g, w, i in zip(got, want, iterations, strict=True) if i < _CRASH_BEFORE]
            drift = (
                " The reports before the crash match, so the restart did not restore everything that "
                "decides the next epoch."
                if before and np.allclose(before, want[: len(before)], rtol=1e-5, atol=1e-6) and not lost
                else ""
            )
            raise Wrong(
                f"the trial crashed before epoch {_CRASH_BEFORE} and was restarted; over Tune's iterations "
                f"{iterations} it reported {column} {[round(v, 4) for v in got]}, but one uninterrupted run "
                f"of {epochs} epochs gives {[round(m[column], 4) for m in expected]}.{drift}{lost}"
            )
    if problem is not None:
        raise Wrong(problem + lost)
    _check_resumed(trained, epochs)
    return (
        f"crashed before epoch {_CRASH_BEFORE}, restarted by Tune from your checkpoint with the model's "
        f"weights restored, each remaining epoch trained once, and its reports equal one uninterrupted run "
        f"of {epochs} epochs"
    )


@exercise(
    "06b.2",
    "configure ASHA",
    task="make_scheduler() returns an ASHAScheduler for trials of at most 32 epochs, ranked by their "
    "reported 'accuracy' (higher is better) and compared at exactly three rungs: after 2, 8 and 32 epochs. "
    "The grader checks its metric, mode and max_t, reads the rungs from Ray's scheduler, and feeds it a good "
    "trial, then a poor one, which must be stopped at epoch 2.",
    hint="look at how Ray's ASHA places its rungs (section 2, and tuning.asha_milestones): which "
    "parameters decide where the first rung is, how far apart the rungs are, and where they end?",
)
def grade_scheduler(make_scheduler: Callable[..., Any]) -> str:
    from ray.tune.schedulers import ASHAScheduler

    from ..tuning import asha_milestones

    scheduler = make_scheduler()
    if not isinstance(scheduler, ASHAScheduler):
        raise Wrong(f"make_scheduler() returned {type(scheduler).__name__}, not an ASHAScheduler.")
    metric, mode = getattr(scheduler, "_metric", None), getattr(scheduler, "_mode", None)
    if (metric, mode) != ("accuracy", "max"):
        raise Wrong(
            f"it ranks trials by metric={metric!r}, mode={mode!r}; the trials report validation accuracy."
        )
    rungs = sorted(int(m) for m, _ in scheduler._brackets[0]._rungs)
    if rungs != [2, 8, 32]:
        raise Wrong(f"Ray's scheduler compares trials at epochs {rungs}, not at 2, 8 and 32.")
    if scheduler._max_t != 32:
        raise Wrong(f"max_t is {scheduler._max_t}: trials may train at most 32 epochs.")
    # Drive it as Tune does: a good trial first, then a poor one, which must stop at the first rung.
    good, poor = SimpleNamespace(trial_id="good"), SimpleNamespace(trial_id="poor")
    for trial in (good, poor):
        scheduler.on_trial_add(None, trial)
    for epoch in range(1, 33):
        scheduler.on_trial_result(None, good, {"training_iteration": epoch, "accuracy": 0.9})
    stopped = next(
        (
            e
            for e in range(1, 33)
            if scheduler.on_trial_result(None, poor, {"training_iteration": e, "accuracy": 0.3}) == "STOP"
        ),
        None,
    )
    if stopped != 2:
        raise Wrong(f"fed a poor trial after a good one, the scheduler stopped it at epoch {stopped}, not 2.")
    assert rungs == asha_milestones(32, 2, 4)
    return "rungs 2, 8, 32 read from Ray's scheduler; a poor trial was stopped at epoch 2"
