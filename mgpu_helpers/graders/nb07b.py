"""Used by notebook 07b's exercises: the repair of a distributed function that hangs when ranks have
different numbers of batches (07b.1), and a function that finds where a running call is stuck (07b.2).

07b.1 runs the student's function on 2 real gloo processes (:func:`mgpu_helpers.launching.launch`)
with a 2-second collective timeout, so an attempt that still hangs fails within seconds, and compares
every rank's answer with the mean computed here. 07b.2 calls the student's function on functions defined
in this module that block at known lines (a sleep, an event wait, both nested a few calls deep) and on
one that returns at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from ..exercises import Wrong, exercise
from ..launching import LaunchError, launch
from ..troubleshoot import diagnose

_TIMEOUT_S = 2.0
#: Per-rank losses: rank 0 has three batches, rank 1 two (what an uneven split of a dataset gives).
_UNEVEN = [[1.0, 2.0, 3.0], [4.0, 5.0]]
_EVEN = [[0.5, 1.5], [2.5, 3.5]]


def _own_losses_only(rank: int, world_size: int, fn: Callable[..., object], losses: list) -> object:
    """Call the student's function with only this rank's entry filled in: on a real job a rank knows
    its own losses, so the mean must come through a collective, not from the other ranks' lists."""
    return fn(rank, world_size, [own if r == rank else None for r, own in enumerate(losses)])


def _run(fn: Callable[..., object], losses: list[list[float]]) -> list[object]:
    try:
        return launch(
            _own_losses_only,
            nprocs=2,
            args=(fn, losses),
            backend="gloo",
            collective_timeout_s=_TIMEOUT_S,
            timeout_s=4 * _TIMEOUT_S,
        )
    except LaunchError as exc:
        text = str(exc)
        last = next(
            (ln.strip() for ln in reversed(text.splitlines()) if "Error" in ln), text.splitlines()[-1]
        )
        kind = diagnose(text)
        if kind.kind == "distributed_timeout" or "timed out after" in text:
            raise Wrong(
                f"with per-rank losses {losses} the 2-process job did not finish: {kind.title.lower()} "
                f"({last[:160]})."
            ) from None
        raise Wrong(f"with per-rank losses {losses} the 2-process job failed: {last[:200]}") from None


@exercise(
    "07b.1",
    "repair a distributed function that hangs",
    hint="every rank must call the same collectives, the same number of times, with tensors of the same "
    "shape — whatever its own number of batches. Reduce what the ranks have in common, not per batch.",
)
def _grade_hang(global_mean_loss: Callable[..., object]) -> str:
    for losses in (_EVEN, _UNEVEN):
        results = _run(global_mean_loss, losses)
        flat = [v for rank in losses for v in rank]
        want = sum(flat) / len(flat)
        for rank, got in enumerate(results):
            value = got.item() if hasattr(got, "item") else got
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise Wrong(f"rank {rank} returned {type(got).__name__}; return the mean as a number.")
            if not math.isclose(value, want, rel_tol=1e-6):
                raise Wrong(
                    f"with per-rank losses {losses} rank {rank} returned {value:.6g}, not the mean of all "
                    f"{len(flat)} losses."
                )
    return (
        "on 2 gloo processes with 2-s collective timeouts it finished and every rank got the global mean, "
        "also with uneven batches"
    )


# -------------------------------------------------------------------------------- 07b.2's stuck functions
_STUCK_S = 0.8


def _sleepy_inner() -> None:
    time.sleep(_STUCK_S)  # stuck here (1)


def _sleepy() -> str:
    _sleepy_inner()
    return "done"


def _waits_for_event() -> None:
    never_set = threading.Event()
    never_set.wait(_STUCK_S)  # stuck here (2)


def _quick() -> int:
    return sum(range(10))


def _source_line(fn: Callable[..., object], marker: str) -> str:
    import inspect

    lines, _ = inspect.getsourcelines(fn)
    return next(ln.strip() for ln in lines if marker in ln)


@exercise(
    "07b.2",
    "find where a call is stuck",
    hint="while fn is blocked it cannot report on itself: something other than the call has to read its "
    "stack after after_s seconds (§4.2), and must not fire once fn has returned.",
)
def _grade_stuck(stuck_at: Callable[[Callable[[], object], float], object]) -> str:
    cases = (
        (_sleepy, _source_line(_sleepy_inner, "stuck here (1)")),
        (_waits_for_event, _source_line(_waits_for_event, "stuck here (2)")),
    )
    for fn, want in cases:
        start = time.monotonic()
        got = stuck_at(fn, 0.25)
        if time.monotonic() - start < 0.9 * _STUCK_S:
            raise Wrong(f"stuck_at returned after {time.monotonic() - start:.2f} s, before fn had finished.")
        if not isinstance(got, str) or got.strip() != want:
            raise Wrong(f"for a function blocked at `{want}` it returned {got!r}.")
    got = stuck_at(_quick, 0.25)
    if got is not None:
        raise Wrong(f"for a function that returns at once it returned {got!r} instead of None.")
    time.sleep(0.35)  # a dump left armed would fire now; nothing may break
    return "named the blocked line of a sleep and an event wait, and None for a quick call"
