"""Reference solutions of notebook 03b's exercises and typical wrong attempts (tests/test_solutions.py).

Written as a student would in the notebook: ``B`` is the notebook's backend (the real ``torch.nn.parallel``
with two or more GPUs, virtual devices otherwise).
"""

import time

import torch.nn.functional as F
from torch.utils.data import DataLoader

from mgpu_helpers import data_parallel as dp

B = dp.backend()


def parallel_cross_entropy(outputs, targets, device_ids):
    used = device_ids[: len(outputs)]
    chunks = B.parallel.scatter(targets, used)  # the same torch.chunk split as the outputs'
    sizes = [len(o) for o in outputs]

    def chunk_loss(out, tgt):  # runs on each device: the chunk's share of the batch mean
        return (F.cross_entropy(out, tgt, reduction="sum") / sum(sizes)).reshape(1)

    losses = B.parallel.parallel_apply(
        [chunk_loss] * len(outputs), list(zip(outputs, chunks, strict=True)), devices=used
    )
    return B.parallel.gather(losses, device_ids[0]).sum()  # one number per device crosses


def parallel_cross_entropy_unweighted(outputs, targets, device_ids):
    """PyTorch-Encoding's original: the mean of the per-device means (wrong for unequal chunks)."""
    used = device_ids[: len(outputs)]
    chunks = B.parallel.scatter(targets, used)
    losses = B.parallel.parallel_apply(
        [lambda out, tgt: F.cross_entropy(out, tgt).reshape(1)] * len(outputs),
        list(zip(outputs, chunks, strict=True)),
        devices=used,
    )
    return B.parallel.gather(losses, device_ids[0]).mean()


def loader_speed(dataset, num_workers, batch_size, n_batches):
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)  # the first batch: worker start-up plus its own items
    first = time.perf_counter()
    for _ in range(n_batches - 1):
        next(batches)
    steady = time.perf_counter() - first
    del batches  # shuts the workers down
    return first - start, (n_batches - 1) / steady


def loader_speed_samples(dataset, num_workers, batch_size, n_batches):
    """Counts samples per second instead of batches."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    count = 0
    for _ in range(n_batches - 1):
        count += len(next(batches)[0])
    steady = time.perf_counter() - first
    del batches
    return first - start, count / steady


SOLUTIONS = {"03b.1": (parallel_cross_entropy,), "03b.2": (loader_speed,)}
WRONG = {"03b.1": (parallel_cross_entropy_unweighted,), "03b.2": (loader_speed_samples,)}
