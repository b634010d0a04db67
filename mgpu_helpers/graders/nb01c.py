"""Used by notebook 01c's exercises: Megatron's ``Copy`` and ``Reduce`` as autograd functions (01c.1) and a
communication spy of the student's own (01c.2), each run on two real gloo processes started with
:func:`mgpu_helpers.launching.launch`.

01c.1 draws fresh random data on every call (nothing importable rebuilds it), gives each rank a
different downstream computation after ``Copy`` and the same one after ``Reduce``, and compares every
rank's output and input gradient with the same sums done in one process. The package's
:class:`~mgpu_helpers.collectives.CollectiveSpy` checks what each direction communicates: ``Copy`` one
all-reduce of the input's bytes in the backward and nothing in the forward, ``Reduce`` the reverse; a
collective that autograd goes through without knowing it (PyTorch warns) is refused.

01c.2 runs a fixed set of collectives of random sizes — by hand (``dist.all_reduce``,
``all_gather_single``, ``reduce_scatter_single``) and through DTensor's ``redistribute`` — under the
student's spy and under ``CollectiveSpy``, and compares the ``(op, nbytes)`` lists. A spy that lets the
package's spy do the work, or uses its private ``_NAMES`` / ``_tensors``, is refused.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..collectives import CollectiveSpy, all_gather_single, reduce_scatter_single
from ..exercises import Wrong, exercise
from ._ranks import run_ranks

_NPROCS = 2


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _raises_not_implemented(cls: Any) -> bool:
    """True while a class's methods (static ones included) still ``raise NotImplementedError``."""
    for v in vars(cls).values() if isinstance(cls, type) else ():
        fn = getattr(v, "__func__", v)
        fn = getattr(fn, "__wrapped__", fn)  # TorchDispatchMode wraps __torch_dispatch__
        code = getattr(fn, "__code__", None)
        if code is not None and "NotImplementedError" in code.co_names:
            return True
    return False


def _applied(cls: Any, name: str) -> Callable[..., Any]:
    if not hasattr(cls, "apply"):
        raise Wrong(f"pass the class {name} itself (a torch.autograd.Function with forward and backward).")
    return cls.apply


# --- 01c.1: Copy and Reduce -----------------------------------------------------------------------


def _case(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(3, 5, generator=gen),  # Copy's input, the same on every rank
        "w": torch.randn(_NPROCS, 5, 4, generator=gen),  # rank r's downstream weight after Copy
        "g": torch.randn(_NPROCS, 3, 4, generator=gen),  # and the gradient arriving from above it
        "p": torch.randn(_NPROCS, 3, 6, generator=gen),  # Reduce's input on rank r: a partial sum
        "u": torch.randn(3, 6, generator=gen),  # the gradient of Reduce's output, the same everywhere
    }


