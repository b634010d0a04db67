"""Used by notebook 04b's exercises: repairing the data side of a DDP training function (04b.1) and
gradient accumulation with ``no_sync()`` (04b.2), each run on 2 real gloo processes started with
:func:`mgpu_helpers.launching.launch`.

04b.1 runs the student's ``shard_epochs(dataset, epochs)`` as the only process of each of two simulated
nodes (global ranks 0 and 1, both with ``LOCAL_RANK=0``), then as two processes of one node, on a
24-item dataset for 3 epochs, and checks that each rank picks the GPU of its local rank, that in every
epoch the two ranks see disjoint halves of the dataset, and that every rank's share and order change
from epoch to epoch (a reshuffle, not a rotation). The items are not their indices, so indices from the
sampler, or ``range(24)``, do not pass for items the loader yields.

04b.2 wraps a small float64 model in DDP on each rank, counts the buckets DDP all-reduces (a
communication hook around PyTorch's default one), hands the student's ``accumulate(ddp_model,
micro_batches)`` three micro-batches per rank, checks that each micro-batch's backward pass runs before
the next forward pass (one summed loss and a single backward keeps every activation), and compares every
rank's gradient with one process's gradient on all six micro-batches at once; the gradients must have
been all-reduced exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ._ranks import run_ranks

# --- 04b.1: repair the data side of a DDP script ---------------------------------------------------------

_ITEMS, _EPOCHS = 24, 3


def _items() -> list[int]:
    """The dataset's items: 24 values that are not their own indices."""
    return [100 + 7 * i for i in range(_ITEMS)]


def _shard_rank(rank: int, world_size: int, shard_epochs: Callable[..., Any], one_node: bool) -> Any:
    if one_node:  # one node with two processes: local ranks 0 and 1
        os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", GROUP_RANK="0", NODE_RANK="0")
    else:  # two nodes with one process each: global ranks 0 and 1, local rank 0 on both
        os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank), NODE_RANK=str(rank))
    return shard_epochs(torch.tensor(_items()), _EPOCHS)


@exercise(
    "04b.1",
    "repair a DDP training function",
    task="Repair `shard_epochs(dataset, epochs)` and delete the marker line. On 2 gloo ranks, as two nodes "
    "of one process and as one node of two, 24 items, 3 epochs: each process must pick a GPU its node has "
    "and no other process there uses; in every epoch the ranks' items must be disjoint and cover the "
    "dataset, and each rank's share must change from epoch to epoch.",
    hint="Follow one process through the grader's jobs (2 nodes x 1 GPU, then 1 node x 2 GPUs; 3 epochs): "
    "which GPU number does it pick, and does its node have that GPU? Which items does it see in an epoch, "
    "and which of them does the other rank see too? Does one epoch's order differ from the last one's?",
)
def grade_shard_epochs(shard_epochs: Callable[..., Any]) -> str:
    """2 gloo ranks as 2 nodes x 1 process and as 1 node x 2: GPU index, disjoint shards, new orders."""
    if not callable(shard_epochs):
        raise Wrong(f"pass the function shard_epochs itself, not {type(shard_epochs).__name__}")
    ranks = run_ranks(_shard_rank, 2, shard_epochs, False)
    for rank, out in enumerate(ranks):
        if not isinstance(out, dict) or set(out) != {"gpu", "seen"}:
            raise Wrong(f"rank {rank} returned {out!r:.80}; keep the return value {{'gpu': …, 'seen': …}}.")
        if len(out["seen"]) != _EPOCHS:
            raise Wrong(f"rank {rank} reported {len(out['seen'])} epochs instead of {_EPOCHS}.")
    for rank, out in enumerate(ranks):
        if out["gpu"] != 0:
            raise Wrong(
                f"rank {rank} is the only process on its node, whose one GPU is cuda:0, but it picked "
                f"GPU {out['gpu']!r}."
            )
    one_node = run_ranks(_shard_rank, 2, shard_epochs, True)
    for rank, out in enumerate(one_node):
        gpu = out.get("gpu") if isinstance(out, dict) else None
        if gpu != rank:
            raise Wrong(
                f"on one node with two processes, the process with global rank {rank} picked GPU {gpu!r}; "
                "two processes of a node must not share a GPU."
            )
    items = _items()
    for rank, out in enumerate(ranks):
        strangers = sorted({int(i) for epoch in out["seen"] for i in epoch} - set(items))
        if strangers:
            raise Wrong(
                f"rank {rank} reported {strangers[:4]}{' …' if len(strangers) > 4 else ''}, which are not "
                f"items of the dataset (its items are {items[:3]} …): record what the loader yields."
            )
    for epoch in range(_EPOCHS):
        first, second = (list(map(int, out["seen"][epoch])) for out in ranks)
        both = sorted(set(first) & set(second))
        if both:
            raise Wrong(
                f"in epoch {epoch} both ranks trained on the same items "
                f"{both[:8]}{' …' if len(both) > 8 else ''} "
                f"({len(both)} of {_ITEMS}): rank 0 saw {len(first)} items, rank 1 saw {len(second)}."
            )
        if sorted(first + second) != items:
            raise Wrong(f"in epoch {epoch} the two ranks together did not see every item exactly once.")
    for rank, out in enumerate(ranks):
        orders = [tuple(map(int, s)) for s in out["seen"]]
        for a in range(_EPOCHS):
            for b in range(a + 1, _EPOCHS):
                if orders[a] == orders[b]:
                    raise Wrong(
                        f"rank {rank} saw the same items in the same order in epochs {a} and {b}: "
                        f"{list(orders[a])[:6]} …"
                    )
                if set(orders[a]) == set(orders[b]):
                    raise Wrong(
                        f"rank {rank} saw the same {len(orders[a])} items in epochs {a} and {b}, only in "
                        "another order: each epoch should reshuffle the whole dataset across the ranks."
                    )
    return (
        "on 2 real gloo processes (as 2 nodes x 1 process, and as 1 node x 2 processes) each rank picks the "
        "GPU of its node it was started for, the ranks split the data without overlap in every epoch, and "
        "each epoch brings a new shuffle."
    )


