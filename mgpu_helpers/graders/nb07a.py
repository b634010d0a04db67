"""Used by notebook 07a's exercises: the repair of a training loop whose memory grows every batch (07a.1)
and a batch-size finder that survives its own out-of-memory errors (07a.2).

07a.1 runs the student's loop for real under a :class:`~mgpu_helpers.memory.MemoryTracker`, marking the
tracked tensor bytes after every ``optimizer.step()`` (a step hook). What a leak keeps is a batch's
graph or activations: the readings may grow by less than half of one batch's output (logits) per step —
keeping each batch's predicted classes (``argmax``, 1 KiB) is fine, keeping its logits is not. The
same hook counts, after the second and the last step, the autograd graph nodes reachable from every
live tensor (``gc``): after ``backward()`` a kept graph holds no saved tensors any more, so the tracker
cannot see it, but its node count grows with every batch, wherever the graph is kept. At the same two
steps ``tracemalloc`` reads the Python objects that the student's own code made and still keeps (lists and
numbers, which the tensor tracker cannot see: ``out.tolist()`` is still a batch's output). The returned
loss and accuracy and the trained weights are compared with a reference loop computed here.

07a.2 hands the student's search a real training-step stand-in: each call allocates activations and, on a
batch too large for the simulated device, asks the allocator for 256 PiB, a real out-of-memory error
raised while the activations are alive. The grader checks the answers, counts the calls, checks that no
failed step's activations are still alive when the next call starts (a kept exception keeps them), and
that an error that is not an OOM (a shape bug) comes out of the search instead of counting as "too big".
"""

from __future__ import annotations

import copy
import gc
import math
import numbers
import os
import sysconfig
import tracemalloc
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..exercises import Wrong, exercise
from ..memory import MemoryTracker
from ..models import MLP
from ..troubleshoot import is_oom, memory_growth

_STEPS, _BATCH, _CLASSES = 8, 128, 10


def _setup() -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = MLP(in_features=32, hidden=64, out_features=_CLASSES, depth=2)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(_BATCH, 32, generator=g), torch.randint(0, _CLASSES, (_BATCH,), generator=g))
        for _ in range(_STEPS)
    ]
    return model, batches


def _reference(model: torch.nn.Module, batches: list) -> tuple[float, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    total, correct = 0.0, 0
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
        correct += (out.argmax(dim=1) == y).sum().item()
    return total / len(batches), correct / sum(len(y) for _, y in batches)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _live_graph_nodes() -> int:
    """Autograd nodes reachable from every live plain tensor that has a ``grad_fn`` (found with ``gc``)."""
    roots = [o.grad_fn for o in gc.get_objects() if type(o) is torch.Tensor and o.grad_fn is not None]
    seen: set[object] = set()
    while roots and len(seen) < 200_000:
        node = roots.pop()
        if node is not None and node not in seen:
            seen.add(node)
            roots.extend(next_fn for next_fn, _ in node.next_functions)
    return len(seen)


_LIBRARIES = tuple(
    {os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))}
    | {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")}
)


def _own_python_bytes() -> int:
    """Bytes of live Python objects allocated by a line outside torch, this package and the libraries."""
    stats = tracemalloc.take_snapshot().statistics("filename")
    return sum(s.size for s in stats if not _is_library(s.traceback[0].filename))


def _is_library(filename: str) -> bool:
    packages = {"site-packages", "dist-packages"} & set(filename.split(os.sep))
    return bool(packages) or filename.startswith((*_LIBRARIES, "<frozen"))


