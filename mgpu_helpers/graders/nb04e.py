"""Used by notebook 04e's exercises: a DDP wrapper whose buckets are all-reduced asynchronously during
backward (04e.1), run on 2 real gloo processes started with :func:`mgpu_helpers.launching.launch`, and a
timeline of buckets on one link (04e.2), a plain function.

04e.1 builds the student's ``cls(model, bucket_cap_bytes)`` on 2 ranks around a float64 MLP whose
weights differ per rank (drawn from a seed chosen at grading time), for two caps, and runs two iterations
each (forward on the rank's share, ``backward()``, ``finish()``). Every rank's gradients must equal one
process's gradient on the whole batch from rank 0's weights. ``dist.all_reduce`` is wrapped in the ranks
during grading: each call must pass ``async_op=True``; the calls' tensors must be the buckets the cap
gives (reverse registration order, a new bucket when the next gradient would take the current one past
the cap; their bytes and their values, the ranks' local gradients as backward produced them), the
first call must start while backward still has gradients to compute, and no handle may be waited on
before backward returns. torch's ``DistributedDataParallel`` is not accepted.

04e.2 calls the student's ``step_end_ms(ready_ms, comm_ms)`` on fixed and random cases and compares it
with the finishing time of buckets that each start when ready and when the one link is free; calling the
grader's own timeline is refused.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, calls_during, exercise
from ._ranks import run_ranks

# --- 04e.1: buckets all-reduced during backward -------------------------------------------------------

_CAPS = (1_000, 12_000)  # bytes: 4 buckets (one gradient larger than the cap), then 2 buckets
_ITERATIONS = 2  # a second iteration catches counters that are never reset


def _model(seed: int) -> nn.Module:
    # 6 parameters of 8-byte numbers: 1,920 / 320 / 9,600 / 240 / 720 / 24 bytes in registration order
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 40), nn.Tanh(), nn.Linear(40, 30), nn.Tanh(), nn.Linear(30, 3)).double()


def _batch(iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(77 + iteration)
    return torch.randn(8, 6, dtype=torch.float64, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def _expected_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """Indices of the parameters in each bucket: reverse order, a new bucket when the next would pass cap."""
    buckets: list[list[int]] = [[]]
    filled = 0
    for i in reversed(range(len(sizes))):
        if buckets[-1] and filled + sizes[i] > cap:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets


class _WatchedWork:
    """An async all-reduce's handle that notes a ``wait()`` made while backward is still running."""

    def __init__(self, work: Any, now: dict[str, Any]) -> None:
        self._work, self._now = work, now

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self._now["in_backward"]:
            self._now["waited_in_backward"] = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _overlap_rank(rank: int, world_size: int, cls: Any, seed: int) -> list[dict[str, Any]]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = dist.all_reduce
    now: dict[str, Any] = {"params": [], "local": {}, "calls": None, "in_backward": False}

    def recording(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls = now["calls"]
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        if calls is not None:
            calls.append(
                {
                    "bytes": tensor.numel() * tensor.element_size(),
                    "async": bool(async_op),
                    "missing": sum(p.grad is None for p in now["params"]),  # gradients not computed yet
                    "values": tensor.detach().flatten().sort().values.clone(),
                }
            )
        handle = real(tensor, *args, **kwargs)
        return _WatchedWork(handle, now) if calls is not None and async_op and handle is not None else handle

    for module in (dist, c10d):
        module.all_reduce = recording
    out = []
    try:
        for cap in _CAPS:
            model = _model(seed + rank)  # different weights on each rank: only rank 0's may count
            params = list(model.parameters())
            now["params"] = params
            for i, p in enumerate(params):  # what this rank's backward produced, before any averaging

                def keep(grad: torch.Tensor, i: int = i) -> None:
                    now["local"][i] = grad.detach().clone()

                p.register_hook(keep)
            wrapper = cls(model, cap)
            for it in range(_ITERATIONS):
                model.zero_grad(set_to_none=True)
                x, y = _batch(it)
                share = slice(4 * rank, 4 * rank + 4)
                now["calls"], now["local"], now["waited_in_backward"] = [], {}, False
                loss = F.cross_entropy(wrapper(x[share]), y[share])
                now["in_backward"] = True
                try:
                    loss.backward()
                finally:
                    now["in_backward"] = False
                in_backward = len(now["calls"])
                wrapper.finish()
                calls, now["calls"] = now["calls"], None
                local = [now["local"].get(i) for i in range(len(params))]
                out.append(
                    {
                        "cap": cap,
                        "iteration": it,
                        "grads": [None if p.grad is None else p.grad.detach().clone() for p in params],
                        "calls": calls,
                        "during_backward": in_backward,
                        "waited_in_backward": now["waited_in_backward"],
                        "local": local,
                        "sizes": [p.numel() * p.element_size() for p in params],
                    }
                )
    finally:
        for module in (dist, c10d):
            module.all_reduce = real
    return out


def _matches(values: torch.Tensor, local: list[torch.Tensor | None], bucket: list[int], n: int) -> bool:
    if any(local[i] is None for i in bucket):
        return False
    want = torch.cat([local[i].flatten() for i in bucket]).sort().values  # type: ignore[union-attr]
    if want.numel() != values.numel():
        return False
    return any(torch.allclose(values, want * scale, atol=1e-12) for scale in (1.0, 1.0 / n))


@exercise(
    "04e.1",
    "buckets all-reduced during backward",
    task="Finish `BucketedDDP(model, bucket_cap_bytes)`: after `backward()` and `finish()`, every rank's "
    "`p.grad` is the ranks' average, each bucket all-reduced asynchronously during backward, every "
    "iteration. On 2 gloo ranks from different weights, caps 1,000 and 12,000 B, two iterations each, "
    "compared with one process on the whole batch; `dist.all_reduce` is wrapped: one call per "
    "`make_buckets` bucket, `async_op=True`, the first before backward ends, no wait inside backward. "
    "torch's DDP is refused.",
    hint="keep, per bucket, how many of its gradients are still to come; the post-accumulate hook of a "
    "parameter counts its bucket down, and the hook that brings a count to zero flattens that bucket and "
    "starts its all-reduce with async_op=True, keeping the handle and the flat tensor. finish() waits on "
    "each handle, divides, copies the slices back into p.grad and resets the counts for the next iteration.",
    forbid=("DistributedDataParallel",),
)
def grade_overlap(cls: Any) -> str:
    """2 gloo ranks, caps of 1,000 and 12,000 B, 2 iterations each: gradients, buckets, async, timing."""
    if not callable(cls):
        raise Wrong(f"pass the class itself, not {type(cls).__name__}")
    seed = 1000 + secrets.randbelow(10**6)
    ranks = run_ranks(_overlap_rank, 2, cls, seed)
    n = len(ranks)
    for k, case in enumerate(ranks[0]):
        cap, it = case["cap"], case["iteration"]
        when = f"with bucket_cap_bytes={cap:,}, iteration {it + 1}"
        reference = _model(seed)
        x, y = _batch(it)
        F.cross_entropy(reference(x), y).backward()
        expected = [p.grad for p in reference.parameters()]
        for rank, cases in enumerate(ranks):
            grads = cases[k]["grads"]
            if any(g is None for g in grads):
                raise Wrong(f"{when}, rank {rank}'s model has a parameter without a gradient after finish().")
            diff = max((g - e).abs().max().item() for g, e in zip(grads, expected, strict=True))
            if not diff < 1e-9:
                raise Wrong(
                    f"{when}, rank {rank}'s gradient differs from one process's gradient on the whole batch "
                    f"(from rank 0's weights) by up to {diff:.3g}."
                )
        for rank, cases in enumerate(ranks):
            calls = cases[k]["calls"]
            if not calls:
                raise Wrong(
                    f"{when}, the gradients are right but rank {rank} never called dist.all_reduce: the "
                    "buckets must be all-reduced with dist.all_reduce(flat, async_op=True)."
                )
            if not all(c["async"] for c in calls):
                raise Wrong(
                    f"{when}, rank {rank} called dist.all_reduce without async_op=True: a synchronous call "
                    "blocks the hook, and with it backward, until the bucket has travelled — no overlap."
                )
            if cases[k]["waited_in_backward"]:
                raise Wrong(
                    f"{when}, rank {rank} waited on an all-reduce's handle before backward had returned: "
                    "backward stood still until that bucket had travelled, so nothing overlapped."
                )
            buckets = _expected_buckets(cases[k]["sizes"], cap)
            want = sorted(sum(cases[k]["sizes"][i] for i in b) for b in buckets)
            got = sorted(c["bytes"] for c in calls)
            if got != want:
                raise Wrong(
                    f"{when}, rank {rank} all-reduced tensors of {got} bytes; the buckets make_buckets "
                    f"gives for that cap hold {want} bytes: each all-reduce carries one whole bucket, and "
                    "each bucket goes once per iteration."
                )
            for c in calls:
                if not any(_matches(c["values"], cases[k]["local"], b, n) for b in buckets):
                    raise Wrong(
                        f"{when}, rank {rank} all-reduced a tensor of {c['bytes']:,} bytes that is not one "
                        "bucket's gradients as backward produced them on this rank (reverse registration "
                        "order, flattened)."
                    )
            if cases[k]["during_backward"] == 0 or calls[0]["missing"] == 0:
                raise Wrong(
                    f"{when}, rank {rank}'s first all-reduce started after backward had computed every "
                    "gradient: nothing was left for it to overlap with, so the buckets did not leave during "
                    "backward."
                )
    return (
        f"on {n} real gloo processes, from different weights, every rank's gradient equals one process's "
        f"full-batch gradient; caps of {_CAPS[0]:,} and {_CAPS[1]:,} B gave the right buckets, each "
        "all-reduced asynchronously, the first while backward was still running (2 iterations each)."
    )


# --- 04e.2: buckets on one link ------------------------------------------------------------------------

_FIXED = (
    ([2.0, 4.0, 6.0, 8.0], [3.0, 3.0, 3.0, 3.0]),  # the link is the bottleneck: all-reduces queue up
    ([5.0, 10.0, 15.0, 20.0], [1.0, 1.0, 1.0, 1.0]),  # compute dominates: only the last one shows
    ([1.0, 9.0, 10.0], [6.0, 0.5, 2.0]),  # the link idles, then queues
    ([4.0], [2.5]),  # one bucket: nothing to overlap
)


def _step_end(ready_ms: list[float], comm_ms: list[float]) -> float:
    link_free = 0.0
    for ready, comm in zip(ready_ms, comm_ms, strict=True):
        link_free = max(link_free, ready) + comm
    return link_free


def _random_case(rng: random.Random) -> tuple[list[float], list[float]]:
    n = rng.randint(3, 7)
    ready = sorted(round(rng.uniform(0.5, 30.0), 2) for _ in range(n))
    return ready, [round(rng.uniform(0.2, 8.0), 2) for _ in range(n)]


@exercise(
    "04e.2",
    "when does the step end?",
    task="`step_end_ms(ready_ms, comm_ms)` → the millisecond at which the last bucket's all-reduce ends, on "
    "one link that carries one all-reduce at a time, in bucket order. Checked on four fixed cases (queueing, "
    "compute-bound, an idle link, one bucket) and 20 random ones drawn at grading time, to 1e-6 ms; calling "
    "the grader's own timeline is refused.",
    hint="walk the buckets in order and keep one number: when the link becomes free. A bucket's "
    "all-reduce cannot start before its gradients are ready, nor before the previous all-reduce has "
    "left the link.",
)
def grade_step_end(step_end_ms: Callable[[list[float], list[float]], float]) -> str:
    """Fixed cases (queueing, compute-bound, idle link, one bucket) and 20 random ones."""
    if not callable(step_end_ms):
        raise Wrong(f"pass the function step_end_ms itself, not {type(step_end_ms).__name__}")
    rng = random.Random(secrets.randbits(32))
    for ready, comm in [*_FIXED, *(_random_case(rng) for _ in range(20))]:
        got, own = calls_during(step_end_ms, lambda code: code is _step_end.__code__, list(ready), list(comm))
        if own:
            raise Wrong("your step_end_ms calls the grader's own timeline: compute the end time yourself.")
        want = _step_end(ready, comm)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise Wrong(f"step_end_ms must return a number of milliseconds, not {type(got).__name__}.")
        if abs(got - want) > 1e-6:
            raise Wrong(
                f"for buckets ready at {ready} ms whose all-reduces take {comm} ms, you return {got:g} ms; "
                f"that is not when the last all-reduce ends (backward itself ends at {ready[-1]:g} ms)."
            )
    return "your timeline matches buckets that start when ready and when the link is free, on 24 cases."
