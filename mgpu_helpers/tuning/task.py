"""Used by notebooks 06a (sections 1, 3, 4) and 06b (the trainable, section 3): the toy task and one trial.

:class:`ToyTask` (Gaussian blobs from :func:`~mgpu_helpers.data.make_classification`),
:func:`build_model` (the lecture notes' two-hidden-layer network), :class:`TrialRun` (one trial's
training, one epoch per :meth:`~TrialRun.step`, checkpointable bit for bit) and
:func:`train_locally`. No Ray here: Ray Tune's trainable in :mod:`.trainables` wraps
:class:`TrialRun`, and the equal-budget studies in :mod:`.studies` call it directly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import real, whole
from ..data import make_classification, train_val_split
from ..models import MLP

#: Layer widths of the notes' space, ``2 ** np.random.randint(2, 9)``: 4, 8, …, 256.
WIDTHS: tuple[int, ...] = tuple(2**k for k in range(2, 9))
#: Learning-rate range of the notes, ``tune.loguniform(1e-4, 1e-1)``.
LR_RANGE: tuple[float, float] = (1e-4, 1e-1)
#: Validation loss reported by a trial whose loss became NaN or infinite (a learning rate too large).
DIVERGED_LOSS = 1e3
#: The keys every trial configuration needs.
_CONFIG_KEYS = ("l1", "l2", "lr", "batch_size")
_EXAMPLE = '{"l1": 64, "l2": 32, "lr": 0.01, "batch_size": 16}'


@dataclasses.dataclass(frozen=True)
class ToyTask:
    """A Gaussian-blob problem small enough to train hundreds of times in seconds.

    With the defaults: 1280 points of 20 features in 4 classes with noise 1.5 (so even the best
    models stay near 85 % validation accuracy and hyperparameters matter); 256 train, 1024 validate
    (a large validation set keeps the comparison of configurations from being mostly noise).
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

    def __post_init__(self) -> None:
        n = whole("ToyTask n_samples", self.n_samples, 4, "1280")
        whole("ToyTask n_features", self.n_features, 1, "20")
        whole("ToyTask n_classes", self.n_classes, 2, "4")
        whole("ToyTask seed", self.seed, 0, "0")
        real("ToyTask noise", self.noise, 0.0, example="1.5")
        real("ToyTask label_noise", self.label_noise, 0.0, 1.0, example="0.3")
        fraction = real("ToyTask val_fraction", self.val_fraction, 0.0, 1.0, open_low=True, example="0.8")
        if not 0 < round(n * fraction) < n:
            raise ValueError(
                f"ToyTask val_fraction={fraction} of n_samples={n} leaves an empty training or validation "
                "set; use a fraction strictly between 0 and 1 such as 0.8, or more samples"
            )

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


def _task(task: Any) -> ToyTask:
    if not isinstance(task, ToyTask):
        raise TypeError(f"task must be a ToyTask (e.g. ToyTask() or ToyTask(label_noise=0.3)), not {task!r}")
    return task


def _config(config: Any, keys: tuple[str, ...] = _CONFIG_KEYS) -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict such as {_EXAMPLE}, not {type(config).__name__}")
    missing = [k for k in keys if k not in config]
    if missing:
        raise ValueError(f"config lacks {missing}; pass a dict with {list(keys)}, e.g. {_EXAMPLE}")
    for key in ("l1", "l2"):
        if key in keys:
            whole(f'config["{key}"] (a layer width)', config[key], 1, "64")
    if "batch_size" in keys:
        whole('config["batch_size"]', config["batch_size"], 1, "16")
    if "lr" in keys:
        real('config["lr"] (the learning rate)', config["lr"], 0.0, open_low=True, example="0.01")
    return config


def build_model(config: Mapping[str, Any], task: ToyTask = DEFAULT_TASK) -> nn.Module:
    """The notes' two-hidden-layer network with widths ``config["l1"]`` and ``config["l2"]``.

    ``Linear(in, l1), ReLU, Linear(l1, l2), ReLU, Linear(l2, classes)``, built from
    :class:`~mgpu_helpers.models.MLP` (one hidden layer of width ``l1`` whose output has ``l2``
    features) plus the last ReLU and the classifier.
    """
    config, task = _config(config, ("l1", "l2")), _task(task)
    l1, l2 = int(config["l1"]), int(config["l2"])
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
        config, task = _config(config), _task(task)
        seed = whole("seed", seed, 0, "0")
        if not isinstance(device, str | torch.device):
            raise TypeError(f"device must be a string such as 'cpu' or 'cuda', not {device!r}")
        self.config = dict(config)
        self.task = task
        self.device = torch.device(device)
        self.batch_size = int(config["batch_size"])
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
        """Restore a :meth:`state_dict` (a dict with ``model``, ``optimizer``, ``generator``, ``epoch``)."""
        if not isinstance(state, Mapping) or not {"model", "optimizer", "generator", "epoch"} <= set(state):
            raise ValueError("state must be a dict made by TrialRun.state_dict() (model, optimizer, ...)")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.epoch = whole("state['epoch']", state["epoch"], 0)


def train_locally(
    config: Mapping[str, Any], epochs: int, task: ToyTask = DEFAULT_TASK, seed: int = 0
) -> list[dict[str, float]]:
    """Train ``config`` for ``epochs`` (>= 1) epochs in this process (no Ray); one metrics dict per epoch."""
    epochs = whole("epochs", epochs, 1, "8")
    run = TrialRun(config, task, seed=seed)
    return [run.step() for _ in range(epochs)]
