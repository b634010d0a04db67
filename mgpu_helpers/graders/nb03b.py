"""Used by notebook 03b's exercises: a parallel criterion written by hand (03b.1) and a DataLoader
timing function (03b.2).

03b.1 runs one training step of a model with a 4,000-class output (float64) on the notebook's backend
(:func:`mgpu_helpers.data_parallel.backend`: real GPUs with two or more, up to 4; otherwise 4 virtual
devices) twice: plain ``DataParallel`` with the loss on device 0, and ``DataParallelModel`` with the
student's ``parallel_cross_entropy(outputs, targets, device_ids)``. A float64 batch of 127 splits
unevenly. The loss
and the gradients must equal the plain step's, and device 0's peak memory (simulated by the tracker on
virtual devices, measured with ``torch.cuda.max_memory_allocated`` on GPUs) must drop well below the
plain step's and stay near the other devices' peaks, because no output, whole or in pieces, may be brought
there; and only one number per device may be gathered there (per-row losses, gathered and averaged,
skip the weighting of unequal chunks). The package's own ``DataParallelCriterion`` is refused under any
name.

03b.2 calls the student's ``loader_speed(dataset, num_workers, batch_size, n_batches)`` on a dataset
whose items each wait a known time (:class:`~mgpu_helpers.data_parallel.SlowDataset`; the first item
in each process waits longer, a start-up cost), with 0 and 2 workers, and checks the returned
``(seconds to the first batch, batches per second after it)`` against what that waiting allows: no
faster than the waits permit, the first batch no sooner than its own items' waits, and two workers
clearly faster than none (waiting overlaps across processes; on a loaded machine the comparison gets
three tries, since one can miss it: a wrong timing misses it every time). The two returned
times must fit inside the call's own duration: numbers computed from the dataset's settings, or a rate
whose clock also ran while the first batch loaded, do not.
"""

from __future__ import annotations

import numbers
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data_parallel import SlowDataset
from ..exercises import Wrong, calls_during, exercise

# --- 03b.1: the parallel criterion ----------------------------------------------------------------


def _gathered_sizes(loss: Tensor) -> list[list[int]]:
    """Rows per device of every gather in ``loss``'s autograd graph (this package's virtual gather keeps
    them as ``sizes``, ``torch.nn.parallel``'s as ``input_sizes``)."""
    found, seen, todo = [], set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ in ("_GatherBackward", "GatherBackward"):
            found.append(list(getattr(node, "sizes", None) or getattr(node, "input_sizes", ())))
        todo.extend(next_node for next_node, _ in node.next_functions)
    return found


