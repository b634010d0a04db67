"""Used by notebook 06b (ASHA's rungs, :func:`asha_milestones`) and by the tests of fault tolerance: what Ray
Tune runs. Notebook 06b writes its own trainable in a cell; :func:`train_mlp` here adds checkpoints and
simulated crashes.

:func:`train_mlp`, a function trainable of ``config`` that reports every epoch with
``ray.tune.report({...})`` (``ray.train.report`` fails inside a Tune function since Ray 2.x split the
Train and Tune APIs) and can checkpoint and crash on purpose (:class:`SimulatedCrash`); the notes'
search space (:func:`notes_search_space`) and its Optuna-friendly translation
(:func:`optuna_search_space`); ASHA's rungs (:func:`asha_milestones`); whether BOHB can run here.
Ray is imported inside the functions that need it, never when this module is imported.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._checks import real, sizes, whole
from ._optional import require
from .task import LR_RANGE, WIDTHS, ToyTask, TrialRun, _config

#: The notes' batch sizes (from the PyTorch CIFAR tutorial they follow).
NOTES_BATCH_SIZES: tuple[int, ...] = (2, 4, 8, 16)


def notes_search_space(batch_sizes: Sequence[int] = NOTES_BATCH_SIZES) -> dict[str, Any]:
    """The lecture notes' search space, unchanged, in today's API (imports Ray).

    ``l1``/``l2``: ``tune.sample_from(lambda _: 2 ** np.random.randint(2, 9))`` (4 … 256);
    ``lr``: ``tune.loguniform(1e-4, 1e-1)``; ``batch_size``: ``tune.choice([2, 4, 8, 16])``.
    ``sample_from`` runs arbitrary Python, which only the default random/grid search can handle;
    use :func:`optuna_search_space` with a search algorithm such as ``OptunaSearch``.
    """
    batch_sizes = sizes("batch_sizes", batch_sizes, "(2, 4, 8, 16)")
    tune = require("ray.tune", "notes_search_space")
    return {
        "l1": tune.sample_from(lambda _: 2 ** np.random.randint(2, 9)),
        "l2": tune.sample_from(lambda _: 2 ** np.random.randint(2, 9)),
        "lr": tune.loguniform(*LR_RANGE),
        "batch_size": tune.choice(list(batch_sizes)),
    }


def optuna_search_space(batch_sizes: Sequence[int] = NOTES_BATCH_SIZES) -> dict[str, Any]:
    """The same distributions without ``sample_from``, so that ``OptunaSearch`` can translate them.

    ``2 ** np.random.randint(2, 9)`` is a uniform choice among the powers of two 4 … 256, so it is
    written as ``tune.choice(WIDTHS)``.
    """
    batch_sizes = sizes("batch_sizes", batch_sizes, "(2, 4, 8, 16)")
    tune = require("ray.tune", "optuna_search_space")
    return {
        "l1": tune.choice(list(WIDTHS)),
        "l2": tune.choice(list(WIDTHS)),
        "lr": tune.loguniform(*LR_RANGE),
        "batch_size": tune.choice(list(batch_sizes)),
    }


class SimulatedCrash(RuntimeError):
    """Raised on purpose by :func:`train_mlp` to show fault tolerance (``config["crash_at"]``)."""


def _crash_plan(config: Mapping[str, Any]) -> list[int]:
    """The epochs of ``config["crash_at"]`` (checked), which need a ``config["crash_dir"]``."""
    wanted = config.get("crash_at", ())
    if isinstance(wanted, str | bytes) or not isinstance(wanted, Sequence):
        raise TypeError(f'config["crash_at"] must be a list of epochs such as [3] or [3, 3], not {wanted!r}')
    wanted = [whole('every epoch in config["crash_at"]', e, 1, "3") for e in wanted]
    folder = config.get("crash_dir")
    if wanted and not (isinstance(folder, str | Path) and str(folder) and Path(folder).is_dir()):
        raise ValueError(
            'config["crash_at"] needs config["crash_dir"], an existing folder that every trial can write '
            "(e.g. tempfile.mkdtemp()); a retried trial is a new process and counts its crashes there"
        )
    return wanted


def _maybe_crash(wanted: list[int], folder: str, epoch: int, trial_id: str) -> None:
    """Raise :class:`SimulatedCrash` at the epochs listed in ``wanted``.

    An epoch listed twice crashes on the first two attempts to train it, and so on; attempts are
    counted with marker files in ``folder`` because a retried trial is a new process.
    """
    if epoch not in wanted:
        return
    done = len(list(Path(folder).glob(f"{trial_id}-epoch{epoch}-*")))
    if done < wanted.count(epoch):
        (Path(folder) / f"{trial_id}-epoch{epoch}-{done}").touch()
        raise SimulatedCrash(f"simulated crash of trial {trial_id} before epoch {epoch} (attempt {done + 1})")


def _trial_device() -> str:
    """``"cuda"`` when Ray gave this trial a GPU (``ray.get_gpu_ids()``), else ``"cpu"``.

    Outside Ray (a plain call, a test) it is ``"cpu"``: ``ray.get_gpu_ids()`` would start a Ray.
    """
    ray = require("ray", "train_mlp")
    if not ray.is_initialized():
        return "cpu"
    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


def train_mlp(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: train :class:`~mgpu_helpers.tuning.TrialRun`, report every epoch.

    Hyperparameters: ``l1``, ``l2``, ``lr``, ``batch_size``. Options (all optional):
    ``max_epochs`` (default 8), ``seed`` (0), ``task`` (a dict of :class:`ToyTask` fields),
    ``checkpoint`` (False: when true, every report carries a checkpoint and a restarted trial resumes
    from the latest one), ``crash_at`` / ``crash_dir`` (see :class:`SimulatedCrash`).

    Every epoch ends with ``tune.report({"epoch", "loss", "accuracy", "train_loss"})``; Tune adds
    ``training_iteration`` (= epochs trained, the time unit of ASHA) and timing columns.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict of hyperparameters (Tune passes one), not {config!r}")
    tune = require("ray.tune", "train_mlp")
    task_fields = config.get("task", {})
    if not isinstance(task_fields, Mapping):
        example = '{"noise": 1.0}'
        raise TypeError(
            f'config["task"] must be a dict of ToyTask fields (e.g. {example}), not {task_fields!r}'
        )
    max_epochs = whole('config["max_epochs"]', config.get("max_epochs", 8), 1, "8")
    crash_at = _crash_plan(config)
    _config(config)  # every check before Ray is touched
    run = TrialRun(config, ToyTask(**task_fields), seed=config.get("seed", 0), device=_trial_device())
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            # on the CPU: the RNG state must stay there; weights and optimizer state follow the model
            run.load_state_dict(torch.load(Path(folder) / "state.pt", map_location="cpu"))
    trial_id = tune.get_context().get_trial_id() or "local"
    while run.epoch < max_epochs:
        _maybe_crash(crash_at, str(config.get("crash_dir", "")), run.epoch + 1, trial_id)
        metrics = run.step()
        if config.get("checkpoint"):
            with tempfile.TemporaryDirectory() as folder:
                torch.save(run.state_dict(), Path(folder) / "state.pt")
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)


def asha_milestones(max_t: int, grace_period: int = 1, reduction_factor: float = 2) -> list[int]:
    """Epochs at which ASHA compares trials (its rungs), as Ray's ``ASHAScheduler`` computes them.

    A trial stops at the first rung where it is not in the top ``1 / reduction_factor`` of the
    trials recorded there so far, or at ``max_t``. With ``max_t=8, grace_period=1,
    reduction_factor=2``: rungs 1, 2, 4, 8.

    Args:
        max_t: the longest a trial may train (epochs), >= 1.
        grace_period: the first rung, between 1 and ``max_t``.
        reduction_factor: how much longer each rung is than the one before, > 1.
    """
    max_t = whole("max_t", max_t, 1, "8")
    grace_period = whole("grace_period", grace_period, 1, "1")
    if grace_period > max_t:
        raise ValueError(f"grace_period must be <= max_t ({max_t}), not {grace_period}; e.g. grace_period=1")
    reduction_factor = real("reduction_factor", reduction_factor, 1.0, open_low=True, example="2")
    # Ray's own formula (floating point included), so that the rungs are exactly the scheduler's.
    n = int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)
    return sorted(int(grace_period * reduction_factor**k) for k in range(n))


def bohb_unavailable_reason() -> str | None:
    """``None`` if Ray Tune's BOHB (``TuneBOHB``) can be built here, else why not.

    TuneBOHB needs the packages ``hpbandster`` and ``ConfigSpace``; it is meant to be used with
    ``HyperBandForBOHB`` as the scheduler.
    """
    bohb = require("ray.tune.search.bohb", "bohb_unavailable_reason")
    try:
        bohb.TuneBOHB(metric="accuracy", mode="max")
    except (AssertionError, ImportError) as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return None
