"""Used by the graders of notebooks 01b, 02a, 02b, 04a and 04b: run a student's worker on N gloo processes
and turn a failed or hung launch into a short :class:`~mgpu_helpers.exercises.Wrong` message."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..exercises import Wrong
from ..launching import LaunchError, launch


def run_ranks(
    worker: Callable[..., Any],
    nprocs: int,
    *args: Any,
    timeout_s: float = 30.0,
    collective_timeout_s: float = 15.0,
    who: str = "ranks",
) -> list[Any]:
    """``launch(worker, nprocs, args=args)`` on gloo; a rank's exception or a hang becomes :class:`Wrong`.

    Args:
        worker: the student's function, called as ``worker(rank, world_size, *args)``.
        nprocs: number of processes.
        *args: passed on to every rank.
        timeout_s: the whole job's limit; a hang past it is reported as a missing send or collective.
        collective_timeout_s: how long one send, recv or collective may wait for its partners; a rank
            that waits longer is reported the same way (short values catch deadlocks quickly).
        who: what the processes are called in the message ("ranks", "stage processes").
    """
    try:
        return launch(
            worker,
            nprocs,
            args=args,
            backend="gloo",
            timeout_s=timeout_s,
            collective_timeout_s=collective_timeout_s,
        )
    except LaunchError as exc:
        text = str(exc)
        if text.startswith("timed out"):
            raise Wrong(
                f"the {nprocs} {who} did not finish within {timeout_s:g} s: one is waiting for a message "
                "that no other sends (a recv without a matching send, or a collective the others skip)."
            ) from None
        if "Timed out" in text:
            op = re.search(r"for (send|recv) operation", text)
            where = f" in a {op.group(1)}" if op else ""
            raise Wrong(
                f"a rank waited {collective_timeout_s:g} s{where} for a partner that never made the matching "
                "call (a recv without a matching send, or a collective the others skip): with these calls in "
                "this order, the ranks wait for each other forever."
            ) from None
        first = re.match(r"rank (\d+) raised", text)
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("(rank(s)")]
        errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Wrong)\b", ln)]
        last = (errors or lines or [text])[-1]
        where = f"rank {first.group(1)}" if first else "a rank"
        raise Wrong(f"{where} raised {last.strip()}") from None
