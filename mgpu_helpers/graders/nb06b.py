"""Used by notebook 06b's exercises: a Ray Tune trainable run by a real ``tune.Tuner`` (06b.1) and an
``ASHAScheduler`` configured for given rungs, checked against Ray's own scheduler (06b.2).

06b.1 uses the Ray the notebook is connected to (its ``LocalRayCluster``); with none, it starts one for
the check with :func:`mgpu_helpers.tuning.local_ray` (127.0.0.1, two CPUs) and stops it afterwards. A
trainable defined outside ``__main__`` (e.g. in a module next to the notebook) is shipped to Ray's
workers by value, as a notebook function is.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..exercises import Wrong, exercise

_CONFIG = {"l1": 16, "l2": 16, "lr": 0.05, "batch_size": 64, "max_epochs": 3}


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


@exercise(
    "06b.1",
    "a Ray Tune trainable",
    hint="loop over config['max_epochs'] epochs; after each run.step(), "
    "call tune.report({'loss': ..., 'accuracy': ...})",
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
        results = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={**_CONFIG, "seed": tune.grid_search([0, 1])},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(name="grader_06b_1", storage_path=storage, verbose=0),
        ).fit()
        runs = [(r.config["seed"], r.error, r.metrics_dataframe) for r in results]
    epochs = _CONFIG["max_epochs"]
    for seed, error, df in sorted(runs, key=lambda item: item[0]):
        if error is not None:
            last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            raise Wrong(f"the trial with seed {seed} failed inside Ray: {last}")
        if df is None or not {"loss", "accuracy"} <= set(df.columns):
            columns = [] if df is None else sorted(c for c in df.columns if "/" not in c)[:8]
            raise Wrong(f"the trial with seed {seed} reported no 'loss' and 'accuracy' (columns: {columns}).")
        if len(df) != epochs:
            raise Wrong(
                f"the trial with seed {seed} reported {len(df)} time(s) for {epochs} epochs; a scheduler "
                "needs one report per epoch."
            )
        expected = train_locally({k: _CONFIG[k] for k in ("l1", "l2", "lr", "batch_size")}, epochs, seed=seed)
        for column in ("loss", "accuracy"):
            want = [m[column] for m in expected]
            if not np.allclose(list(df[column]), want, rtol=1e-5, atol=1e-6):
                got = [round(float(v), 4) for v in df[column]]
                raise Wrong(
                    f"seed {seed}: reported {column} {got}, but TrialRun(config, seed=config['seed']) "
                    f"gives {[round(v, 4) for v in want]} epoch by epoch."
                )
    return f"two trials under tune.Tuner, {epochs} reports each, equal to TrialRun outside Ray"


@exercise(
    "06b.2",
    "configure ASHA",
    hint="rungs are grace_period * reduction_factor**k up to max_t: the first "
    "rung is the grace period, and each rung is reduction_factor times the one before",
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
