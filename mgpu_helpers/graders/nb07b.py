"""Used by notebook 07b's exercises: the repair of a distributed function that hangs when ranks have
different numbers of batches (07b.1), and a function that finds where a running call is stuck (07b.2).

07b.1 runs the student's function on 2 real gloo processes (:func:`mgpu_helpers.launching.launch`)
with a 2-second collective timeout, so an attempt that still hangs fails within seconds, and compares
every rank's answer with the mean computed here. The losses are drawn anew for each run, so no table of
answers fits them. 07b.2 calls the student's function on functions that it writes to a fresh file for
each run (random names and filler, so the blocked lines are not known in advance): one blocks in a
sleep two calls deep, one in an event wait, and one returns at once.
"""

from __future__ import annotations

import importlib.util
import math
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..exercises import Wrong, exercise
from ..launching import LaunchError, launch
from ..troubleshoot import diagnose

_TIMEOUT_S = 2.0


def _draw_losses(rng: random.Random, sizes: tuple[int, int]) -> list[list[float]]:
    """Per-rank losses with ``sizes`` batches each and clearly different per-rank means (so the mean of
    the ranks' means is not the mean of all losses when the sizes differ)."""
    while True:
        losses = [[round(rng.uniform(0.1, 4.0), 2) for _ in range(n)] for n in sizes]
        means = [sum(rank) / len(rank) for rank in losses]
        if abs(means[0] - means[1]) > 0.5:
            return losses


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
    task="Repair global_mean_loss(rank, world_size, losses_per_rank) so that it no longer hangs and every "
    "rank returns the mean of all ranks' losses, knowing only its own list (the others are None). Run on 2 "
    "gloo processes with a 2-second collective timeout, on losses drawn anew: even lists, then rank 0 with "
    "one batch more; each rank's answer is compared with the mean of all the losses.",
    hint="every rank must call the same collectives, the same number of times, with tensors of the same "
    "shape — whatever its own number of batches. Reduce what the ranks have in common, not per batch.",
)
def _grade_hang(global_mean_loss: Callable[..., object]) -> str:
    rng = random.Random()
    n = rng.randint(2, 3)
    for losses in (_draw_losses(rng, (n, n)), _draw_losses(rng, (n + 1, n))):  # even, then uneven
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
#: Written to a fresh file for each run. ``{x}`` is a random name suffix, ``{n}`` a random number: what
#: the file's lines say (and where they are) differs from run to run.
_CASES = """import threading
import time


def outer_{x}():
    total = sum(range({n}))
    time.sleep(0)
    return middle_{x}(total)


def middle_{x}(total):
    steps = [total] * {n}
    inner_{x}(steps)
    return len(steps)


def inner_{x}(steps):
    steps.append({n})
    time.sleep({stuck_s} + {n} / 1e6)
    steps.pop()


def waits_{x}():
    never_set = threading.Event()
    never_set.wait(0)
    never_set.wait({stuck_s} + {n} / 1e6)
    return never_set.is_set()


def quick_{x}():
    return sum(range({n}))
"""


def _write_cases(folder: str) -> tuple[dict[str, Callable[[], object]], list[str]]:
    """This run's functions, imported from a new file in ``folder``, and the file's lines."""
    x, n = f"{random.getrandbits(32):08x}", random.randint(3, 99)
    source = _CASES.format(x=x, n=n, stuck_s=_STUCK_S)
    path = Path(folder) / f"stuck_{x}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"_mgpu_07b_stuck_{x}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = ("outer", "waits", "quick")
    return {name: getattr(module, f"{name}_{x}") for name in names}, source.splitlines()


@exercise(
    "07b.2",
    "find where a call is stuck",
    task="stuck_at(fn, after_s) calls fn() and, once it has returned, gives the stripped source line where "
    "fn was blocked after_s seconds in (the innermost frame in fn's own file), or None if fn finished "
    "sooner. Called with after_s=0.25 on functions written to a fresh file for each run: a 0.8 s sleep two "
    "calls deep, an event wait, and one that returns at once.",
    hint="while fn is blocked it cannot report on itself: something other than the call has to read its "
    "stack after after_s seconds (§4.2), and must not fire once fn has returned.",
)
def _grade_stuck(stuck_at: Callable[[Callable[[], object], float], object]) -> str:
    with tempfile.TemporaryDirectory(prefix="mgpu-07b-") as folder:
        fns, lines = _write_cases(folder)
        blocked = [ln.strip() for ln in lines if f"{_STUCK_S} +" in ln]  # the sleep, then the wait
        for fn, want in zip((fns["outer"], fns["waits"]), blocked, strict=True):
            start = time.monotonic()
            got = stuck_at(fn, 0.25)
            took = time.monotonic() - start
            if took < 0.9 * _STUCK_S:
                raise Wrong(f"stuck_at returned after {took:.2f} s, before fn had finished.")
            if not isinstance(got, str) or got.strip() != want:
                raise Wrong(f"for a function blocked at `{want}` it returned {got!r}.")
        got = stuck_at(fns["quick"], 0.25)
        if got is not None:
            raise Wrong(f"for a function that returns at once it returned {got!r} instead of None.")
        time.sleep(0.35)  # a dump left armed would fire now; nothing may break
    return "named the blocked line of a sleep and an event wait, and None for a quick call"
