"""Used by notebook 01b's exercises: a global mean over ranks holding different numbers of elements
with one all-reduce (01b.1), and a ring shift of a tensor with point-to-point messages (01b.2), each
run on 3 real gloo processes started with :func:`mgpu_helpers.launching.launch`.

Each rank counts the collectives the student's code calls (the module functions of
``torch.distributed`` and ``torch.distributed.distributed_c10d`` are wrapped for the duration of the
call). 01b.2 runs with a 3-second collective
timeout, so a send/recv order in which every rank waits fails in seconds with a clear message.

Each grading draws fresh tensor values (a seed from ``os.urandom``), so this module's case builders are
no answer key; 01b.1's one all-reduce may carry a few numbers per rank, not the elements themselves;
and 01b.1's first two cases give ranks 0 and 1 the same sizes but a different total, so a
rank cannot tell the total count from its own sizes: the count has to travel in the all-reduce.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..exercises import Wrong, exercise
from ._ranks import run_ranks

_NPROCS = 3
_COLLECTIVES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "broadcast_object_list",
)


def _counting(calls: list[str], sizes: list[int] | None = None) -> Callable[[], None]:
    """Wrap the collectives, under their names in ``torch.distributed`` and in
    ``torch.distributed.distributed_c10d`` (where they are defined), so that each call the student makes
    is appended to ``calls`` (collectives called inside one are not counted again), and the number of
    elements of its first tensor argument to ``sizes`` when given; returns undo."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    modules = (dist, c10d)
    real = {(m, name): getattr(m, name) for m in modules for name in _COLLECTIVES if hasattr(m, name)}
    depth = [0]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                calls.append(name)
                if sizes is not None:
                    first = args[0] if args else kwargs.get("tensor")
                    sizes.append(first.numel() if isinstance(first, torch.Tensor) else -1)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    wrapped = {name: wrap(name, fn) for (m, name), fn in real.items() if m is c10d}
    for m, name in real:
        setattr(m, name, wrapped.get(name) or wrap(name, real[m, name]))

    def undo() -> None:
        for (m, name), fn in real.items():
            setattr(m, name, fn)

    return undo


def _run(worker: Callable[..., Any], *args: Any, collective_timeout_s: float) -> list[Any]:
    """3 gloo ranks; a rank's exception or a deadlock becomes :class:`Wrong`."""
    return run_ranks(worker, _NPROCS, *args, collective_timeout_s=collective_timeout_s)


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


# --- 01b.1: the global mean ---------------------------------------------------------------------------

# Uneven first (a mean of means is wrong there); ranks 0 and 1 hold 5 and 1 elements in both of the
# first two cases, whose totals differ (9, 12): only the all-reduce can tell them the count.
_SIZES = ((5, 1, 3), (5, 1, 6), (2, 2, 2))


def _data(sizes: tuple[int, ...], rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 10 * rank + sum(sizes))
    return torch.randn(sizes[rank], dtype=torch.float64, generator=gen) + rank


def _number(result: Any) -> float | None:
    """The student's answer as a float, or None when it is not one number."""
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        return float(result.detach().cpu())
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return float(result)
    return None


def _mean_rank(
    rank: int, world_size: int, global_mean: Callable[[torch.Tensor], Any], seed: int
) -> list[Any]:
    out = []
    for sizes in _SIZES:
        x = _data(sizes, rank, seed)
        before = x.clone()
        calls: list[str] = []
        sizes: list[int] = []
        undo = _counting(calls, sizes)
        try:
            result = global_mean(x)
        finally:
            undo()
        out.append(
            {
                "value": _number(result),
                "kind": type(result).__name__,
                "calls": calls,
                "carried": sizes[0] if sizes else 0,
                "same": torch.equal(x, before),
            }
        )
    return out


def _close(value: float, expected: float) -> bool:
    """Within a relative error of 1e-6: float32 sums pass, a wrong formula does not."""
    return abs(value - expected) <= 1e-6 * max(abs(expected), 1.0)


def _expected_mean(sizes: tuple[int, ...], seed: int) -> float:
    return torch.cat([_data(sizes, r, seed) for r in range(_NPROCS)]).mean().item()