@exercise(
    "03b.1",
    "a parallel criterion",
    task="`parallel_cross_entropy(outputs, targets, device_ids)` → the whole batch's cross-entropy, a 0-dim "
    "tensor on device 0, from the ungathered per-device logits. One float64 step (4,000 classes, a batch of "
    "127 split unevenly over 4 virtual devices or your GPUs) is compared with plain DataParallel: equal loss "
    "and gradients, device 0's peak under 60 % of plain's and near the others', one number gathered per "
    "device. DataParallelCriterion is refused.",
    hint="give each device the targets of its own chunk, compute the loss where each output already is, "
    "and combine the per-device losses so that the result is the mean over the whole batch, whatever the "
    "chunk sizes.",
    forbid=("DataParallelCriterion", "DataParallelModel"),
)
def grade_parallel_loss(parallel_cross_entropy: Callable[..., Any]) -> str:
    """One step plain vs with the student's criterion: same loss and gradients, smaller device-0 peak."""
    from ..data_parallel import DataParallelCriterion, backend, chunk_sizes
    from ..models import LargeOutputModel

    b = backend()
    ids = list(range(min(b.gpus, 4) if b.real else 4))
    torch.manual_seed(0)
    model = LargeOutputModel(in_features=32, hidden=16, vocab_size=4_000).double()
    if b.real:
        model.to(b.device(0))
    x, y = torch.randn(127, 32, dtype=torch.float64), torch.randint(0, 4_000, (127,))
    got: dict[str, Any] = {}

    def plain() -> Tensor:
        out = b.DataParallel(model, ids)(b.to(x, 0))
        loss = F.cross_entropy(out, b.to(y, 0))
        loss.backward()
        return loss.detach()

    def yours() -> Tensor:
        outputs = b.DataParallelModel(model, ids)(b.to(x, 0))
        ready_made = DataParallelCriterion.forward.__code__
        loss, used = calls_during(parallel_cross_entropy, ready_made.__eq__, outputs, b.to(y, 0), ids)
        if used:
            raise Wrong(
                "your code runs the package's DataParallelCriterion, under another name: write it yourself."
            )
        got["where"] = b.where(loss) if isinstance(loss, Tensor) else None
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise Wrong(f"parallel_cross_entropy returned {shape}, not one number (a 0-dim tensor).")
        got["gathered"] = _gathered_sizes(loss)
        loss.backward()
        return loss.detach()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # real GPUs: gathering scalars warns
        plain_peaks, plain_loss = b.step_peaks(plain, model, len(ids))
        plain_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        peaks, loss = b.step_peaks(yours, model, len(ids))
    split = " + ".join(map(str, chunk_sizes(127, len(ids))))
    if not torch.allclose(loss.cpu(), plain_loss.cpu(), rtol=1e-9, atol=1e-12):
        raise Wrong(
            f"the loss is {loss.item():.6f}, but cross-entropy over the whole batch of 127 "
            f"(split {split}) is "
            f"{plain_loss.item():.6f}."
        )
    for (name, p), g in zip(model.named_parameters(), plain_grads, strict=True):
        if p.grad is None or not torch.allclose(p.grad, g, rtol=1e-7, atol=1e-10):
            raise Wrong(f"the loss is right, but the gradient of {name} differs from plain DataParallel's.")
    first = str(b.device(0))
    if got["where"] != first and not b.real:
        raise Wrong(f"the loss lives on {got['where']}: one number per device should be gathered on {first}.")
    if peaks[first] > 0.6 * plain_peaks[first]:
        raise Wrong(
            f"device 0's peak is {peaks[first] / 2**20:.2f} MiB, "
            f"against {plain_peaks[first] / 2**20:.2f} MiB "
            "for plain DataParallel: something as large as the whole batch's output still reached device 0."
        )
    others = max(v for d, v in peaks.items() if d != first)
    output_bytes = len(y) * 4_000 * x.element_size()  # the whole batch's logits
    if peaks[first] > others + output_bytes / 2:
        raise Wrong(
            f"device 0 peaked at {peaks[first] / 2**20:.2f} MiB and the other devices at most at "
            f"{others / 2**20:.2f} MiB: pieces of the other devices' outputs were brought to device 0."
        )
    for sizes in got["gathered"]:
        if max(sizes, default=0) > 1:
            raise Wrong(
                f"your function gathered {' + '.join(map(str, sizes))} numbers onto device 0 (one per row?): "
                "only one number per device may travel there, and the chunks differ in size."
            )
    return (
        f"on {len(ids)} {b.kind} (batch 127 split {split}): "
        "the loss and gradients equal plain DataParallel's, "
        f"and device 0's peak fell from {plain_peaks[first] / 2**20:.2f} to {peaks[first] / 2**20:.2f} MiB"
    )


# --- 03b.2: timing a DataLoader ------------------------------------------------------------------------

_IO_MS, _BATCH, _N, _START_MS = 3.0, 4, 12, 30.0
_ATTEMPTS = 3  # tries of the 0-vs-2-workers comparison before it counts as wrong


class _SlowStart(SlowDataset):
    """A :class:`SlowDataset` whose first item in each process waits ``_START_MS`` more (opening a file,
    say): a start-up cost that a rate timed over the first batch too cannot hide."""

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        started = vars(self).setdefault("started", set())
        if os.getpid() not in started:
            started.add(os.getpid())
            time.sleep(_START_MS / 1000)
        return super().__getitem__(index)