@exercise(
    "07a.1",
    "repair a leaking training loop",
    task="Repair train_epoch(model, optimizer, batches) so that no batch's output or graph survives into the "
    "next batch, while it still returns the mean loss and the accuracy as two Python floats. A fresh MLP "
    "trains on 8 batches; after every optimizer.step() the grader reads the tracked tensor bytes, the live "
    "autograd nodes and the Python objects your code holds; loss, accuracy and weights must match a "
    "reference loop.",
    hint="measure before you change anything: mark a MemoryTracker after every step, as in §4.1, and see "
    "what grows — but the tracker counts tensor bytes only, and a loss kept after backward() holds its "
    "graph's nodes without bytes, so measuring cannot show every leak. Then ask, of everything the loop "
    "still holds when an iteration ends, what it refers to: a tensor that came out of the model brings "
    "its graph along.",
)
def _grade_leak(train_epoch: Callable[..., object]) -> str:
    model, batches = _setup()
    reference_model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = MemoryTracker(model, optimizer)
    graphs: list[int] = []
    python_bytes: list[int] = []

    def after_step(*_: object) -> None:
        tracker.mark("step")
        if len(tracker.marks) in (2, _STEPS):  # the second step (a steady state) and the last
            python_bytes.append(_own_python_bytes())
            graphs.append(_live_graph_nodes())

    handle = optimizer.register_step_post_hook(after_step)
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        with tracker:
            result = train_epoch(model, optimizer, batches)
    finally:
        if not tracing:
            tracemalloc.stop()
        handle.remove()
        tracker.close()
    readings = [m.total for m in tracker.marks]
    if len(readings) != _STEPS:
        raise Wrong(f"optimizer.step() ran {len(readings)} times for {_STEPS} batches.")
    growth = memory_growth(readings[1:])
    allowed = _BATCH * _CLASSES * 4 / 2  # half of one batch's fp32 output (logits)
    if growth.total_growth > 0 and growth.bytes_per_step >= allowed:
        raise Wrong(
            f"tracked tensor memory after each optimizer step went {readings[1]:,} B → {readings[-1]:,} B "
            f"over {_STEPS - 1} steps (+{growth.bytes_per_step:,.0f} B per step, while one batch's output is "
            f"{2 * allowed:,.0f} B): something as large as a batch's output survives from one batch to the "
            "next."
        )
    if len(graphs) == 2 and graphs[-1] > graphs[0]:
        raise Wrong(
            f"after each optimizer step the live tensors reach an autograd graph that grew from "
            f"{graphs[0]} to {graphs[-1]} nodes between the 2nd and the last step (backward() freed the "
            "saved tensors, not the graph): something keeps a graph across batches."
        )
    python_growth = (python_bytes[-1] - python_bytes[0]) / (_STEPS - 2) if len(python_bytes) == 2 else 0
    if python_growth >= 2 * allowed:  # as Python numbers a batch's output takes 8 times as many bytes
        raise Wrong(
            f"the Python objects your loop made and still holds (lists, numbers: the tensor tracker cannot "
            f"see them) grew by {python_growth:,.0f} B per step between the 2nd and the last step, while one "
            f"batch's output is {2 * allowed:,.0f} B as a tensor: something as large as a batch's output "
            "survives from one batch to the next, converted or not."
        )
    if not (isinstance(result, tuple) and len(result) == 2 and all(_is_number(v) for v in result)):
        got = (
            type(result).__name__
            if not isinstance(result, tuple)
            else ", ".join(type(v).__name__ for v in result)
        )
        raise Wrong(f"return (mean loss, accuracy) as two Python floats, not ({got}).")
    want_loss, want_acc = _reference(reference_model, batches)
    if not math.isclose(result[0], want_loss, rel_tol=1e-5):
        raise Wrong(f"the mean loss is {result[0]:.6g}; the same training gives {want_loss:.6g}.")
    if not math.isclose(result[1], want_acc, abs_tol=1e-9):
        raise Wrong(f"the accuracy is {result[1]:.6g}; the same training gives {want_acc:.6g}.")
    for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
        if not torch.allclose(p, q, atol=1e-6):
            raise Wrong("after the loop the weights differ from those of the same training done here.")
    kept = f"grew by {growth.bytes_per_step:,.0f} B per step" if growth.total_growth > 0 else "stayed flat"
    return (
        f"tracked memory after each of {_STEPS} optimizer steps {kept} (one batch's output is "
        f"{2 * allowed:,.0f} B), no graph piled up, and loss, accuracy and weights match the reference loop"
    )