@exercise(
    "01b.1",
    "the global mean over ranks",
    task="global_mean(x) returns on every rank the mean of all ranks' elements (a float or a 0-dim tensor), "
    "leaves x unchanged and makes exactly one collective call, a dist.all_reduce. Run on 3 gloo ranks with "
    "5/1/3, 5/1/6 and 2/2/2 float64 elements of fresh random values, collectives wrapped to count calls and "
    "the size they carry; compared with the one-process mean to 1e-6.",
    hint="Is the mean of the ranks' means right when the ranks hold different numbers of elements? "
    "What else would every rank need to know, and can it travel in the same all-reduce?",
)
def grade_global_mean(global_mean: Callable[[torch.Tensor], Any]) -> str:
    """3 gloo ranks, 5/1/3, 5/1/6 then 2/2/2 elements of fresh values; every rank's answer against the
    mean of all elements."""
    if not callable(global_mean):
        raise Wrong(f"pass the function global_mean itself, not {type(global_mean).__name__}")
    seed = _fresh_seed()
    ranks = _run(_mean_rank, global_mean, seed, collective_timeout_s=10.0)
    means = [_expected_mean(sizes, seed) for sizes in _SIZES]
    right = [
        all(r[i]["value"] is not None and _close(r[i]["value"], means[i]) for r in ranks)
        for i in range(len(_SIZES))
    ]
    for i, sizes in enumerate(_SIZES):
        expected = means[i]
        for rank, results in enumerate(ranks):
            r = results[i]
            if r["value"] is None:
                raise Wrong(
                    f"rank {rank} returned a {r['kind']}; return one number (a float or a 0-dim tensor)."
                )
            if r["calls"] != ["all_reduce"]:
                made = ", ".join(f"dist.{c}" for c in r["calls"]) or "no collective"
                raise Wrong(
                    f"with {', '.join(map(str, sizes))} elements on the 3 ranks, rank {rank} called {made}; "
                    "the exercise asks for exactly one dist.all_reduce."
                )
            if r["carried"] > 2 * _NPROCS:
                raise Wrong(
                    f"with {', '.join(map(str, sizes))} elements on the 3 ranks, rank {rank}'s all_reduce "
                    f"carried {r['carried']} numbers: the elements themselves travelled. The mean needs only "
                    "a few numbers per rank, however long x is."
                )
            if not r["same"]:
                raise Wrong(
                    f"rank {rank}'s x changed during your call; the caller's tensor must stay as it was."
                )
            if not _close(r["value"], expected):
                also = " (with 2 elements on every rank your answer was right)" if i < 2 and right[2] else ""
                diff = abs(r["value"] - expected)
                small = (
                    " A difference this small looks like rounding: are your sum and count float64, like x?"
                    if diff < 1e-2 * abs(expected)
                    else ""
                )
                raise Wrong(
                    f"with {', '.join(map(str, sizes))} elements on the 3 ranks, rank {rank} returned "
                    f"{r['value']:.10g}, but the mean of all {sum(sizes)} elements is {expected:.10g}{also} "
                    f"(off by {diff:.3g}).{small}"
                )
    return (
        "on 3 real gloo processes every rank returned the mean of all elements, with 5/1/3, 5/1/6 and 2/2/2 "
        "elements per rank, using one all_reduce and leaving x unchanged."
    )


# --- 01b.2: the ring shift -----------------------------------------------------------------------------


def _shift_data(rank: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 100 + rank)
    return [
        torch.randn(1000, dtype=torch.float64, generator=gen),
        torch.randint(-50, 50, (2, 3), generator=gen),
    ]


def _shift_rank(
    rank: int, world_size: int, ring_shift: Callable[[torch.Tensor], Any], seed: int
) -> dict[str, Any]:
    calls: list[str] = []
    undo = _counting(calls)
    try:
        got = [ring_shift(x.clone()) for x in _shift_data(rank, seed)]
    finally:
        undo()
    return {"got": [g.detach().clone() if isinstance(g, torch.Tensor) else g for g in got], "calls": calls}


@exercise(
    "01b.2",
    "a ring shift with send/recv",
    task="ring_shift(x) sends rank r's x to rank r + 1 (the last to rank 0) and returns a new tensor, of "
    "x's shape and dtype, holding what rank r - 1 sent. On 3 gloo ranks, with a float64 (1000,) and an "
    "int64 (2, 3) tensor of fresh random values; collectives are refused, and a 3 s timeout turns a "
    "deadlock into a message.",
    hint="Only point-to-point calls may move the tensor (send, recv, isend, irecv; no collective such as "
    "all_gather). If a rank times out instead: which of its calls is waiting, and what is its partner doing "
    "at that moment?",
)
def grade_ring_shift(ring_shift: Callable[[torch.Tensor], Any]) -> str:
    """3 gloo ranks, a float64 (1000,) and an int64 (2, 3) tensor of fresh values; each rank must get its
    left neighbour's."""
    if not callable(ring_shift):
        raise Wrong(f"pass the function ring_shift itself, not {type(ring_shift).__name__}")
    seed = _fresh_seed()
    ranks = _run(_shift_rank, ring_shift, seed, collective_timeout_s=3.0)
    for rank, out in enumerate(ranks):
        if out["calls"]:
            raise Wrong(
                f"rank {rank} called dist.{', dist.'.join(sorted(set(out['calls'])))}; this exercise moves "
                "the tensor with point-to-point calls only."
            )
        left = (rank - 1) % _NPROCS
        for got, sent, mine in zip(out["got"], _shift_data(left, seed), _shift_data(rank, seed), strict=True):
            what = f"the {sent.dtype} tensor of shape {tuple(sent.shape)}"
            if not isinstance(got, torch.Tensor):
                raise Wrong(f"for {what} rank {rank} returned a {type(got).__name__}, not a tensor.")
            if got.shape != sent.shape or got.dtype != sent.dtype:
                raise Wrong(
                    f"for {what} rank {rank} returned shape {tuple(got.shape)} and dtype {got.dtype}; "
                    "it should match x."
                )
            if not torch.equal(got, sent):
                k = 0 if sent.dim() == 1 else 1
                source = [q for q in range(_NPROCS) if torch.equal(got, _shift_data(q, seed)[k])]
                said = f"rank {source[0]}'s tensor" if source else "a tensor that no rank sent"
                if torch.equal(got, mine):
                    said = "its own tensor"
                raise Wrong(f"for {what} rank {rank} returned {said}; it should be rank {left}'s.")
    return (
        "on 3 real gloo processes every rank returned its left neighbour's tensor (float64 and int64), "
        "using point-to-point calls only."
    )
