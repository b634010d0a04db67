"""Hyperparameter tuning for notebook 06: trainables, search spaces, equal-budget studies, Ray on loopback.

What is here, by concern:

* **The task** — :class:`ToyTask` (Gaussian blobs from :func:`~mgpu_helpers.data.make_classification`)
  and :class:`TrialRun`, one trial's training (the MLP of :mod:`~mgpu_helpers.models`, SGD with
  momentum), one epoch per :meth:`TrialRun.step`, checkpointable.
* **Ray Tune** — :func:`train_mlp`, a function trainable of ``config`` that reports every epoch with
  ``ray.tune.report({...})`` (``ray.train.report`` fails inside a Tune function since Ray 2.x's split
  of the Train and Tune APIs); :func:`notes_search_space` (the lecture notes' space in today's API);
  :func:`epoch_progress` (a tqdm bar as a Tune callback); result tables and plots.
* **Ray itself** — :func:`local_ray` (``ray.init`` bound to 127.0.0.1, dashboard off, always shut down)
  and :class:`LocalRayCluster` (a real ``ray start --head`` on 127.0.0.1 that this process owns and
  stops by process id); :func:`ray_listening_addresses` to verify what they listen on.
* **Equal-budget comparisons** — :func:`run_study` / :func:`compare_methods`: grid, random, ASHA,
  TPE (Bayesian) and TPE+ASHA (BOHB-style), each given the same total number of training epochs,
  run in this process with Optuna's samplers and its ASHA pruner so that budgets are exact.

Importing this module does **not** import Ray (about 1.6 s) or Optuna: every function that needs
them imports them when called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .data import make_classification, train_val_split
from .models import MLP

__all__ = [
    "COMPARISON_BATCH_SIZES",
    "DIVERGED_LOSS",
    "LOOPBACK",
    "METHODS",
    "METHOD_COLORS",
    "NOTES_BATCH_SIZES",
    "WIDTHS",
    "Comparison",
    "LocalRayCluster",
    "RayRuntime",
    "SimulatedCrash",
    "StudyTrace",
    "ToyTask",
    "TrialRecord",
    "TrialRun",
    "asha_milestones",
    "bohb_unavailable_reason",
    "build_model",
    "compare_methods",
    "epoch_progress",
    "grid_design",
    "is_loopback",
    "learning_curves",
    "local_ray",
    "method_summary",
    "notes_search_space",
    "optuna_search_space",
    "plot_best_vs_epochs",
    "plot_learning_curves",
    "plot_search_layouts",
    "quiet_logs",
    "ray_environment",
    "ray_listening_addresses",
    "ray_processes",
    "results_table",
    "run_study",
    "train_mlp",
    "train_locally",
]

#: The only address Ray may listen on in this course.
LOOPBACK = "127.0.0.1"
#: Layer widths of the notes' space, ``2 ** np.random.randint(2, 9)``: 4, 8, …, 256.
WIDTHS: tuple[int, ...] = tuple(2**k for k in range(2, 9))
#: The notes' batch sizes (from the PyTorch CIFAR tutorial they follow).
NOTES_BATCH_SIZES: tuple[int, ...] = (2, 4, 8, 16)
#: Batch sizes of the equal-budget study: larger, so that hundreds of epochs fit in seconds.
COMPARISON_BATCH_SIZES: tuple[int, ...] = (16, 32, 64)
#: Learning-rate range of the notes, ``tune.loguniform(1e-4, 1e-1)``.
LR_RANGE: tuple[float, float] = (1e-4, 1e-1)
#: Validation loss reported by a trial whose loss became NaN or infinite (a learning rate too large).
DIVERGED_LOSS = 1e3
#: Search methods that :func:`run_study` knows, in the order plots and tables use.
METHODS: tuple[str, ...] = ("grid", "random", "asha", "tpe", "tpe+asha")


# --------------------------------------------------------------------------------------------------
# The task and one trial's training
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToyTask:
    """A 4-class Gaussian-blob problem small enough to train hundreds of times in seconds.

    With the defaults: 1280 points of 20 features and noise 1.5 (so even the best models stay near
    85 % validation accuracy and hyperparameters matter); 256 train, 1024 validate (a large
    validation set keeps the comparison of configurations from being mostly noise).
    ``label_noise`` replaces that fraction of the *training* labels by random ones (a dirty data
    set); the validation labels stay clean.
    """

    n_samples: int = 1280
    n_features: int = 20
    n_classes: int = 4
    noise: float = 1.5
    val_fraction: float = 0.8
    seed: int = 0
    label_noise: float = 0.0

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(x_train, y_train, x_val, y_val)`` on the CPU; built once per process and cached."""
        return _task_tensors(self)


@functools.lru_cache(maxsize=8)
def _task_tensors(task: ToyTask) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    data = make_classification(
        task.n_samples, task.n_features, task.n_classes, noise=task.noise, seed=task.seed
    )
    train, val = train_val_split(data, task.val_fraction, seed=task.seed)
    x_train, y_train = train[:]
    x_val, y_val = val[:]
    if task.label_noise > 0:
        gen = torch.Generator().manual_seed(task.seed + 7)
        flip = torch.rand(len(y_train), generator=gen) < task.label_noise
        y_train = torch.where(flip, torch.randint(task.n_classes, y_train.shape, generator=gen), y_train)
    return x_train, y_train, x_val, y_val


DEFAULT_TASK = ToyTask()


def build_model(config: Mapping[str, Any], task: ToyTask = DEFAULT_TASK) -> nn.Module:
    """The notes' two-hidden-layer network with widths ``config["l1"]`` and ``config["l2"]``.

    ``Linear(in, l1), ReLU, Linear(l1, l2), ReLU, Linear(l2, classes)``, built from
    :class:`~mgpu_helpers.models.MLP` (one hidden layer of width ``l1`` whose output has ``l2``
    features) plus the last ReLU and the classifier.
    """
    l1, l2 = int(config["l1"]), int(config["l2"])
    if l1 < 1 or l2 < 1:
        raise ValueError(f"layer widths must be positive, got l1={l1}, l2={l2}")
    return nn.Sequential(MLP(task.n_features, l1, l2, depth=1), nn.ReLU(), nn.Linear(l2, task.n_classes))


