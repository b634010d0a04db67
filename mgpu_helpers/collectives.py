"""Used by notebooks 01c, 02c, 04f, 05c, 05e, 05f and 05g and the graders of 01c, 02c, 04a, 04c, 05c,
05e and 05g: the course's one communication spy.

:class:`CollectiveSpy` is the spy notebook 01c has the student write: a ``TorchDispatchMode`` that sees
every collective a rank calls — by hand (``dist.all_reduce``), through DTensor, or inside FSDP2 — and
notes it with **one byte convention** used by every notebook that counts bytes:

    ``nbytes`` = the size of the *full* tensor the collective works on: the tensor of an all-reduce or
    broadcast, the gathered output of an all-gather, the input of a reduce-scatter (before it is
    split), the message of a send / recv, all the pieces of a scatter or a gather (one piece × the group's
    size).

With that convention a ring algorithm makes each rank send ``(n-1)/n · nbytes`` for an all-gather or a
reduce-scatter and twice that for an all-reduce (:func:`ring_bytes_sent`), so one number compares
tensor parallelism, DDP and FSDP. Collective *ops* are seen on the calling rank only: run the spy
inside each rank's function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = [
    "Call", "CollectiveSpy", "all_gather_autograd", "all_gather_single", "reduce_scatter_single",
    "ring_bytes_sent",
]  # fmt: skip


def all_gather_single(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``dist.all_gather_single(output, input, ...)``: torch 2.13 renamed ``all_gather_into_tensor`` to it
    (the old name now warns); older torch (Colab's 2.11) has only the old name. Looked up at each call, so
    a grader's wrapper of either ``dist`` name sees calls made through this one."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, *args, **kwargs)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``dist.reduce_scatter_single(output, input, ...)``, or ``reduce_scatter_tensor`` before torch 2.13;
    looked up at each call, as :func:`all_gather_single`."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, *args, **kwargs)


class _AllGather(torch.autograd.Function):
    """All-gather forward, reduce-scatter (a sum) of the output's gradient backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.dim, ctx.group = dim, group
        piece = tensor.movedim(dim, 0).contiguous()  # the collectives concatenate along dimension 0
        out = piece.new_empty((dist.get_world_size(group) * piece.shape[0], *piece.shape[1:]))
        all_gather_single(out, piece, group=group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        whole = grad.movedim(ctx.dim, 0).contiguous()
        out = whole.new_empty((whole.shape[0] // dist.get_world_size(ctx.group), *whole.shape[1:]))
        reduce_scatter_single(
            out, whole, group=ctx.group
        )  # every rank's gradient of this rank's piece, summed
        return out.movedim(0, ctx.dim), None, None


def all_gather_autograd(tensor: torch.Tensor, dim: int, group: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` of ``group`` concatenated along ``dim`` (in rank order), differentiable:
    in the backward the output's gradient is reduce-scattered, so each rank gets the sum over all ranks
    of the gradient of its own piece. (torch's functional ``all_gather_tensor_autograd`` does the same
    but warns about its ``wait_tensor`` in torch 2.10's backward and was renamed in 2.13.)"""
    return _AllGather.apply(tensor, dim, group)


#: Operator names (after the namespace, without underscores at either end) → the course's names.
_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "scatter": "scatter",
    "gather": "gather",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "recv",
}


@dataclass(frozen=True)
class Call:
    """One collective seen by the spy: its name, element type and full-tensor size in bytes, and the
    process group it ran over (its name and size; not compared, so ``Call(op, dtype, nbytes)`` matches)."""

    op: str
    dtype: torch.dtype
    nbytes: int
    group: str = field(default="", compare=False)
    group_size: int = field(default=0, compare=False)


def _group(args: tuple) -> tuple[str, int]:
    """The process group of a c10d op (a ``ProcessGroup`` argument) or a functional one (its name)."""
    c10d = torch._C._distributed_c10d
    for a in args:
        try:
            if isinstance(a, torch.ScriptObject):
                pg = c10d.ProcessGroup.unbox(a)
            elif isinstance(a, str) and a:
                pg = c10d._resolve_process_group(a)
            else:
                continue
        except (RuntimeError, ValueError, TypeError):
            continue
        return pg.group_name, pg.size()
    return "", 0


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class CollectiveSpy(TorchDispatchMode):
    """Notes every collective called while it is active (``with CollectiveSpy() as spy: ...``).

    ``spy.calls`` lists them in order as :class:`Call`; :meth:`count` and :meth:`bytes` sum them by name
    ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "scatter", "gather", "all_to_all", "send",
    "recv").
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        namespace, _, name = func.name().partition("::")
        op = _NAMES.get(name.strip("_"))
        if namespace in ("c10d", "_c10d_functional") and op is not None:
            if op == "all_gather":  # the gathered output: c10d's first argument, or what functional returns
                full = _tensors(args[0] if namespace == "c10d" else out)
            elif op == "reduce_scatter":  # the input before it is split
                full = _tensors(args[1] if namespace == "c10d" else args[0])
            elif op in (
                "scatter",
                "gather",
            ):  # this rank's piece (scatter: output; gather: input) × group size
                size = torch._C._distributed_c10d.ProcessGroup.unbox(args[2]).size()
                full = _tensors(args[0] if op == "scatter" else args[1]) * size
            else:
                full = _tensors(args[0])
            if full:
                nbytes = sum(t.numel() * t.element_size() for t in full)
                self.calls.append(Call(op, full[0].dtype, nbytes, *_group(args)))
        return out

    def count(self, op: str | None = None) -> int:
        """How many collectives named ``op`` (all of them when ``op`` is None) were seen."""
        return sum(op is None or c.op == op for c in self.calls)

    def bytes(self, op: str | None = None) -> int:
        """Their summed full-tensor sizes (the module's byte convention)."""
        return sum(c.nbytes for c in self.calls if op is None or c.op == op)


def ring_bytes_sent(op: str, nbytes: int, world_size: int) -> float:
    """Bytes each rank sends for one collective of full size ``nbytes`` done as a ring of ``world_size``:
    ``(n-1)/n · nbytes`` for an all-gather or a reduce-scatter, twice that for an all-reduce (it is a
    reduce-scatter followed by an all-gather)."""
    n = world_size
    share = (n - 1) / n * nbytes
    if op == "all_reduce":
        return 2 * share
    if op in ("all_gather", "reduce_scatter"):
        return share
    raise ValueError(f"no ring formula for {op!r}: use 'all_reduce', 'all_gather' or 'reduce_scatter'")
