"""Used by notebook 04a's exercises: a ring all-reduce from point-to-point messages (04a.1) and one DDP
training step whose gradients equal one process on the whole batch (04a.2), each run on real gloo
processes started with :func:`mgpu_helpers.launching.launch`.

04a.1 runs the student's ``ring_all_reduce(tensor)`` on 3 ranks (so that a ring differs from "everybody
sends to rank 0") on float64 tensors of an awkward length and of two dimensions, compares each result
with ``dist.all_reduce`` on a copy, and counts the bytes each rank hands to ``send``/``isend`` (also
inside ``batch_isend_irecv``): a ring sends about 2(N-1)/N times the tensor per rank.

04a.2 runs the student's ``ddp_step(rank, world_size, model, x, y)`` on 2 ranks, with a global batch of
8 and then of 7 samples (uneven shards), each rank starting from *different* weights drawn from a seed
chosen at grading time, and compares every rank's gradients with those of one process on the whole batch
from rank 0's weights. It also checks that each rank's model ran forward on its own share only (a hook
that deep copies share, so a copy run on the whole batch is counted too) and that every rank's final
gradient is the average of what the ranks' own backward passes produced (hooks on the parameters), so a
full-batch gradient computed on a copy or on a rebuilt model and written into ``p.grad`` is rejected.

04a.1 also checks that each rank sends only to its right neighbour: the ring, not another all-gather
with the same byte count; and a dispatch mode (:class:`~mgpu_helpers.collectives.CollectiveSpy`) notes
every collective that reaches the process group, so one called past the ``dist.*`` functions is caught.

"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..collectives import CollectiveSpy
from ..exercises import Wrong, exercise
from ._ranks import run_ranks

# --- 04a.1: ring all-reduce ---------------------------------------------------------------------------

_COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "gather", "scatter")


def _ring_rank(rank: int, world_size: int, ring_all_reduce: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
    """Run the student's ring on this rank with send/isend counted and collectives noted."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = {name: getattr(dist, name) for name in (*_COLLECTIVES, "send", "isend", "batch_isend_irecv")}
    counted = {"bytes": 0, "collectives": set(), "inside": False, "peers": set()}

    def counter(name: str) -> Callable[..., Any]:
        def call(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if counted["inside"]:  # torch's send may call isend: count each message once
                return real[name](tensor, *args, **kwargs)
            counted["bytes"] += tensor.numel() * tensor.element_size()
            counted["peers"].add(args[0] if args else kwargs.get("dst", kwargs.get("group_dst")))
            counted["inside"] = True
            try:
                return real[name](tensor, *args, **kwargs)
            finally:
                counted["inside"] = False

        return call

    def batch(ops: list[Any]) -> Any:
        sends = [op for op in ops if op.op in (patched["isend"], real["isend"])]
        counted["bytes"] += sum(op.tensor.numel() * op.tensor.element_size() for op in sends)
        counted["peers"].update(op.peer for op in sends)
        counted["inside"] = True
        try:
            return real["batch_isend_irecv"](ops)
        finally:
            counted["inside"] = False

    def noted(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counted["collectives"].add(name)
            return real[name](*args, **kwargs)

        return call

    patched = {"send": counter("send"), "isend": counter("isend")}
    patched["batch_isend_irecv"] = batch
    patched.update({name: noted(name) for name in _COLLECTIVES})
    for module in (dist, c10d):  # P2POp checks its op against c10d's own isend/irecv
        for name, fn in patched.items():
            setattr(module, name, fn)
    try:
        results = []
        for shape in ((1000,), (3, 5)):
            gen = torch.Generator().manual_seed(10 * rank + len(shape))
            x = torch.randn(shape, dtype=torch.float64, generator=gen)
            mine, reference = x.clone(), x.clone()
            counted["bytes"] = 0
            with CollectiveSpy() as spy:  # sees the process group's own calls too, past the dist.* names
                ring_all_reduce(mine)
            sent = counted["bytes"]
            counted["collectives"].update(c.op for c in spy.calls if c.op not in ("send", "recv"))
            real["all_reduce"](reference)
            results.append(
                {
                    "shape": shape,
                    "diff": (mine - reference).abs().max().item(),
                    "sent": sent,
                    "unchanged": torch.equal(mine, x),
                    "bytes": x.numel() * x.element_size(),
                }
            )
        return {
            "results": results,
            "collectives": sorted(counted["collectives"]),
            "peers": sorted(counted["peers"], key=str),
        }
    finally:
        for module in (dist, c10d):
            for name, fn in real.items():
                setattr(module, name, fn)


@exercise(
    "04a.1",
    "a ring all-reduce from send/recv",
    task="`ring_all_reduce(tensor)` sums `tensor` over all ranks in place, like `dist.all_reduce`, with "
    "point-to-point messages only. Checked on 3 gloo ranks with float64 tensors of shapes (1000,) and (3, 5) "
    "against `dist.all_reduce`; the bytes each rank hands to send/isend must be 2(N-1)/N of the tensor "
    "(within 5 %), all to its right neighbour, and no collective may run.",
    hint="the all-gather is all index arithmetic. After ring_reduce_scatter rank r owns the finished "
    "chunk (r + 1) % N. At each all-gather step a rank sends the newest finished chunk it has (its own at "
    "the first step, then the one it has just received) and receives the chunk its left neighbour sends, "
    "whose index is one lower (mod N) than the one it sends itself; the receiving index at one step is the "
    "sending index at the next. Write the two indices out for N = 3, rank by rank and step by step, and "
    "check that every rank ends with all N chunks. Received chunks are copied in, not added.",
)
def grade_ring(ring_all_reduce: Callable[[torch.Tensor], Any]) -> str:
    """3 gloo ranks; results against dist.all_reduce; bytes sent per rank against 2(N-1)/N x size."""
    if not callable(ring_all_reduce):
        raise Wrong(f"pass the function ring_all_reduce itself, not {type(ring_all_reduce).__name__}")
    n = 3
    ranks = run_ranks(_ring_rank, n, ring_all_reduce)
    for rank, out in enumerate(ranks):
        if out["collectives"]:
            raise Wrong(
                f"rank {rank} ran the collective(s) {', '.join(out['collectives'])} (through dist.* or "
                "the process group itself): the exercise builds the all-reduce from point-to-point "
                "messages only."
            )
        for r in out["results"]:
            if r["unchanged"]:
                raise Wrong(
                    f"on rank {rank} the tensor of shape {r['shape']} is unchanged after your call: "
                    "like dist.all_reduce, the sum must end up in the tensor that was passed in."
                )
            if not r["diff"] < 1e-9:
                raise Wrong(
                    f"on rank {rank}, for a tensor of shape {r['shape']}, your result differs from "
                    f"dist.all_reduce by up to {r['diff']:.3g}."
                )
        big = out["results"][0]
        ring = 2 * (n - 1) / n * big["bytes"]
        if not 0.95 * ring <= big["sent"] <= 1.05 * ring + 64:
            raise Wrong(
                f"the sums are right, but rank {rank} sent {big['sent']:,} bytes for a tensor of "
                f"{big['bytes']:,} bytes on {n} ranks ({big['sent'] / big['bytes']:.2f}x the tensor); a ring "
                f"sends 2(N-1)/N = {2 * (n - 1) / n:.2f}x it, the same on every rank."
            )
        if out["peers"] != [(rank + 1) % n]:
            raise Wrong(
                f"the sums and the byte count are right, but rank {rank} sent to ranks {out['peers']}: in a "
                f"ring every rank sends only to its right neighbour, rank (r + 1) % N = {(rank + 1) % n}."
            )
    return (
        f"on {n} real gloo processes your ring matches dist.all_reduce (shapes (1000,) and (3, 5)) and each "
        f"rank sent {ranks[0]['results'][0]['sent']:,} B = 2(N-1)/N x {ranks[0]['results'][0]['bytes']:,} B."
    )


# --- 04a.2: one DDP step --------------------------------------------------------------------------------

_SIZES = (8, 7)  # an even global batch, then one that two ranks cannot split evenly


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    return torch.randn(n, 6, dtype=torch.float64, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def _ddp_step_rank(rank: int, world_size: int, ddp_step: Callable[..., Any], seed: int) -> list[Any]:
    out = []
    for n in _SIZES:
        # Different weights on each rank (only rank 0's may count), from a seed drawn for this grading:
        # rebuilding "rank 0's model" from the grader's helpers gives other weights.
        model = _model(seed + rank)
        # How many samples went through the first layer: a closure, which copies of the model or of
        # the layer (copy.deepcopy, copy.copy) share, so that a copy run on the whole batch counts too.
        rows = [0]

        def count_rows(_module: Any, inputs: tuple[Any, ...], rows: list[int] = rows) -> None:
            rows[0] += len(inputs[0])

        model[0].register_forward_pre_hook(count_rows)
        # What this rank's own backward passes produced for each weight, before DDP averages it (a
        # Parameter's hooks are not copied by deepcopy, and a model built anew has none).
        local = [torch.zeros_like(p) for p in model.parameters()]
        for p, acc in zip(model.parameters(), local, strict=True):

            def keep(grad: torch.Tensor, acc: torch.Tensor = acc) -> None:
                acc.add_(grad.detach())

            p.register_hook(keep)
        x, y = _batch(n)
        ddp_step(rank, world_size, model, x, y)
        out.append(
            (
                [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
                rows[0],
                local,
            )
        )
    return out


@exercise(
    "04a.2",
    "one DDP training step",
    task="`ddp_step(rank, world_size, model, x, y)`: forward and backward through the DDP-wrapped `model` on "
    "this rank's share of the batch, no optimizer step. On 2 gloo ranks from different weights, global "
    "batches of 8 and 7: every rank's `p.grad` must equal one process's full-batch gradient from rank 0's "
    "weights, each model may see only its share, and `p.grad` must average the ranks' own backward passes.",
    hint="Wrap the model in DistributedDataParallel and run it on this rank's share of the batch. DDP "
    "averages the ranks' gradients: with shares of 4 and 3 samples, how much does one sample weigh in the "
    "average of the two ranks' mean losses, and how much in the mean over all 7?",
)
def grade_ddp_step(ddp_step: Callable[..., Any]) -> str:
    """2 gloo ranks, global batches of 8 and 7; every rank's gradients vs one process on the whole batch."""
    if not callable(ddp_step):
        raise Wrong(f"pass the function ddp_step itself, not {type(ddp_step).__name__}")
    seed = 1000 + secrets.randbelow(10**6)  # a fresh case each time: no helper rebuilds rank 0's model
    ranks = run_ranks(_ddp_step_rank, 2, ddp_step, seed)
    for i, n in enumerate(_SIZES):
        reference = _model(seed)
        x, y = _batch(n)
        F.cross_entropy(reference(x), y).backward()
        expected = [p.grad for p in reference.parameters()]
        seen = [out[i][1] for out in ranks]
        if sum(seen) != n or max(seen) == n:
            raise Wrong(
                f"with a global batch of {n} the ranks' models saw {seen} samples: each rank must run "
                f"forward on its own share only, and the shares together make up the batch."
            )
        for rank, out in enumerate(ranks):
            grads = out[i][0]
            if any(g is None for g in grads):
                raise Wrong(
                    f"with a global batch of {n}, rank {rank}'s model has no gradient after your step."
                )
            diff = max((g - e).abs().max().item() for g, e in zip(grads, expected, strict=True))
            if not diff < 1e-9:
                scale = sum((g * e).sum().item() for g, e in zip(grads, expected, strict=True)) / sum(
                    (e * e).sum().item() for e in expected
                )
                shares = "equal shares of 4" if n % 2 == 0 else "shares of 4 and 3"
                times = f" (about {scale:.2f} times it)" if abs(scale - 1) > 0.2 else ""
                raise Wrong(
                    f"with a global batch of {n} ({shares}), rank {rank}'s gradient differs from one "
                    f"process's gradient on the whole batch by up to {diff:.3g}{times}."
                )
        # DDP's all-reduce makes every rank's p.grad the average of what the ranks' backward passes
        # computed on their shares; a gradient computed elsewhere (a copy of the model on the whole
        # batch, a model built anew) and put into p.grad is not.
        local = [out[i][2] for out in ranks]
        if max((a - b).abs().max().item() for a, b in zip(*local, strict=True)) < 1e-12:
            zero = all(t.abs().max().item() == 0 for t in local[0])
            raise Wrong(
                f"with a global batch of {n}, the gradient is right, but the backward passes through both "
                f"ranks' models produced the same gradient{' (zero)' if zero else ''}: each rank's "
                "backward must run through its DDP-wrapped model on its own share of the batch."
            )
        average = [sum(out[i][2][k] for out in ranks) / len(ranks) for k in range(len(expected))]
        for rank, out in enumerate(ranks):
            diff = max((g - a).abs().max().item() for g, a in zip(out[i][0], average, strict=True))
            if not diff < 1e-9:
                raise Wrong(
                    f"with a global batch of {n}, rank {rank}'s gradient is right, but it is not the "
                    "average of what the ranks' own backward passes on their shares computed (off by up "
                    f"to {diff:.3g}): the gradient must come from backward through the DDP-wrapped model "
                    "on each rank's share, not from a copy of the model or a model built anew."
                )
    return (
        "on 2 real gloo processes, starting from different weights, every rank's gradient equals one "
        "process's full-batch gradient, for global batches of 8 and of 7 samples."
    )