def _checked_pair(result: Any, workers: int) -> tuple[float, float]:
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise Wrong(
            f"with num_workers={workers}, loader_speed returned {result!r:.60}, "
            "not a pair (seconds, batches/s)."
        )
    first, rate = result
    for name, value in (("seconds to the first batch", first), ("batches per second", rate)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
            raise Wrong(f"with num_workers={workers}, the {name} is {value!r}, not a number >= 0.")
    return float(first), float(rate)


@exercise(
    "03b.2",
    "time a DataLoader",
    task="`loader_speed(dataset, num_workers, batch_size, n_batches)` → `(seconds to the first batch, "
    "batches per second over the other n_batches - 1)`. Checked with 0 and 2 workers on a dataset whose "
    "items wait 3 ms (the first in each process 30 ms more): both numbers within what the waits allow, both "
    "times inside the call's own duration, 2 workers at least 1.25× faster than 0 (three tries).",
    hint="start the clock before asking for the first batch, note when it arrives, then time the batches "
    "after it; the result is batches per second, not samples.",
)
def grade_loader_speed(loader_speed: Callable[..., Any]) -> str:
    """0 and 2 workers on a dataset that waits 3 ms per item: bounds from the waits, and overlap."""
    wait = _BATCH * _IO_MS / 1000  # every batch waits at least this long in one process
    ceiling = 1 / wait
    for _attempt in range(_ATTEMPTS):  # a loaded machine can hide the overlap once; a wrong timing, always
        dataset = _SlowStart((_N + 1) * _BATCH, image_size=4, io_ms=_IO_MS)  # a fresh start-up cost
        results = _timed_pair(loader_speed, dataset, wait, ceiling)
        if results[2][1] >= 1.25 * results[0][1]:
            break
    else:
        raise Wrong(
            f"2 workers measured {results[2][1]:.1f} batches/s and 0 workers {results[0][1]:.1f} (the last "
            f"of {_ATTEMPTS} tries, all below 1.25×): waiting overlaps across worker processes, so 2 workers "
            "should be clearly faster after the first batch."
        )
    return (
        f"0 workers: first batch {results[0][0] * 1e3:.0f} ms, {results[0][1]:.0f} batches/s; 2 workers: "
        f"{results[2][0] * 1e3:.0f} ms, {results[2][1]:.0f} batches/s (at most {ceiling:.0f}/s per process)"
    )


def _timed_pair(
    loader_speed: Callable[..., Any], dataset: Any, wait: float, ceiling: float
) -> dict[int, tuple[float, float]]:
    """The student's (first batch, batches/s) with 0 and 2 workers, each checked against the waits."""
    results = {}
    for workers in (0, 2):
        start = time.perf_counter()
        result = loader_speed(dataset, workers, _BATCH, _N)
        ran = time.perf_counter() - start
        first, rate = _checked_pair(result, workers)
        if rate > 0 and first + (_N - 1) / rate > 1.02 * ran + 0.005:  # slack for a different clock
            raise Wrong(
                f"with num_workers={workers}, the first batch ({first * 1e3:.0f} ms) plus {_N - 1} batches "
                f"at {rate:,.1f}/s make {(first + (_N - 1) / rate) * 1e3:.0f} ms, but loader_speed returned "
                f"after {ran * 1e3:.0f} ms: measure both, one after the other, during the call."
            )
        if first < 0.8 * wait:
            raise Wrong(
                f"with num_workers={workers}, the first batch came after {first * 1e3:.1f} ms, but its "
                f"{_BATCH} items wait {_IO_MS:g} ms each: the clock did not run while it was loaded."
            )
        limit = ceiling * (1.15 if workers == 0 else 4)
        if rate > limit:
            raise Wrong(
                f"with num_workers={workers}, {rate:,.1f} per second is more than this dataset can deliver "
                f"(each batch of {_BATCH} waits {wait * 1e3:.0f} ms: at most {limit:.0f} batches/s here)."
            )
        if workers == 0 and rate < 0.25 * ceiling:
            raise Wrong(
                f"with num_workers=0, {rate:.1f} batches/s is far below the {ceiling:.0f} the waits allow: "
                "more than the batches after the first was timed."
            )
        results[workers] = (first, rate)
    return results
