"""Used by notebook 03 (data parallelism). How fast a ``DataLoader`` delivers batches, per ``num_workers``.

Several GPUs eat batches several times as fast as one, so the loader must keep up. The usual advice
(also in the lecture notes) is ``num_workers = 4 × number of GPUs`` and ``pin_memory=True``. Whether
that helps depends on what loading an item costs: *waiting* (storage, network) overlaps across worker
processes almost without limit, *computing* (decoding, augmentation) only up to the number of CPU
cores. :class:`SlowDataset` has both costs, separately adjustable, and :func:`sweep_loaders` measures
the throughput for each setting.

``pin_memory=True`` puts batches in page-locked host memory, from which copies to a GPU are faster and
can overlap with compute (``.to(device, non_blocking=True)``); without a GPU it does nothing, so the
sweep only tries it when CUDA is available (and refuses it otherwise).

The dataset lives in this package rather than in a notebook because worker processes must be able to
import it: with the ``spawn`` start method (macOS, Windows) a class defined in a notebook cannot be
sent to the workers.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .._checks import whole

__all__ = [
    "LoaderResult",
    "SlowDataset",
    "format_sweep",
    "measure_loader",
    "plot_sweep",
    "rule_of_thumb_workers",
    "sweep_loaders",
]


def _check_ms(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not value >= 0:
        raise ValueError(f"{name} must be a number of milliseconds >= 0, not {value!r}")
    return float(value)


class SlowDataset(Dataset):
    """Small images whose loading costs time: a simulated wait plus real CPU work per item.

    Each ``__getitem__`` sleeps ``io_ms`` milliseconds (a stand-in for reading from disk or network:
    *simulated* latency) and then does real work on the CPU: converts the stored uint8 image to float,
    normalises it, flips it at random and blurs it ``cpu_passes`` times (a stand-in for decoding and
    augmentation). Items are ``(float32 image (channels, size, size), int64 label)``; the same index
    always gives the same item.

    Args:
        n_items: number of items (>= 1).
        image_size: height and width in pixels (>= 1).
        channels: number of channels (>= 1).
        io_ms: simulated waiting time per item, in milliseconds (>= 0).
        cpu_passes: number of blur passes per item (real CPU work; 0 for none).
        seed: seed of the stored images and labels.
    """

    def __init__(
        self,
        n_items: int = 512,
        image_size: int = 32,
        channels: int = 3,
        *,
        io_ms: float = 2.0,
        cpu_passes: int = 0,
        seed: int = 0,
    ) -> None:
        whole("n_items", n_items, 1)
        whole("image_size", image_size, 1)
        whole("channels", channels, 1)
        io_ms = _check_ms(io_ms, "io_ms")
        whole("cpu_passes", cpu_passes, 0)
        whole("seed", seed, 0)
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n_items, channels, image_size, image_size), generator=gen).to(
            torch.uint8
        )
        self.labels = torch.randint(0, 10, (n_items,), generator=gen)
        self.io_ms, self.cpu_passes, self.seed = io_ms, cpu_passes, seed

    def __len__(self) -> int:
        """Number of items."""
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        """Item ``index`` after the simulated wait and the real decoding work."""
        if self.io_ms:
            time.sleep(self.io_ms / 1000)
        x = self.images[index].float().div_(255).sub_(0.5).div_(0.25)
        if (index * 2654435761 + self.seed) % 2:  # a deterministic "random" horizontal flip
            x = x.flip(-1)
        for _ in range(self.cpu_passes):  # small element-wise ops: single-threaded, like per-item decoding
            x = (x + x.roll(1, -1) + x.roll(1, -2)) / 3
        return x, self.labels[index]


@dataclass(frozen=True)
class LoaderResult:
    """Throughput of one loader setting.

    ``startup_s`` is the time until the first batch arrived (worker processes starting, first items);
    ``samples_per_s`` counts the batches after the first, so it is the steady rate.
    """

    num_workers: int
    pin_memory: bool
    batches: int
    samples: int
    startup_s: float
    steady_s: float

    def __post_init__(self) -> None:
        for name in ("num_workers", "batches", "samples"):
            whole(name, getattr(self, name), 0)
        if not isinstance(self.pin_memory, bool):
            raise TypeError(f"pin_memory must be True or False, not {self.pin_memory!r}")
        for name in ("startup_s", "steady_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")

    @property
    def samples_per_s(self) -> float:
        """Items per second after the first batch."""
        return (self.samples / self.steady_s) if self.steady_s > 0 else float("inf")


def _check_loader_args(dataset: Any, batch_size: Any, n_batches: Any, device: Any) -> torch.device | None:
    if not isinstance(dataset, Dataset) or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"dataset must be a torch Dataset with a length, such as SlowDataset(), not {dataset!r:.60}"
        )
    whole("batch_size", batch_size, 1)
    whole("n_batches", n_batches, 1, hint=" (batches timed after the warm-up batch)")
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device must be None, a string such as 'cuda' or a torch.device, not {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{device!r} is not a device: use 'cpu', 'cuda' or 'cuda:0'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} needs a GPU and none is visible: use device=None or 'cpu'")
    return dev


def measure_loader(
    dataset: Dataset,
    *,
    batch_size: int = 32,
    num_workers: int = 0,
    pin_memory: bool = False,
    n_batches: int = 8,
    device: str | torch.device | None = None,
) -> LoaderResult:
    """Load ``n_batches`` batches (plus one to warm up) and time them; workers are shut down after.

    Only the first ``(n_batches + 1) * batch_size`` items are read. With ``device``, every batch is
    also copied there (``non_blocking=True``, which overlaps only from pinned memory) and the device is
    synchronised before the clock stops, so the copy is part of the measurement.
    """
    dev = _check_loader_args(dataset, batch_size, n_batches, device)
    whole("num_workers", num_workers, 0, hint=" (0 loads in the main process)")
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory must be True or False, not {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs a GPU (page-locked memory is for host-to-GPU copies)")
    needed = (n_batches + 1) * batch_size
    if len(dataset) < needed:  # type: ignore[arg-type]
        raise ValueError(
            f"the dataset has {len(dataset)} items but {n_batches} + 1 batches of {batch_size} need "  # type: ignore[arg-type]
            f"{needed}: use fewer batches or a larger dataset"
        )
    subset = torch.utils.data.Subset(dataset, range(needed))
    with warnings.catch_warnings():  # more workers than cores is the point of some sweeps: no warning
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = DataLoader(subset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory)
        iterator = iter(loader)
    start = time.perf_counter()
    first = start
    samples = 0
    batches = 0
    for i, (xb, _yb) in enumerate(iterator):  # the loop runs to the end, so workers exit cleanly
        if dev is not None:
            xb = xb.to(dev, non_blocking=True)
        if i == 0:
            _sync(dev)
            first = time.perf_counter()
            continue
        samples += len(xb)
        batches += 1
    _sync(dev)
    end = time.perf_counter()
    return LoaderResult(num_workers, pin_memory, batches, samples, first - start, end - first)


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def sweep_loaders(
    dataset: Dataset,
    *,
    workers: Sequence[int] = (0, 1, 2, 4),
    pin_memory: Sequence[bool] | None = None,
    batch_size: int = 32,
    n_batches: int = 8,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> list[LoaderResult]:
    """:func:`measure_loader` for every ``num_workers`` × ``pin_memory`` combination.

    ``pin_memory`` defaults to ``(False, True)`` when CUDA is available and ``(False,)`` otherwise
    (pinning needs a GPU). ``device`` defaults to ``cuda`` when available, so the copy is measured too.
    """
    has_cuda = torch.cuda.is_available()
    _check_loader_args(dataset, batch_size, n_batches, device)
    if isinstance(workers, str) or not isinstance(workers, Sequence) or not workers:
        raise ValueError(
            f"workers must be a non-empty list of num_workers values such as (0, 2, 4), not {workers!r}"
        )
    for w in workers:
        whole("every num_workers in workers", w, 0)
    pins = tuple(pin_memory) if pin_memory is not None else ((False, True) if has_cuda else (False,))
    if not pins or not all(isinstance(p, bool) for p in pins):
        raise ValueError(
            f"pin_memory must be a non-empty list of True/False, such as (False, True), not {pins!r}"
        )
    if any(pins) and not has_cuda:
        raise ValueError("pin_memory=True needs a GPU (page-locked memory is for host-to-GPU copies)")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, not {progress!r}")
    if device is None and has_cuda:
        device = "cuda"
    combos: Any = [(w, p) for p in dict.fromkeys(pins) for w in dict.fromkeys(workers)]
    if progress:
        from tqdm.auto import tqdm

        combos = tqdm(combos, desc="loader settings", leave=False)
    return [
        measure_loader(
            dataset, batch_size=batch_size, num_workers=w, pin_memory=p, n_batches=n_batches, device=device
        )
        for w, p in combos
    ]


def rule_of_thumb_workers(n_gpus: int) -> int:
    """The lecture notes' rule of thumb: ``num_workers = 4 × GPUs`` (4 for a CPU-only machine)."""
    whole("n_gpus", n_gpus, 0, hint=" (e.g. torch.cuda.device_count())")
    return 4 * max(1, n_gpus)