def _copy_reduce_rank(rank: int, world_size: int, copy: Any, reduce: Any, seed: int) -> dict[str, Any]:
    case, res = _case(seed), {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = case["x"].clone().requires_grad_()
        with CollectiveSpy() as fwd:
            y = copy.apply(x)
        res["copy_out"] = y.detach().clone()
        res["copy_graph"] = y.requires_grad
        with CollectiveSpy() as bwd:
            if y.requires_grad:
                (y @ case["w"][rank]).backward(case["g"][rank])
        res["copy_fwd"], res["copy_bwd"] = fwd.calls, bwd.calls
        res["copy_grad"] = None if x.grad is None else x.grad.clone()
        res["x_after"] = x.detach().clone()

        p = case["p"][rank].clone().requires_grad_()
        with CollectiveSpy() as fwd:
            z = reduce.apply(p)
        res["reduce_out"] = z.detach().clone()
        res["reduce_graph"] = z.requires_grad
        res["p_after"] = p.detach().clone()
        with CollectiveSpy() as bwd:
            if z.requires_grad:
                z.backward(case["u"])
        res["reduce_fwd"], res["reduce_bwd"] = fwd.calls, bwd.calls
        res["reduce_grad"] = None if p.grad is None else p.grad.clone()
    res["untracked"] = any("autograd kernel was not registered" in str(w.message) for w in caught)
    return res


def _ops(calls: list[Any]) -> str:
    return ", ".join(f"{c.op} of {c.nbytes:,} B" for c in calls) or "no collective"


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@exercise(
    "01c.1",
    "Copy and Reduce",
    task="Copy and Reduce, torch.autograd.Functions: Copy's output is its input, Reduce's the sum of the "
    "ranks' partial sums; each direction passes its tensor on or runs one dist.all_reduce, never changing "
    "what it was given. On 2 gloo ranks with fresh random data (a different layer per rank after Copy), "
    "outputs and gradients are compared with one-process sums; CollectiveSpy checks each direction's "
    "collectives and bytes.",
    hint="each forward or backward either passes its tensor on unchanged or adds the ranks' tensors in "
    "one dist.all_reduce (on a clone: never change what you were given); ask which direction has a "
    "different piece on every rank and which already holds the whole.",
)
def grade_copy_reduce(copy: Any, reduce: Any) -> str:
    if _raises_not_implemented(copy) or _raises_not_implemented(reduce):
        raise NotImplementedError
    _applied(copy, "Copy"), _applied(reduce, "Reduce")
    seed = _fresh_seed()
    results = run_ranks(_copy_reduce_rank, _NPROCS, copy, reduce, seed, timeout_s=60.0)
    case = _case(seed)
    x_grad = sum(case["g"][r] @ case["w"][r].T for r in range(_NPROCS))  # one process: both ranks' terms
    total = case["p"].sum(0)
    x_bytes, p_bytes = case["x"].numel() * 4, case["p"][0].numel() * 4
    for rank, res in enumerate(results):
        if res["untracked"]:
            raise Wrong(
                f"on rank {rank} autograd went through a collective it does not know (PyTorch warns that "
                "this 'may lead to silently incorrect behavior'): call dist.all_reduce inside forward or "
                "backward of the autograd.Function, not around it."
            )
        if not torch.equal(res["x_after"], case["x"]) or not torch.equal(res["p_after"], case["p"][rank]):
            raise Wrong(f"on rank {rank} the tensor handed to forward was changed in place: work on a clone.")
        if not _close(res["copy_out"], case["x"]):
            raise Wrong(f"on rank {rank} Copy's forward does not return its input unchanged.")
        if res["copy_fwd"]:
            raise Wrong(
                f"rank {rank}'s Copy forward ran {_ops(res['copy_fwd'])}; every rank already holds x."
            )
        if not res["copy_graph"]:
            raise Wrong(
                f"on rank {rank} Copy's output does not require grad: autograd cannot go back through it."
            )
        if not res["copy_bwd"]:
            raise Wrong(
                f"rank {rank}'s Copy backward communicated nothing, so x.grad lacks the other rank's term "
                "(each rank's layer after Copy is different here)."
            )
        if [(c.op, c.nbytes) for c in res["copy_bwd"]] != [("all_reduce", x_bytes)]:
            raise Wrong(
                f"rank {rank}'s Copy backward ran {_ops(res['copy_bwd'])}: more, or other, communication "
                f"than one collective that leaves every rank the sum of the ranks' {x_bytes:,} B terms."
            )
        if not _close(res["copy_grad"], x_grad):
            raise Wrong(
                f"on rank {rank} x.grad after Copy differs from the sum of both ranks' terms computed in one "
                "process (each rank's layer after Copy is different here)."
            )
        if not res["reduce_fwd"]:
            raise Wrong(
                f"rank {rank}'s Reduce forward communicated nothing, so its output lacks the other rank's "
                "partial sum."
            )
        if [(c.op, c.nbytes) for c in res["reduce_fwd"]] != [("all_reduce", p_bytes)]:
            raise Wrong(
                f"rank {rank}'s Reduce forward ran {_ops(res['reduce_fwd'])}: more, or other, "
                f"communication than one collective that leaves every rank the sum of the ranks' "
                f"{p_bytes:,} B partial sums."
            )
        if not _close(res["reduce_out"], total):
            raise Wrong(f"on rank {rank} Reduce's output is not the sum of the ranks' partial sums.")
        if not res["reduce_graph"]:
            raise Wrong(
                f"on rank {rank} Reduce's output does not require grad: autograd cannot go back through it."
            )
        if res["reduce_bwd"]:
            raise Wrong(
                f"rank {rank}'s Reduce backward ran {_ops(res['reduce_bwd'])}, yet in one process p.grad is "
                "just the gradient of Reduce's output, with nothing of the other rank's in it."
            )
        if not _close(res["reduce_grad"], case["u"]):
            raise Wrong(f"on rank {rank} the partial sum's gradient is not the gradient of Reduce's output.")
    return (
        f"on {_NPROCS} gloo ranks with fresh random data: outputs and gradients equal the one-process sums; "
        "Copy all-reduces once backward, Reduce once forward, nothing else."
    )


# --- 01c.2: a spy of your own ---------------------------------------------------------------------

#: the package's spy, torch's, and the package spy's private name table and helper
_SPY_FORBID = ("CollectiveSpy", "CommDebugMode", "_NAMES", "_tensors")


def _sizes(seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(n) for n in torch.randint(1, 9, (6,), generator=gen)]


def _script(sizes: list[int], world_size: int) -> None:
    """The collectives both spies watch: by hand, then through DTensor."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    a, b, c, d, e, f = sizes
    dist.all_reduce(torch.ones(a))
    all_gather_single(torch.empty(b * world_size, dtype=torch.float64), torch.ones(b, dtype=torch.float64))
    reduce_scatter_single(torch.empty(c), torch.ones(c * world_size))
    mesh = init_device_mesh("cpu", (world_size,))
    DTensor.from_local(torch.ones(d, 3), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    DTensor.from_local(torch.ones(e), mesh, [Partial()]).redistribute(mesh, [Replicate()])
    DTensor.from_local(torch.ones(f * world_size, 2), mesh, [Partial()]).redistribute(mesh, [Shard(0)])


def _spy_rank(rank: int, world_size: int, spy_cls: Any, seed: int) -> dict[str, Any]:
    sizes = _sizes(seed)
    used: list[bool] = []
    real = CollectiveSpy.__torch_dispatch__

    def noting(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        used.append(True)
        return real(self, *args, **kwargs)

    CollectiveSpy.__torch_dispatch__ = noting  # type: ignore[method-assign]
    try:
        spy = spy_cls()
        with spy:
            _script(sizes, world_size)
    finally:
        CollectiveSpy.__torch_dispatch__ = real  # type: ignore[method-assign]
    with CollectiveSpy() as ref:
        _script(sizes, world_size)
    calls = getattr(spy, "calls", None)
    return {
        "calls": None
        if calls is None
        else [(c.op, c.nbytes) if hasattr(c, "op") else tuple(c) for c in calls],
        "ref": [(c.op, c.nbytes) for c in ref.calls],
        "package": bool(used) or isinstance(spy, CollectiveSpy),
    }


@exercise(
    "01c.2",
    "a spy of your own",
    task="Spy, a TorchDispatchMode whose self.calls lists every all-reduce, all-gather and reduce-scatter "
    "as (op, nbytes), nbytes being the full tensor's. On 2 gloo ranks, six collectives of random sizes (by "
    "hand and through DTensor's redistribute) run under your spy and under CollectiveSpy, and the lists "
    "must be equal; CollectiveSpy, CommDebugMode and the package's private _NAMES and _tensors are refused.",
    hint="name each collective from func.name() (the part after '::', underscores stripped, looked up in "
    "NAMES) and size the full tensor: the all-gather's output, the reduce-scatter's input, the "
    "all-reduce's one tensor; the c10d and the functional versions pass them in different places.",
    forbid=_SPY_FORBID,
)
def grade_spy(spy_cls: Any) -> str:
    if not isinstance(spy_cls, type):
        raise Wrong(
            f"pass the class itself (class Spy(TorchDispatchMode): ...), not {type(spy_cls).__name__}."
        )
    if _raises_not_implemented(spy_cls):
        raise NotImplementedError
    if issubclass(spy_cls, CollectiveSpy):
        raise Wrong(
            "your spy is the package's CollectiveSpy under another name: write its dispatch yourself."
        )
    seed = _fresh_seed()
    results = run_ranks(_spy_rank, _NPROCS, spy_cls, seed, timeout_s=60.0)
    for rank, res in enumerate(results):
        if res["package"]:
            raise Wrong(
                f"on rank {rank} the package's CollectiveSpy did the spying: write its dispatch yourself."
            )
        if res["calls"] is None:
            raise Wrong("your spy has no .calls list (of (op, nbytes) pairs).")
        got, want = res["calls"], res["ref"]
        if len(got) != len(want) or any(g[0] != w[0] for g, w in zip(got, want, strict=False)):
            raise Wrong(
                f"rank {rank}'s spy noted the ops {[g[0] for g in got]}; {len(want)} collectives ran "
                f"({', '.join(w[0] for w in want)})."
            )
        for g, w in zip(got, want, strict=True):
            if g[1] != w[1]:
                raise Wrong(
                    f"rank {rank}'s spy noted {g[1]:,} B for an {w[0]} whose full tensor has {w[1]:,} B."
                )
    return (
        f"on {_NPROCS} gloo ranks, collectives of random sizes by hand and through DTensor: your spy noted "
        "the same ops and full-tensor bytes as mgpu_helpers.collectives.CollectiveSpy."
    )