class _Device:
    """``step(batch_size)`` on a simulated device where batches up to ``limit`` fit.

    Each call makes real activations (4 KiB per sample) and, when the batch is too large, asks the
    allocator for 256 PiB while they are alive: a real out-of-memory error, whose traceback refers to this
    frame. From ``bug_above`` on, the step fails with a shape error instead (a bug, not "too big").
    """

    def __init__(self, limit: int, upper: int, bug_above: int | None = None) -> None:
        self._limit, self._upper, self._bug_above = limit, upper, bug_above
        self.calls: list[int] = []
        self._failed: list[tuple[int, weakref.ref]] = []

    def __call__(self, batch_size: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise Wrong(f"step was called with {batch_size!r}; batch sizes are whole numbers.")
        if not 1 <= batch_size <= self._upper:
            raise Wrong(f"step was called with {batch_size}, outside 1 … upper ({self._upper}).")
        alive = [b for b, ref in self._failed if ref() is not None]
        if alive:
            raise Wrong(
                f"when step({batch_size}) started, the activations of the failed step({alive[0]}) were still "
                "alive: something still refers to that exception or its traceback, so the next probe "
                "starts with less memory than the first."
            )
        self.calls.append(batch_size)
        if len(self.calls) > 200:
            raise Wrong("more than 200 calls to step: the search does not end.")
        activations = torch.ones(batch_size, 1024)  # alive in this frame while the step runs
        if self._bug_above is not None and batch_size > self._bug_above:
            torch.ones(batch_size, 3) @ torch.ones(batch_size, 3)  # a shape bug: RuntimeError, not OOM
        if batch_size > self._limit:
            self._failed.append((batch_size, weakref.ref(activations)))
            torch.empty(2**56, dtype=torch.uint8)  # 256 PiB: the allocator refuses at once


#: (the real limit, the known upper bound): limits inside, at and beyond the bound, and 0.
_CASES = (
    (117, 151),
    (151, 151),
    (500, 151),
    (1, 151),
    (0, 151),
    (58, 151),
    (1000, 4096),
    (4095, 4096),
    (1, 1),
    (0, 1),
)


@exercise(
    "07a.2",
    "a batch-size finder that survives its own OOMs",
    task="largest_fitting(step, upper) returns the largest size in 1 … upper for which step returns (0 if "
    "none), calling step only with sizes in that range and at most ⌈log2(upper + 1)⌉ + 1 times. Checked on "
    "10 simulated devices that raise real allocator OOMs (answers exact, calls counted, no failed step's "
    "activations alive at the next call), and a non-OOM error (a shape bug) must come out of your function.",
    hint="only an out-of-memory error means 'too big' (is_oom, §2); let every other error through. Keep "
    "nothing of a failed step: decide inside except, act after it. A known upper bound already brackets "
    "the answer, so every call should halve the sizes still in doubt.",
)
def _grade_finder(largest_fitting: Callable[[Callable[[int], None], int], int]) -> str:
    worst = 0
    for limit, upper in _CASES:
        step = _Device(limit, upper)
        got = largest_fitting(step, upper)
        want = min(limit, upper)
        if got != want:
            raise Wrong(
                f"with upper={upper} on a device where batches up to {limit} fit, it returned {got!r}."
            )
        budget = math.ceil(math.log2(upper + 1)) + 1
        if len(step.calls) > budget:
            raise Wrong(
                f"with upper={upper} (real limit {limit}) it called step {len(step.calls)} times "
                f"({step.calls[:6]}…); a search over 0 … {upper} needs at most {budget}."
            )
        worst = max(worst, len(step.calls))
    buggy = _Device(1000, 151, bug_above=90)
    try:
        got = largest_fitting(buggy, 151)
    except Wrong:
        raise
    except Exception as exc:
        if is_oom(exc):
            raise Wrong("an out-of-memory error came out of the search: it means 'too big'.") from None
    else:
        raise Wrong(
            f"on a device where batches above 90 hit a shape bug (a RuntimeError that is not an OOM), it "
            f"returned {got!r}: a bug is not 'too big', let it through."
        )
    gc.collect()
    return (
        f"exact on {len(_CASES)} devices with real allocator errors, at most {worst} calls each, no failed "
        "step's memory kept, and a shape bug came through"
    )
