"""Used by notebook 02b's exercise 02b.1 (through its grader): a pipeline order written by hand — one
list per stage of ``("F", i)`` / ``("B", i)`` — run on idealised stages by the same simulator as the
named schedules (:func:`~mgpu_helpers.pipeline.simulate`), with the activations each stage holds.

    >>> tasks = simulate_orders([[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]])
    >>> max(t.end for t in tasks), peaks_in_flight(tasks, 2)
    (6.0, [1, 1])
"""

from __future__ import annotations

from collections.abc import Sequence

from .._checks import real, whole
from .schedules import Action, Task, _in_flight, _run

__all__ = ["peaks_in_flight", "simulate_orders"]


def simulate_orders(
    orders: Sequence[Sequence[tuple[str, int]]],
    *,
    forward: float = 1.0,
    backward: float = 2.0,
    comm: float = 0.0,
) -> list[Task]:
    """Run any per-stage orders (one list per stage of ``("F", i)`` / ``("B", i)``) on idealised stages.

    Every stage must run the forward and the backward of every micro-batch ``0..m-1`` exactly once.
    Raises ``ValueError`` for a malformed order and ``RuntimeError`` when the orders deadlock (every
    stage waits for an input that comes later in another stage's order). Returns the simulated tasks;
    :func:`peaks_in_flight` reads the activations held from them.
    """
    if isinstance(orders, (str, bytes)) or not isinstance(orders, Sequence) or not orders:
        raise TypeError("orders must be a non-empty list with one list of ('F', i) / ('B', i) per stage")
    forward = real("forward (cost of one forward pass)", forward, 0, open_low=True)
    backward = real("backward (cost of one backward pass)", backward, 0, open_low=True)
    comm = real("comm (time to hand data to the next stage)", comm, 0)
    counts = set()
    actions: list[list[Action]] = []
    for s, order in enumerate(orders):
        if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
            raise TypeError(f"stage {s}'s order must be a list of ('F', i) / ('B', i), not {order!r}")
        mine = []
        for a in order:
            if not (
                isinstance(a, (tuple, list))
                and len(a) == 2
                and a[0] in ("F", "B")
                and isinstance(a[1], int)
                and not isinstance(a[1], bool)
                and a[1] >= 0
            ):
                raise ValueError(
                    f"stage {s}: each action must be ('F', i) or ('B', i) with i >= 0, not {a!r}"
                )
            mine.append((a[0], a[1], 0))
        m = len(mine) // 2
        wanted = sorted((k, i, 0) for k in "FB" for i in range(m))
        if sorted(mine) != wanted:
            raise ValueError(
                f"stage {s} must run ('F', i) and ('B', i) exactly once for every micro-batch i in 0..m-1; "
                f"its order has {len(mine)} actions and misses or repeats some"
            )
        counts.add(m)
        actions.append(mine)
    if len(counts) != 1:
        raise ValueError(f"every stage must run the same micro-batches; the stages have {sorted(counts)}")
    return _run(actions, 1, forward, backward, comm, "custom")


def peaks_in_flight(tasks: Sequence[Task], p: int) -> list[int]:
    """Per stage: most micro-batches whose activations are held at once (forward started, backward not
    finished), from simulated or measured tasks."""
    whole("p (pipeline stages)", p, 1)
    return [int(max(_in_flight(tasks, s, 1, distinct=True), default=0)) for s in range(p)]
