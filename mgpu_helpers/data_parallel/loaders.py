"""Used by notebook 03b (its loader section, and the grader of exercise 03b.2): a ``Dataset`` whose items
cost a known, adjustable time to load.

Several GPUs eat batches several times as fast as one, so the loader must keep up. The usual advice
(also in the lecture notes) is ``num_workers = 4 × number of GPUs`` and ``pin_memory=True``. Whether
that helps depends on what loading an item costs: *waiting* (storage, network) overlaps across worker
processes almost without limit, *computing* (decoding, augmentation) only up to the number of free CPU
cores. :class:`SlowDataset` has both costs, separately adjustable; notebook 03b times a ``DataLoader``
over it in a loop written in the notebook.

The dataset lives in this package rather than in a notebook because worker processes must be able to
import it: with the ``spawn`` start method (macOS, Windows) a class defined in a notebook cannot be
sent to the workers.
"""

from __future__ import annotations

import time
from numbers import Real
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .._checks import whole

__all__ = ["SlowDataset"]


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