class TrialRun:
    """One trial: a model, its optimizer and its data order; :meth:`step` trains one epoch.

    The configuration needs ``l1``, ``l2`` (layer widths), ``lr`` and ``batch_size``; the optimizer
    is SGD with momentum 0.9 (so the learning rate matters a lot, as it does in practice). Everything
    random (initial weights, shuffling) comes from ``seed``, so a trial is reproducible, and
    :meth:`state_dict` captures it completely: a run restored from a checkpoint continues exactly as
    an uninterrupted one would (on the same device).

    Args:
        config: the hyperparameters.
        task: the dataset.
        seed: seed of the initial weights and of the shuffling.
        device: where to train (``"cpu"``, ``"cuda"``, …); the data are tiny and moved there once.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        task: ToyTask = DEFAULT_TASK,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        missing = {"l1", "l2", "lr", "batch_size"} - set(config)
        if missing:
            raise KeyError(f"config lacks {sorted(missing)}; got keys {sorted(config)}")
        self.config = dict(config)
        self.task = task
        self.device = torch.device(device)
        self.batch_size = int(config["batch_size"])
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = build_model(config, task).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=float(config["lr"]), momentum=0.9)
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.epoch = 0
        x_train, y_train, x_val, y_val = task.tensors()
        self.x_train, self.y_train = x_train.to(self.device), y_train.to(self.device)
        self.x_val, self.y_val = x_val.to(self.device), y_val.to(self.device)

    def step(self) -> dict[str, float]:
        """Train one epoch, then evaluate on the validation set.

        Returns:
            ``{"epoch", "loss", "accuracy", "train_loss"}``: the validation loss and accuracy after
            this epoch (loss :data:`DIVERGED_LOSS` if it is not finite) and the mean training loss.
        """
        self.model.train()
        order = torch.randperm(len(self.x_train), generator=self.generator).to(self.device)
        total, batches = 0.0, 0
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            loss = nn.functional.cross_entropy(self.model(self.x_train[idx]), self.y_train[idx])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
            batches += 1
        self.epoch += 1
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.x_val)
            val_loss = nn.functional.cross_entropy(logits, self.y_val).item()
            accuracy = (logits.argmax(dim=1) == self.y_val).float().mean().item()
        train_loss = total / batches
        return {
            "epoch": self.epoch,
            "loss": val_loss if math.isfinite(val_loss) else DIVERGED_LOSS,
            "accuracy": accuracy,
            "train_loss": train_loss if math.isfinite(train_loss) else DIVERGED_LOSS,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit: weights, optimizer, shuffling RNG, epoch."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.epoch = int(state["epoch"])


def train_locally(
    config: Mapping[str, Any], epochs: int, task: ToyTask = DEFAULT_TASK, seed: int = 0
) -> list[dict[str, float]]:
    """Train ``config`` for ``epochs`` epochs in this process (no Ray); one metrics dict per epoch."""
    run = TrialRun(config, task, seed=seed)
    return [run.step() for _ in range(epochs)]


# --------------------------------------------------------------------------------------------------
# Ray Tune: search spaces, the trainable, a progress bar, results
# --------------------------------------------------------------------------------------------------


def notes_search_space(batch_sizes: Sequence[int] = NOTES_BATCH_SIZES) -> dict[str, Any]:
    """The lecture notes' search space, unchanged, in today's API (imports Ray).

    ``l1``/``l2``: ``tune.sample_from(lambda _: 2 ** np.random.randint(2, 9))`` (4 … 256);
    ``lr``: ``tune.loguniform(1e-4, 1e-1)``; ``batch_size``: ``tune.choice([2, 4, 8, 16])``.
    ``sample_from`` runs arbitrary Python, which only the default random/grid search can handle;
    use :func:`optuna_search_space` with a search algorithm such as ``OptunaSearch``.
    """
    from ray import tune

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
    from ray import tune

    return {
        "l1": tune.choice(list(WIDTHS)),
        "l2": tune.choice(list(WIDTHS)),
        "lr": tune.loguniform(*LR_RANGE),
        "batch_size": tune.choice(list(batch_sizes)),
    }


class SimulatedCrash(RuntimeError):
    """Raised on purpose by :func:`train_mlp` to show fault tolerance (``config["crash_at"]``)."""


def _maybe_crash(config: Mapping[str, Any], epoch: int, trial_id: str) -> None:
    """Raise :class:`SimulatedCrash` at the epochs listed in ``config["crash_at"]``.

    An epoch listed twice crashes on the first two attempts to train it, and so on; attempts are
    counted with marker files in ``config["crash_dir"]`` because a retried trial is a new process.
    """
    wanted = list(config.get("crash_at", ()))
    if epoch not in wanted:
        return
    folder = Path(config["crash_dir"])
    done = len(list(folder.glob(f"{trial_id}-epoch{epoch}-*")))
    if done < wanted.count(epoch):
        (folder / f"{trial_id}-epoch{epoch}-{done}").touch()
        raise SimulatedCrash(f"simulated crash of trial {trial_id} before epoch {epoch} (attempt {done + 1})")


def _trial_device() -> str:
    """``"cuda"`` when Ray gave this trial a GPU (``ray.get_gpu_ids()``), else ``"cpu"``."""
    import ray

    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


def train_mlp(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: train :class:`TrialRun` and report after every epoch.

    Hyperparameters: ``l1``, ``l2``, ``lr``, ``batch_size``. Options (all optional):
    ``max_epochs`` (default 8), ``seed`` (0), ``task`` (a dict of :class:`ToyTask` fields),
    ``checkpoint`` (False: when true, every report carries a checkpoint and a restarted trial resumes
    from the latest one), ``crash_at`` / ``crash_dir`` (see :class:`SimulatedCrash`).

    Every epoch ends with ``tune.report({"epoch", "loss", "accuracy", "train_loss"})``; Tune adds
    ``training_iteration`` (= epochs trained, the time unit of ASHA) and timing columns.
    """
    from ray import tune

    task = ToyTask(**config.get("task", {}))
    run = TrialRun(config, task, seed=int(config.get("seed", 0)), device=_trial_device())
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            # on the CPU: the RNG state must stay there; weights and optimizer state follow the model
            run.load_state_dict(torch.load(Path(folder) / "state.pt", map_location="cpu"))
    trial_id = tune.get_context().get_trial_id() or "local"
    max_epochs = int(config.get("max_epochs", 8))
    while run.epoch < max_epochs:
        _maybe_crash(config, run.epoch + 1, trial_id)
        metrics = run.step()
        if config.get("checkpoint"):
            with tempfile.TemporaryDirectory() as folder:
                torch.save(run.state_dict(), Path(folder) / "state.pt")
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)