# --- 04b.2: gradient accumulation with no_sync() -----------------------------------------------------------

_MICRO, _PER_MICRO = 3, 4


def _accum_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def _micro_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for j in range(_MICRO):
        gen = torch.Generator().manual_seed(100 * rank + j)
        out.append(
            (
                torch.randn(_PER_MICRO, 6, dtype=torch.float64, generator=gen),
                torch.randint(0, 3, (_PER_MICRO,), generator=gen),
            )
        )
    return out


def _accum_rank(rank: int, world_size: int, accumulate: Callable[..., Any]) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _accum_model()
    ddp_model = DDP(model)
    calls = [0]

    def counting_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses other annotations
        calls[0] += 1
        return allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_hook)
    forwards: list[int] = []  # rows of each forward pass: one per micro-batch, not one concatenated batch
    order: list[str] = []  # "F" per forward pass, "B" when backward reaches that forward's output
    model.register_forward_pre_hook(lambda _m, inputs: forwards.append(len(inputs[0])))

    def after_forward(_m, _inputs, out):  # type: ignore[no-untyped-def]
        order.append("F")
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: order.append("B"))

    model.register_forward_hook(after_forward)
    accumulate(ddp_model, _micro_batches(rank))
    return {
        "forwards": forwards,
        "order": "".join(order),
        "all_reduces": calls[0],
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
    }


@exercise(
    "04b.2",
    "gradient accumulation with no_sync()",
    task="`accumulate(ddp_model, micro_batches)`: forward and backward on each of this rank's `(x, y)` "
    "micro-batches in turn, leaving in `.grad` the gradient of the mean cross-entropy over all ranks' "
    "samples. On 2 gloo ranks with 3 micro-batches of 4: each backward before the next forward, gradients "
    "equal to one process's on all 24 samples, and exactly one DDP all-reduce per rank.",
    hint="Which of the backward passes should DDP not communicate for, and which one must it? "
    "And what must each micro-batch's loss be divided by, so that the accumulated sum is the mean over all "
    "of them?",
)
def grade_accumulate(accumulate: Callable[..., Any]) -> str:
    """2 gloo ranks x 3 micro-batches: gradients vs the large batch, and the number of all-reduces."""
    if not callable(accumulate):
        raise Wrong(f"pass the function accumulate itself, not {type(accumulate).__name__}")
    ranks = run_ranks(_accum_rank, 2, accumulate)
    reference = _accum_model()
    xs, ys = zip(*(mb for rank in range(2) for mb in _micro_batches(rank)), strict=True)
    F.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
    expected = [p.grad for p in reference.parameters()]
    for rank, out in enumerate(ranks):
        if out["forwards"] != [_PER_MICRO] * _MICRO:
            raise Wrong(
                f"rank {rank}'s model ran forward on {out['forwards']} samples; accumulation runs forward "
                f"and backward on each of the {_MICRO} micro-batches of {_PER_MICRO} in turn."
            )
        if out["order"] != "FB" * _MICRO:
            raise Wrong(
                f"rank {rank} ran its forward (F) and backward (B) passes in the order {out['order']}: "
                "accumulation runs each micro-batch's backward before the next forward, so that only one "
                "micro-batch's activations are kept at a time."
            )
        if out["all_reduces"] == 0:
            raise Wrong(
                f"DDP never all-reduced a gradient on rank {rank}: the ranks' gradients were never averaged."
            )
        if out["all_reduces"] > 1:
            raise Wrong(
                f"DDP all-reduced the gradients {out['all_reduces']} times on rank {rank} during one "
                f"accumulation step over {_MICRO} micro-batches; it should communicate once per step."
            )
        if any(g is None for g in out["grads"]):
            raise Wrong(f"rank {rank}'s model has no gradient after your accumulation step.")
        diff = max((g - e).abs().max().item() for g, e in zip(out["grads"], expected, strict=True))
        if not diff < 1e-9:
            scale = sum((g * e).sum().item() for g, e in zip(out["grads"], expected, strict=True)) / sum(
                (e * e).sum().item() for e in expected
            )
            raise Wrong(
                f"rank {rank}'s accumulated gradient differs from the gradient of one process on all "
                f"{2 * _MICRO * _PER_MICRO} samples at once by up to {diff:.3g} "
                f"(it is about {scale:.2f} times it)."
            )
    return (
        f"on 2 real gloo processes, {_MICRO} micro-batches per rank gave the large-batch gradient with a "
        "single all-reduce per rank."
    )
