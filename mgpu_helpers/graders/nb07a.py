"""Used by notebook 07a's exercises: the repair of a training loop whose memory grows every batch (07a.1)
and a batch-size search that uses a known upper bound, such as §3's estimate (07a.2).

07a.1 runs the student's loop for real under a :class:`~mgpu_helpers.memory.MemoryTracker`, marking the
tracked tensor bytes after every ``optimizer.step()`` (a step hook): in a loop that keeps nothing from
one batch to the next those readings are exactly equal. The same hook counts the autograd graph nodes
still reachable from the loop's local variables (found by the loop's code object on the stack): after
``backward()`` a kept graph holds no saved tensors any more, so the tracker cannot see it, but its node
count grows with every batch. The returned loss and accuracy and the trained
weights are compared with a reference loop computed here. 07a.2 runs the student's search against
probes with known limits and counts the probes.
"""

from __future__ import annotations

import copy
import math
import numbers
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..exercises import Wrong, exercise
from ..memory import MemoryTracker
from ..models import MLP
from ..troubleshoot import memory_growth

_STEPS = 8


def _setup() -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = MLP(in_features=32, hidden=64, out_features=10, depth=2)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(128, 32, generator=g), torch.randint(0, 10, (128,), generator=g)) for _ in range(_STEPS)
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


def _graph_nodes(values: object) -> int:
    """Autograd nodes reachable from the tensors among ``values`` (and inside lists, tuples, dicts)."""
    roots, seen = [], set()
    for value in values:
        items = value.values() if isinstance(value, dict) else value
        for item in items if isinstance(items, list | tuple) else (value,):
            if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                roots.append(item.grad_fn)
    while roots and len(seen) < 100_000:
        node = roots.pop()
        if node is not None and node not in seen:
            seen.add(node)
            roots.extend(next_fn for next_fn, _ in node.next_functions)
    return len(seen)


def _loop_graph_nodes(code: object) -> int | None:
    """:func:`_graph_nodes` of the locals of the running frame of ``code``; None if it is not on the stack."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return None if frame is None else _graph_nodes(list(frame.f_locals.values()))


@exercise(
    "07a.1",
    "repair a leaking training loop",
    hint="measure before you change anything: mark a MemoryTracker after every step, as in §4.1, and see "
    "what grows. Then ask, of every name the loop still holds when an iteration ends, what it refers to.",
)
def _grade_leak(train_epoch: Callable[..., object]) -> str:
    model, batches = _setup()
    reference_model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = MemoryTracker(model, optimizer)
    code, graphs = getattr(train_epoch, "__code__", None), []

    def after_step(*_: object) -> None:
        tracker.mark("step")
        graphs.append(_loop_graph_nodes(code))

    handle = optimizer.register_step_post_hook(after_step)
    try:
        with tracker:
            result = train_epoch(model, optimizer, batches)
    finally:
        handle.remove()
        tracker.close()
    readings = [m.total for m in tracker.marks]
    if len(readings) != _STEPS:
        raise Wrong(f"optimizer.step() ran {len(readings)} times for {_STEPS} batches.")
    growth = memory_growth(readings[1:])
    if growth.total_growth != 0:
        raise Wrong(
            f"tracked tensor memory after each optimizer step went {readings[1]:,} B → {readings[-1]:,} B "
            f"over {_STEPS - 1} steps (+{growth.bytes_per_step:,.0f} B per step): something still survives "
            "from one batch to the next."
        )
    if None not in graphs and graphs[-1] > graphs[1]:
        raise Wrong(
            f"after each optimizer step the loop's variables still reach an autograd graph that grew from "
            f"{graphs[1]} to {graphs[-1]} nodes over {_STEPS - 1} steps (the tracked bytes stayed flat: "
            "backward() freed its saved tensors, not the graph): something keeps a graph across batches."
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
    return (
        f"memory after each of {_STEPS} optimizer steps stayed at exactly {readings[-1]:,} B (tracked), and "
        "loss, accuracy and weights match the reference loop"
    )


class _Probe:
    """fits(batch_size) for a device on which every batch up to ``limit`` fits; counts its calls."""

    def __init__(self, limit: int, upper: int) -> None:
        self.limit, self.upper, self.calls = limit, upper, []

    def __call__(self, batch_size: int) -> bool:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise Wrong(f"fits was called with {batch_size!r}; batch sizes are whole numbers.")
        if not 1 <= batch_size <= self.upper:
            raise Wrong(f"fits was called with {batch_size}, outside 1 … upper ({self.upper}).")
        self.calls.append(batch_size)
        if len(self.calls) > 200:
            raise Wrong("more than 200 probes: the search does not end.")
        return batch_size <= self.limit


#: (the real limit, the known upper bound): limits inside, at and beyond the bound, and 0.
_CASES = (
    (133, 151),
    (151, 151),
    (500, 151),
    (1, 151),
    (0, 151),
    (75, 151),
    (1000, 4096),
    (4095, 4096),
    (1, 1),
    (0, 1),
)


@exercise(
    "07a.2",
    "a batch-size search that uses a known upper bound",
    hint="a known upper bound already brackets the answer, so §3's growing phase is not needed; each probe "
    "should halve the range of sizes still in doubt.",
)
def _grade_bound_search(largest_below: Callable[[Callable[[int], bool], int], int]) -> str:
    worst = 0
    for limit, upper in _CASES:
        fits = _Probe(limit, upper)
        got = largest_below(fits, upper)
        want = min(limit, upper)
        if got != want:
            raise Wrong(f"with upper={upper} on a device where sizes up to {limit} fit, it returned {got!r}.")
        budget = math.ceil(math.log2(upper + 1)) + 1
        if len(fits.calls) > budget:
            raise Wrong(
                f"with upper={upper} (real limit {limit}) it probed {len(fits.calls)} times "
                f"({fits.calls[:6]}…); a search over 0 … {upper} needs at most {budget}."
            )
        worst = max(worst, len(fits.calls))
    return f"exact on {len(_CASES)} devices with known limits, at most {worst} probes each"