def epoch_progress(total: int | None = None, desc: str = "epochs reported") -> Any:
    """A ``ray.tune.Callback`` that shows a tqdm bar counting reported epochs (``RunConfig(callbacks=…)``).

    Tune's own tables are off in the notebook (``verbose=0``); this bar shows progress instead.
    ``total`` is an upper bound (with ASHA most trials stop early, so the bar ends short of it).
    """
    return _epoch_progress_class()(total, desc)


@functools.lru_cache(maxsize=1)
def _epoch_progress_class() -> type:
    from ray import tune

    class EpochProgress(tune.Callback):
        def __init__(self, total: int | None, desc: str) -> None:
            self.total, self.desc, self.bar, self.epochs = total, desc, None, 0

        def __getstate__(self) -> dict[str, Any]:  # Tune saves callbacks with the run; a bar can't be
            return {**self.__dict__, "bar": None}

        def setup(self, **info: Any) -> None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.desc)

        def on_trial_result(
            self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
        ) -> None:
            self.epochs += 1
            if self.bar is not None:
                self.bar.update(1)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self.bar is not None:
                self.bar.close()

    return EpochProgress


def asha_milestones(max_t: int, grace_period: int = 1, reduction_factor: float = 2) -> list[int]:
    """Epochs at which ASHA compares trials (its rungs), as Ray's ``ASHAScheduler`` computes them.

    A trial stops at the first rung where it is not in the top ``1 / reduction_factor`` of the
    trials recorded there so far, or at ``max_t``. With ``max_t=8, grace_period=1,
    reduction_factor=2``: rungs 1, 2, 4, 8.
    """
    n = int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)
    return sorted(int(grace_period * reduction_factor**k) for k in range(n))


def results_table(results: Any, columns: Sequence[str] = ("loss", "accuracy")) -> Any:
    """A ``ResultGrid`` as a pandas DataFrame: one row per trial, its config and last metrics.

    Columns: the hyperparameters ``l1, l2, lr, batch_size`` (those the configs have), the given
    metric columns, ``epochs`` (``training_iteration``: how long the trial ran) and ``status``. The
    lecture notes' ``CLIReporter(metric_columns=…)`` printed the same table while the run went on.
    """
    import pandas as pd

    rows = []
    for r in results:
        metrics = r.metrics or {}
        row = {k: r.config[k] for k in ("l1", "l2", "lr", "batch_size") if k in r.config}
        row.update({c: metrics.get(c, float("nan")) for c in columns})
        row["epochs"] = int(metrics.get("training_iteration", 0))
        row["status"] = "ERROR" if r.error else "OK"
        rows.append(row)
    ids = [(r.metrics or {}).get("trial_id", str(i)) for i, r in enumerate(results)]
    return pd.DataFrame(rows, index=pd.Index(ids, name="trial"))


def learning_curves(results: Any, metric: str = "accuracy") -> list[tuple[dict[str, Any], list[float]]]:
    """``(config, [metric after epoch 1, 2, …])`` for every trial of a ``ResultGrid``."""
    curves = []
    for r in results:
        df = r.metrics_dataframe
        values = [] if df is None or metric not in df else [float(v) for v in df[metric]]
        curves.append((dict(r.config), values))
    return curves


def plot_learning_curves(
    results: Any,
    metric: str = "accuracy",
    milestones: Sequence[int] | None = None,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """Learning curves of all trials, coloured by the epoch at which the trial stopped.

    With ASHA the stopping epochs are its rungs (``milestones``, drawn as dotted lines): the plot
    shows which trials were cut at the first rung, which at the second, and which ran to the end.
    """
    import matplotlib.pyplot as plt

    curves = learning_curves(results, metric)
    stops = sorted({len(v) for _, v in curves if v})
    scale = sorted(set(milestones or ()) | set(stops))  # same colour for the same rung in every plot
    cmap = plt.get_cmap("viridis", max(len(scale), 2))
    colour = {s: cmap(scale.index(s)) for s in stops}
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6))
    for _, values in curves:
        if values:
            epochs = range(1, len(values) + 1)
            ax.plot(epochs, values, "-o", ms=3, lw=1.2, color=colour[len(values)], alpha=0.85)
    for m in milestones or ():
        ax.axvline(m, color="grey", ls=":", lw=0.8)
    handles = [
        plt.Line2D([], [], color=colour[s], marker="o", ms=3, label=f"stopped after {s}") for s in stops
    ]
    ax.legend(handles=handles, fontsize=8, title="epochs trained", title_fontsize=8, loc="lower right")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation {metric}")
    ax.set_title(title or f"{len(curves)} trials")
    return ax