def _check_results(results: Any, what: str) -> list[LoaderResult]:
    if isinstance(results, str) or not isinstance(results, Sequence) or not results:
        raise TypeError(
            f"{what} must be a non-empty list of LoaderResult (from sweep_loaders), not {results!r:.60}"
        )
    if not all(isinstance(r, LoaderResult) for r in results):
        raise TypeError(f"{what} must hold only LoaderResult objects (from sweep_loaders / measure_loader)")
    return list(results)


def format_sweep(results: Sequence[LoaderResult]) -> str:
    """A text table of a sweep: workers, pin_memory, start-up time, steady samples per second."""
    results = _check_results(results, "results")
    lines = [f"{'num_workers':>11}  {'pin_memory':>10}  {'first batch':>11}  {'samples/s':>10}"]
    for r in results:
        lines.append(
            f"{r.num_workers:>11}  {str(r.pin_memory):>10}  {r.startup_s * 1e3:>8.0f} ms  "
            f"{r.samples_per_s:>10,.0f}"
        )
    return "\n".join(lines)


def plot_sweep(
    sweeps: Mapping[str, Sequence[LoaderResult]],
    *,
    ax: Any = None,
    title: str | None = None,
    note: str | None = None,
) -> Any:
    """Steady samples/s against ``num_workers``, one line per (sweep, pin_memory). Returns the axes.

    ``sweeps`` maps a name to the results of one :func:`sweep_loaders` call.
    """
    if not isinstance(sweeps, Mapping) or not sweeps:
        raise TypeError(
            f"sweeps must be a non-empty dict {{name: sweep_loaders(...) results}}, not {sweeps!r:.60}"
        )
    for name, results in sweeps.items():
        _check_results(results, f"sweeps[{name!r}]")
    if ax is not None and not hasattr(ax, "plot"):
        raise TypeError(f"ax must be a matplotlib Axes or None, not {type(ax).__name__}")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    for name, results in sweeps.items():
        for pin in sorted({r.pin_memory for r in results}):
            rows = sorted((r for r in results if r.pin_memory == pin), key=lambda r: r.num_workers)
            label = name + (" + pin_memory" if pin else "")
            ax.plot([r.num_workers for r in rows], [r.samples_per_s for r in rows], "o-", label=label)
    ax.set_xlabel("num_workers")
    ax.set_xticks(sorted({r.num_workers for results in sweeps.values() for r in results}))
    ax.set_ylabel("samples / s (steady)")
    ax.set_title(title or "DataLoader throughput", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    ax.legend(fontsize=8)
    ax.set_ylim(bottom=0)
    return ax
