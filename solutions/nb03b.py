"""Reference solutions of notebook 03b's exercises and typical wrong attempts (tests/test_solutions.py).

Written as a student would in the notebook: ``B`` is the notebook's backend (the real ``torch.nn.parallel``
with two or more GPUs, virtual devices otherwise).
"""

import time

import torch.nn.functional as F
from torch import nn
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


def parallel_cross_entropy_one_device_at_a_time(outputs, targets, device_ids):
    """Correct without threads: each chunk's loss on its own device, in a plain loop."""
    losses, start = [], 0
    for device, out in zip(device_ids, outputs, strict=False):
        tgt = B.to(targets[start : start + len(out)], device)  # this chunk's targets, to its device
        losses.append((F.cross_entropy(out, tgt, reduction="sum") / len(targets)).reshape(1))
        start += len(out)
    return B.parallel.gather(losses, device_ids[0]).sum()


# --- shortcuts: the right loss and gradients without computing the loss where each output lives ---


def gather_then_loss(outputs, targets, device_ids):
    """Gathers the whole batch's logits on device 0 again: what the exercise is meant to remove."""
    return F.cross_entropy(B.parallel.gather(outputs, device_ids[0]), targets)


def outputs_to_device_0_piece_by_piece(outputs, targets, device_ids):
    """Moves each device's logits to device 0, one chunk at a time, and computes the loss there."""
    total, start = 0, 0
    for out in outputs:
        total = total + F.cross_entropy(B.to(out, 0), targets[start : start + len(out)], reduction="sum")
        start += len(out)
    return total / len(targets)


Criterion = dp.DataParallelCriterion  # a name of one's own for the package's answer


def ready_made_criterion_renamed(outputs, targets, device_ids):
    """The package's DataParallelCriterion under another name (the static check sees only names)."""
    return Criterion(nn.CrossEntropyLoss(), device_ids)(outputs, targets)


def per_row_losses_gathered(outputs, targets, device_ids):
    """Each device's per-row losses gathered on device 0 and averaged there: no weighting of the chunks."""
    used = device_ids[: len(outputs)]
    chunks = B.parallel.scatter(targets, used)
    losses = B.parallel.parallel_apply(
        [lambda out, tgt: F.cross_entropy(out, tgt, reduction="none")] * len(outputs),
        list(zip(outputs, chunks, strict=True)),
        devices=used,
    )
    return B.parallel.gather(losses, device_ids[0]).mean()


def loader_speed_from_the_waits(dataset, num_workers, batch_size, n_batches):
    """Computes the answer from the dataset's settings instead of timing a DataLoader."""
    wait = batch_size * dataset.io_ms / 1000
    return wait, max(1, num_workers) / wait


def loader_speed_whole_loop(dataset, num_workers, batch_size, n_batches):
    """The rate's clock also runs while the first batch (and the workers' start-up) loads."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter() - start
    for _ in range(n_batches - 1):
        next(batches)
    total = time.perf_counter() - start
    del batches
    return first, n_batches / total


SOLUTIONS = {"03b.1": (parallel_cross_entropy,), "03b.2": (loader_speed,)}
WRONG = {"03b.1": (parallel_cross_entropy_unweighted,), "03b.2": (loader_speed_samples,)}
VARIANTS = {"03b.1": {"one_device_at_a_time": (parallel_cross_entropy_one_device_at_a_time,)}}
SHORTCUTS = {
    "03b.1": {
        "gather_then_loss": (gather_then_loss,),
        "outputs_to_device_0_piece_by_piece": (outputs_to_device_0_piece_by_piece,),
        "ready_made_criterion_renamed": (ready_made_criterion_renamed,),
        "per_row_losses_gathered": (per_row_losses_gathered,),
    },
    "03b.2": {
        "from_the_waits": (loader_speed_from_the_waits,),
        "whole_loop": (loader_speed_whole_loop,),
    },
}