def bohb_unavailable_reason() -> str | None:
    """``None`` if Ray Tune's BOHB (``TuneBOHB``) can be built here, else why not.

    TuneBOHB needs the packages ``hpbandster`` and ``ConfigSpace``; it is meant to be used with
    ``HyperBandForBOHB`` as the scheduler.
    """
    try:
        from ray.tune.search.bohb import TuneBOHB

        TuneBOHB(metric="accuracy", mode="max")
    except (AssertionError, ImportError) as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


def plot_search_layouts(
    f: Any,
    layouts: Mapping[str, np.ndarray],
    *,
    important: Any | None = None,
    extent: tuple[float, float, float, float] = (0.0, 1.0, 0.0, 1.0),
    labels: tuple[str, str] = ("important parameter", "unimportant parameter"),
    axes: Sequence[Any] | None = None,
) -> list[Any]:
    """Draw point sets over a 2-D objective ``f(x, y)``, one panel each (Bergstra & Bengio's picture).

    Each panel shows ``f`` as a heat map, the points tried, and along the top the 1-D curve of the
    important parameter (``important(x)``, if given) with a tick wherever a point projects onto it:
    a 3 × 3 grid puts only three distinct values there, nine random points put nine.

    Args:
        f: vectorised objective of two arrays.
        layouts: panel title -> points, an array of shape (n, 2).
        important: the 1-D effect of the first parameter, drawn along the top of every panel.
        extent: ``(x_min, x_max, y_min, y_max)`` of the heat map.
        labels: axis labels.
        axes: existing axes, one per layout.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, len(layouts), figsize=(4.2 * len(layouts), 3.9), squeeze=False)
        axes = list(axes[0])
    x0, x1, y0, y1 = extent
    xs, ys = np.meshgrid(np.linspace(x0, x1, 200), np.linspace(y0, y1, 200))
    values = f(xs, ys)
    for ax, (title, pts) in zip(axes, layouts.items(), strict=True):
        pts = np.asarray(pts, dtype=float)
        ax.imshow(values, extent=extent, origin="lower", aspect="auto", cmap="Greens", alpha=0.8)
        ax.scatter(pts[:, 0], pts[:, 1], color="#C44E52", edgecolor="black", zorder=3, s=36)
        if important is not None:
            top = ax.inset_axes((0.0, 1.02, 1.0, 0.22), sharex=ax)
            grid = np.linspace(x0, x1, 200)
            top.plot(grid, important(grid), color="#4C72B0")
            top.vlines(pts[:, 0], *top.get_ylim(), color="#C44E52", lw=1)
            top.axis("off")
        distinct = len(np.unique(np.round(pts[:, 0], 9)))
        ax.set_title(f"{title}: {distinct} distinct values of x", y=1.26, fontsize=10)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
    return list(axes)


# --------------------------------------------------------------------------------------------------
# Ray on loopback: an in-process runtime and a real local cluster
# --------------------------------------------------------------------------------------------------


def ray_environment(auth_token: str | None = None) -> dict[str, str]:
    """Environment variables that keep Ray on this machine and quiet.

    * ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` — Ray reads it when it is imported; on Linux its
      default (1) makes Ray replace ``127.0.0.1`` by the machine's network address, so this is what
      actually keeps every Ray process on loopback;
    * ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` — token authentication on, with a token for this
      session only (Ray's default would write ``~/.ray/auth_token``); a second machine would need it;
    * ``RAY_USAGE_STATS_ENABLED=0`` — no usage reporting (there is no network here anyway).
    """
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": auth_token or secrets.token_hex(32),
    }


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the old values."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _force_loopback_if_ray_imported() -> None:
    """Apply :func:`ray_environment` to a Ray that was imported before it was set.

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` into a module constant and the authentication mode
    and token into a C++ cache when it is imported; refresh both so that this process agrees with the
    Ray processes it is about to start or join.
    """
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and getattr(constants, "ENABLE_RAY_CLUSTER", False):
        constants.ENABLE_RAY_CLUSTER = False
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def is_loopback(ip: str) -> bool:
    """True for 127.0.0.0/8, ``::1`` and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _descendants(root: int | None = None) -> list[Any]:
    import psutil

    try:
        return psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _is_ray_process(proc: Any) -> bool:
    try:
        text = proc.name() + " " + " ".join(proc.cmdline()[:3])
    except Exception:  # gone or not ours to inspect
        return False
    return any(key in text for key in ("ray", "gcs_server", "raylet"))


def ray_processes(root: int | None = None) -> list[Any]:
    """Ray's processes among the descendants of process ``root`` (default: this one), still alive."""
    import psutil

    alive = []
    for p in _descendants(root):
        try:
            if _is_ray_process(p) and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def ray_listening_addresses(root: int | None = None) -> list[tuple[str, int, str]]:
    """``(ip, port, process name)`` of every listening TCP socket of this process and its descendants.

    Use it to check that Ray binds loopback only: ``all(is_loopback(ip) for ip, _, _ in …)``.
    """
    import psutil

    found = []
    me = psutil.Process(root)
    for p in [me, *_descendants(root)]:
        try:
            conns = p.net_connections(kind="inet")
            name = p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(c.laddr.ip, c.laddr.port, name) for c in conns if c.status == psutil.CONN_LISTEN]
    return sorted(set(found))


def _stop_processes(procs: Sequence[Any], grace: float = 5.0) -> None:
    """Terminate the given processes (by pid, which we started), then kill what is left."""
    import psutil

    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                p.terminate()
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    _, still = psutil.wait_procs(alive, timeout=grace)
    for p in still:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(still, timeout=grace)


@dataclasses.dataclass
class RayRuntime:
    """What :func:`local_ray` or :meth:`LocalRayCluster.connect` started or joined."""

    address: str
    node_ip: str
    resources: dict[str, float]
    pids: list[int]
    temp_dir: str


@contextlib.contextmanager
def quiet_logs(level: int = 50) -> Iterator[None]:
    """Raise the level of Ray's and Optuna's loggers inside the block (default: CRITICAL only).

    Use it around runs whose trials fail on purpose, whose tracebacks Tune would otherwise log.
    """
    import logging

    loggers = [logging.getLogger(name) for name in ("ray", "ray.tune", "ray.train", "optuna")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, lvl in zip(loggers, old, strict=True):
            lg.setLevel(lvl)


def _ray_init_kwargs(quiet: bool) -> dict[str, Any]:
    import logging

    return {"log_to_driver": not quiet, "logging_level": logging.WARNING if quiet else logging.INFO}


#: Ray gives its raylet a fixed 30 s to register; on a loaded 2-core machine that can be too short.
STARTUP_ATTEMPTS = 3


def _is_startup_timeout(exc: BaseException) -> bool:
    text = str(exc)
    return "timed out during startup" in text or "Failed to connect to GCS" in text


@contextlib.contextmanager
def local_ray(
    num_cpus: int = 2,
    num_gpus: int | None = None,
    *,
    quiet: bool = True,
    attempts: int = STARTUP_ATTEMPTS,
    **init_kwargs: Any,
) -> Iterator[RayRuntime]:
    """Start Ray inside this process, bound to 127.0.0.1 with the dashboard off; always shut it down.

    ``ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=…)``
    under :func:`ray_environment`. On exit — normal or by an exception, also one raised by
    ``ray.init`` itself — ``ray.shutdown()`` runs and any Ray process this block started that is
    still alive is terminated by its process id. ``quiet`` hides the workers' output. A start that
    times out (Ray allows its raylet 30 s, which a busy 2-core machine can exceed) is cleaned up and
    tried again, up to ``attempts`` times.

    Raises:
        RuntimeError: if Ray is already running in this process (call ``ray.shutdown()`` first), or
            if it did not start in ``attempts`` tries.
    """
    env = ray_environment()
    with _environ(env):
        _force_loopback_if_ray_imported()
        import ray

        if ray.is_initialized():
            raise RuntimeError("Ray is already running in this process; call ray.shutdown() first")
        before = {p.pid for p in _descendants()}
        temp_dir = tempfile.mkdtemp(prefix="mgpu-ray-")
        seen: set[Any] = set()  # every Ray process seen, so that one re-parented after a crash is found too

        def look() -> None:
            seen.update(p for p in _descendants() if p.pid not in before and _is_ray_process(p))

        def cleanup() -> None:
            look()
            try:
                ray.shutdown()
            finally:
                look()
                _stop_processes(list(seen))

        try:
            for attempt in range(1, attempts + 1):
                try:
                    ray.init(
                        address="local",
                        include_dashboard=False,
                        _node_ip_address=LOOPBACK,
                        num_cpus=num_cpus,
                        num_gpus=num_gpus,
                        _temp_dir=temp_dir,
                        **{**_ray_init_kwargs(quiet), **init_kwargs},
                    )
                    break
                except Exception as exc:
                    cleanup()
                    if attempt == attempts or not _is_startup_timeout(exc):
                        raise RuntimeError(
                            f"Ray did not start (attempt {attempt} of {attempts}): {exc}. If the machine "
                            "is busy, close other notebooks and run the cell again."
                        ) from exc
            look()
            started = [p for p in _descendants() if p.pid not in before]
            yield RayRuntime(
                address=ray.get_runtime_context().gcs_address,
                node_ip=ray.util.get_node_ip_address(),
                resources=dict(ray.cluster_resources()),
                pids=[p.pid for p in started],
                temp_dir=temp_dir,
            )
        finally:
            try:
                cleanup()
            finally:
                _remove_tree(temp_dir)


def _remove_tree(path: str) -> None:
    """Delete a Ray temp folder; try again briefly if a process that just exited was still writing."""
    for _ in range(10):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.3)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: deliver SIGTERM to this child when its parent dies (so a killed kernel leaves nothing)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ray_cli() -> list[str]:
    """The ``ray`` command of this Python environment."""
    exe = Path(sys.executable).with_name("ray")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


class LocalRayCluster:
    """A real Ray cluster head on 127.0.0.1, started with ``ray start --head`` and owned by this process.

    ``start()`` runs ``ray start --head --node-ip-address=127.0.0.1 --port=<free port>
    --include-dashboard=false --num-cpus=N --block`` as a child process (``--block`` keeps the
    command alive as the owner of the head's processes); ``connect()`` is
    ``ray.init(address="127.0.0.1:<port>")`` — exactly how a driver joins any cluster — and
    ``status()`` runs ``ray status``. ``stop()`` disconnects and then stops *this* head by its
    process id: plain ``ray stop`` would also kill every other Ray instance of this user on the
    machine (another notebook's, a test's). Works as a context manager too.

    Args:
        num_cpus: CPUs the head offers to trials.
        num_gpus: GPUs it offers (``None``: detect).
        startup_timeout: seconds to wait for "Ray runtime started".
        attempts: how often to try a start that timed out (see :func:`local_ray`).
    """

    def __init__(
        self,
        num_cpus: int = 2,
        num_gpus: int | None = None,
        startup_timeout: float = 180.0,
        attempts: int = STARTUP_ATTEMPTS,
    ) -> None:
        self.num_cpus, self.num_gpus, self.startup_timeout = num_cpus, num_gpus, startup_timeout
        self.attempts = attempts
        self.port: int | None = None
        self.env = ray_environment()
        self.temp_dir = ""  # made by start(): Ray's logs and sockets, removed by stop()
        self.process: subprocess.Popen[bytes] | None = None
        self.tracked: list[Any] = []
        self._ready = False
        self._attempt = 0
        self._deadline = 0.0
        self._restore_env: contextlib.ExitStack | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` of the head's GCS, the address drivers and other nodes use."""
        if self.port is None:
            raise RuntimeError("the cluster is not started: call start() first")
        return f"{LOOPBACK}:{self.port}"

    def start_command(self) -> list[str]:
        """The ``ray start --head …`` command line (as run; without ``--block`` it returns at once)."""
        port = self.port if self.port is not None else "<port>"
        cmd = [
            "ray",
            "start",
            "--head",
            f"--node-ip-address={LOOPBACK}",
            f"--port={port}",
            "--include-dashboard=false",
            f"--num-cpus={self.num_cpus}",
        ]
        if self.num_gpus is not None:
            cmd.append(f"--num-gpus={self.num_gpus}")
        return [*cmd, f"--temp-dir={self.temp_dir or '<temp-dir>'}", "--disable-usage-stats", "--block"]

    def start(self, wait: bool = True) -> LocalRayCluster:
        """Run ``ray start --head``; with ``wait`` (the default) block until it is up (see :meth:`wait`).

        ``start(wait=False)`` returns at once, so the head can boot while other work runs;
        :meth:`connect` waits for it.
        """
        if self.process is not None:
            raise RuntimeError("this cluster was started already")
        self.temp_dir = tempfile.mkdtemp(prefix="mgpu-rayc-")
        self._attempt = 1
        self._launch()
        return self.wait() if wait else self

    def wait(self) -> LocalRayCluster:
        """Block until the head is up, retrying a start that timed out (up to ``attempts`` times).

        Raises:
            RuntimeError: with the end of ``ray start``'s output, after stopping everything this
                object started, if the head exited or did not come up.
        """
        if self.process is None:
            raise RuntimeError("the cluster is not started: call start() first")
        while not self._ready:
            why = self._wait_once()
            if why is None:
                self._ready = True
                self.tracked = list(_descendants(self.process.pid))
                break
            tail = "\n".join(self.log().splitlines()[-15:])
            self._stop_head()
            if self._attempt >= self.attempts or "timed out" not in tail:
                self.stop()
                raise RuntimeError(
                    f"`ray start --head` {why} (attempt {self._attempt}); its last output:\n{tail}"
                )
            self._attempt += 1
            self._launch()
        return self

    def _launch(self) -> None:
        self.port = _free_port()
        self._deadline = time.monotonic() + self.startup_timeout
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                _ray_cli() + self.start_command()[1:],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )

    def _wait_once(self) -> str | None:
        """Wait for the running ``ray start``; ``None`` when it is up, else what went wrong."""
        assert self.process is not None
        while "Ray runtime started" not in self.log():
            if self.process.poll() is not None:
                return f"exited with code {self.process.returncode}"
            if time.monotonic() > self._deadline:
                return f"did not start within {self.startup_timeout:.0f} s"
            time.sleep(0.2)
        return None

    @property
    def log_path(self) -> Path:
        """Where ``ray start``'s output goes (inside :attr:`temp_dir`)."""
        return Path(self.temp_dir) / "ray-start.log"

    def log(self) -> str:
        """What ``ray start`` printed so far."""
        return self.log_path.read_text(errors="replace") if self.temp_dir and self.log_path.exists() else ""

    def connect(self, quiet: bool = True) -> RayRuntime:
        """``ray.init(address=self.address)`` in this process, with this cluster's environment."""
        self.wait()
        stack = contextlib.ExitStack()
        stack.enter_context(_environ(self.env))
        _force_loopback_if_ray_imported()
        import ray

        if ray.is_initialized():
            stack.close()
            raise RuntimeError("Ray is already running in this process; call ray.shutdown() first")
        try:
            ray.init(address=self.address, **_ray_init_kwargs(quiet))
        except BaseException:
            stack.close()
            raise
        self._restore_env = stack
        self.tracked += [p for p in _descendants(self.process.pid) if p not in self.tracked]
        return RayRuntime(
            address=self.address,
            node_ip=ray.util.get_node_ip_address(),
            resources=dict(ray.cluster_resources()),
            pids=[p.pid for p in self.tracked],
            temp_dir=self.temp_dir,
        )

    def status(self, timeout: float = 120.0) -> str:
        """Output of ``ray status --address=127.0.0.1:<port>`` (nodes, resources in use, demands)."""
        self.wait()
        res = subprocess.run(
            [*_ray_cli(), "status", f"--address={self.address}"],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            timeout=timeout,
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"ray status failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
            )
        return res.stdout

    def second_machine_commands(self, head_ip: str = "<head-ip>") -> list[str]:
        """What to type to grow this into a two-machine cluster (on a network, not on loopback)."""
        port = self.port or 6379
        return [
            f"# on the head machine (its address on the network, e.g. {head_ip}):",
            "export RAY_AUTH_TOKEN=<secret>   # one token for every node: `ray get-auth-token --generate`",
            f"ray start --head --node-ip-address={head_ip} --port={port} --include-dashboard=false",
            "# on the second machine (same Python, same Ray and torch versions):",
            "export RAY_AUTH_TOKEN=<secret>",
            f"ray start --address={head_ip}:{port}",
            "# anywhere in the cluster:",
            f"ray status --address={head_ip}:{port}",
            f"python -c \"import ray; ray.init(address='{head_ip}:{port}')\"  # then Tuner(...).fit()",
            "# when done, on every machine:",
            "ray stop",
        ]

    def stop(self, grace: float = 30.0) -> None:
        """Disconnect (``ray.shutdown()``), stop this head by its process id, and wait until it is gone."""
        if self._restore_env is not None:
            import ray

            try:
                ray.shutdown()
            finally:
                self._restore_env.close()
                self._restore_env = None
        self._stop_head(grace)
        if self.temp_dir:
            _remove_tree(self.temp_dir)

    def _stop_head(self, grace: float = 30.0) -> None:
        """SIGTERM to ``ray start --block`` (it then stops its node), then any leftover by pid."""
        if self.process is None:
            return
        self.tracked += [p for p in _descendants(self.process.pid) if p not in self.tracked]
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=grace)
        _stop_processes(self.tracked, grace=5.0)
        self.tracked = []
        self._ready = False

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------
# Equal-budget studies (in this process, with Optuna's samplers and its ASHA pruner)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrialRecord:
    """One trial of a study: its config and the validation accuracy after each epoch it trained."""

    number: int
    config: dict[str, Any]
    accuracies: list[float]
    pruned: bool = False
    truncated: bool = False  # stopped because the study's budget ran out

    @property
    def epochs(self) -> int:
        return len(self.accuracies)


@dataclasses.dataclass
class StudyTrace:
    """What one search method found, epoch by epoch, under a budget of ``budget`` training epochs."""

    method: str
    seed: int
    budget: int
    max_t: int
    trials: list[TrialRecord]
    best_curve: list[float]  # best validation accuracy seen after 1, 2, … epochs spent
    wall_s: float

    @property
    def spent(self) -> int:
        """Epochs actually trained (the budget, or less if a grid ran out of points)."""
        return len(self.best_curve)

    @property
    def best(self) -> float:
        return self.best_curve[-1] if self.best_curve else float("nan")

    def best_after(self, epochs: int) -> float:
        """Best accuracy found within the first ``epochs`` epochs of the budget."""
        if not self.best_curve or epochs < 1:
            return float("nan")
        return self.best_curve[min(epochs, len(self.best_curve)) - 1]

    def epochs_to(self, target: float) -> int | None:
        """Epochs spent until the best accuracy first reached ``target``; ``None`` if it never did."""
        for i, value in enumerate(self.best_curve, start=1):
            if value >= target:
                return i
        return None


def grid_design(n_points: int, batch_size: int = 32) -> list[dict[str, Any]]:
    """A log-scale grid of at most ``n_points`` configs over learning rate × width.

    ``n_w = floor(sqrt(n))`` widths and ``n // n_w`` learning rates (the learning rate gets the extra
    points: it matters most), each at the centres of equal cells of the log-scaled range, so the
    grid covers the box evenly; ``l1 = l2`` = width and the batch size is fixed.
    """
    if n_points < 1:
        raise ValueError(f"a grid needs at least one point, got {n_points}")
    n_w = max(1, int(math.isqrt(n_points)))
    n_lr = max(1, n_points // n_w)
    lo, hi = math.log10(LR_RANGE[0]), math.log10(LR_RANGE[1])
    lrs = [10 ** (lo + (hi - lo) * (i + 0.5) / n_lr) for i in range(n_lr)]
    e_lo, e_hi = 2, 8  # widths 2**2 .. 2**8
    widths = sorted({2 ** round(e_lo + (e_hi - e_lo) * (i + 0.5) / n_w) for i in range(n_w)})
    return [{"l1": w, "l2": w, "lr": lr, "batch_size": batch_size} for lr in lrs for w in widths]


def _suggest(trial: Any, batch_sizes: Sequence[int]) -> dict[str, Any]:
    return {
        "l1": trial.suggest_categorical("l1", list(WIDTHS)),
        "l2": trial.suggest_categorical("l2", list(WIDTHS)),
        "lr": trial.suggest_float("lr", *LR_RANGE, log=True),
        "batch_size": trial.suggest_categorical("batch_size", list(batch_sizes)),
    }


def run_study(
    method: str,
    *,
    budget: int,
    seed: int = 0,
    max_t: int = 8,
    reduction_factor: int = 2,
    task: ToyTask = DEFAULT_TASK,
    batch_sizes: Sequence[int] = COMPARISON_BATCH_SIZES,
) -> StudyTrace:
    """Run one search ``method`` until ``budget`` training epochs are spent; return its trace.

    Methods (all through Optuna, in this process, one trial at a time):

    * ``"grid"`` — :func:`grid_design` with ``budget // max_t`` points, visited in random order
      (``GridSampler``), each trained ``max_t`` epochs;
    * ``"random"`` — ``RandomSampler``, each trial ``max_t`` epochs;
    * ``"asha"`` — random configs, stopped early by ``SuccessiveHalvingPruner`` (asynchronous
      successive halving, the algorithm of Ray's ``ASHAScheduler``) at rungs 1, rf, rf², … epochs;
    * ``"tpe"`` — ``TPESampler`` (Bayesian: a density model of good vs bad configs), full trials;
      its first ``max(2, n // 3)`` trials are random, ``n = budget // max_t``;
    * ``"tpe+asha"`` — TPE proposals with ASHA stopping: the idea of BOHB.

    Every epoch of every trial costs one unit; when the budget is used up the running trial stops
    (it is ``truncated``) and so does the study. ``seed`` drives the sampler and each trial's
    initial weights and data order.
    """
    import optuna

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    if budget < 1 or max_t < 1:
        raise ValueError(f"budget and max_t must be >= 1 (got {budget}, {max_t})")
    n_full = max(1, budget // max_t)
    pruner: Any = optuna.pruners.NopPruner()
    if method.endswith("asha"):
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=1, reduction_factor=reduction_factor, min_early_stopping_rate=0
        )
    grid = grid_design(n_full, batch_size=sorted(batch_sizes)[len(batch_sizes) // 2])
    if method == "grid":
        sampler: Any = optuna.samplers.GridSampler({"point": list(range(len(grid)))}, seed=seed)
    elif method.startswith("tpe"):
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, n_full // 3))
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)

    trials: list[TrialRecord] = []
    best_curve: list[float] = []

    def objective(trial: Any) -> float:
        if method == "grid":
            config = dict(grid[trial.suggest_categorical("point", list(range(len(grid))))])
        else:
            config = _suggest(trial, batch_sizes)
        record = TrialRecord(trial.number, config, [])
        trials.append(record)
        run = TrialRun(config, task, seed=seed * 10_000 + trial.number)
        for epoch in range(1, max_t + 1):
            if len(best_curve) >= budget:
                record.truncated = True
                trial.study.stop()
                break
            acc = run.step()["accuracy"]
            record.accuracies.append(acc)
            best_curve.append(max(acc, best_curve[-1]) if best_curve else acc)
            trial.report(acc, epoch)
            if epoch < max_t and trial.should_prune():
                record.pruned = True
                raise optuna.TrialPruned()
        if len(best_curve) >= budget:
            trial.study.stop()
        return record.accuracies[-1] if record.accuracies else 0.0

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    try:
        study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
        study.optimize(objective, n_trials=None if method != "grid" else len(grid), gc_after_trial=False)
    finally:
        optuna.logging.set_verbosity(level)
    trials = [t for t in trials if t.accuracies]
    return StudyTrace(method, seed, budget, max_t, trials, best_curve, time.perf_counter() - start)


@dataclasses.dataclass
class Comparison:
    """Several methods × seeds under one budget; the numbers behind the equal-budget plot and table."""

    traces: list[StudyTrace]

    @property
    def methods(self) -> list[str]:
        return [m for m in METHODS if any(t.method == m for t in self.traces)]

    @property
    def reference(self) -> float:
        """The best validation accuracy any method found with any seed: the yardstick."""
        return max(t.best for t in self.traces)

    def traces_of(self, method: str) -> list[StudyTrace]:
        return [t for t in self.traces if t.method == method]

    def epochs_to_target(self, method: str, tolerance: float = 0.01) -> list[int | None]:
        """Per seed: epochs until ``method`` came within ``tolerance`` (absolute) of :attr:`reference`."""
        target = self.reference - tolerance
        return [t.epochs_to(target) for t in self.traces_of(method)]

    def mean_epochs_to_target(self, method: str, tolerance: float = 0.01) -> tuple[float, int]:
        """``(mean epochs, seeds that reached it)``; a seed that never got there counts as the budget
        (so the mean is a lower bound whenever fewer than all seeds reached the target)."""
        values = self.epochs_to_target(method, tolerance)
        censored = [
            v if v is not None else t.budget for v, t in zip(values, self.traces_of(method), strict=True)
        ]
        return float(np.mean(censored)), sum(v is not None for v in values)

    def table(self, tolerance: float = 0.01) -> list[dict[str, Any]]:
        """One row per method: trials tried, best accuracy, epochs to within ``tolerance`` of the best."""
        rows = []
        for m in self.methods:
            traces = self.traces_of(m)
            mean, reached = self.mean_epochs_to_target(m, tolerance)
            rows.append(
                {
                    "method": m,
                    "seeds": len(traces),
                    "epochs spent": int(np.mean([t.spent for t in traces])),
                    "trials tried": float(np.mean([len(t.trials) for t in traces])),
                    "best acc (mean)": float(np.mean([t.best for t in traces])),
                    "best acc (worst seed)": float(min(t.best for t in traces)),
                    f"epochs to best-{tolerance:.0%}": mean,
                    "seeds reaching it": f"{reached}/{len(traces)}",
                }
            )
        return rows


def compare_methods(
    methods: Sequence[str] = METHODS,
    *,
    budget: int,
    seeds: Sequence[int] = (0, 1, 2),
    max_t: int = 8,
    reduction_factor: int = 2,
    task: ToyTask = DEFAULT_TASK,
    batch_sizes: Sequence[int] = COMPARISON_BATCH_SIZES,
    progress: bool = True,
) -> Comparison:
    """:func:`run_study` for every method and seed (same budget for all); a tqdm bar over the runs."""
    from tqdm.auto import tqdm

    jobs = [(m, s) for s in seeds for m in methods]
    traces = []
    for m, s in tqdm(jobs, desc="studies", disable=not progress):
        traces.append(
            run_study(
                m,
                budget=budget,
                seed=s,
                max_t=max_t,
                reduction_factor=reduction_factor,
                task=task,
                batch_sizes=batch_sizes,
            )
        )
    return Comparison(traces)


#: One colour per method, the same in every plot of notebook 06.
METHOD_COLORS: dict[str, str] = {
    "grid": "#8C8C8C",
    "random": "#4C72B0",
    "asha": "#DD8452",
    "tpe": "#55A868",
    "tpe+asha": "#C44E52",
}


def plot_best_vs_epochs(comparison: Comparison, tolerance: float = 0.01, axes: Any = None) -> Any:
    """Best validation accuracy found vs epochs spent: mean over seeds (line) and min–max (band).

    Two panels: the whole budget, and a zoom on the top (where "within ``tolerance`` of the best",
    the dashed line, is decided). Returns the two axes.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    target = comparison.reference - tolerance
    for ax in axes:
        for m in comparison.methods:
            traces = comparison.traces_of(m)
            xs = np.arange(1, max(t.budget for t in traces) + 1)
            ys = np.array([[t.best_after(int(x)) for x in xs] for t in traces])
            ax.plot(xs, ys.mean(axis=0), color=METHOD_COLORS[m], label=m, lw=1.8)
            ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=METHOD_COLORS[m], alpha=0.12)
        ax.axhline(target, color="black", ls="--", lw=0.8, label=f"best − {tolerance:.0%}")
        ax.set_xlabel("training epochs spent (the budget)")
    seeds = len({t.seed for t in comparison.traces})
    axes[0].set_ylabel("best validation accuracy so far")
    axes[0].set_title(f"Equal budgets: mean of {seeds} seeds (line), min–max (band)")
    axes[1].set_ylim(target - 0.06, comparison.reference + 0.005)
    axes[1].set_title("zoom on the top")
    axes[1].legend(fontsize=8, loc="lower right")
    return axes


def method_summary(comparison: Comparison, tolerance: float = 0.01) -> str:
    """The :meth:`Comparison.table` as aligned text."""
    rows = comparison.table(tolerance)
    if not rows:
        return "(no studies)"
    keys = list(rows[0])
    cells = [[_fmt(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1.5 else f"{value:.1f}"
    return str(value)
