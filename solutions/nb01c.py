"""Reference solutions of notebook 01c's exercises, typical wrong attempts and known shortcuts
(run by tests/test_solutions.py)."""

import importlib

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from mgpu_helpers.collectives import _NAMES, _tensors, all_gather_single

# --- 01c.1 ----------------------------------------------------------------------------------------


class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class SwappedCopy(torch.autograd.Function):
    """Wrong: Copy with Reduce's directions (all-reduce forward, identity backward)."""

    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class TorchsAllReduceAsReduce(torch.autograd.Function):
    """Shortcut: torch's differentiable all-reduce, whose backward all-reduces again (gradient × N)."""

    @staticmethod
    def forward(ctx, partial):
        return partial.clone()

    @classmethod
    def apply(cls, partial):  # type: ignore[override]
        import torch.distributed.nn.functional as dnf

        return dnf.all_reduce(partial)


class GatherAndSumCopy(torch.autograd.Function):
    """Shortcut: every rank fetches every rank's gradient and adds them (N× the bytes of an all-reduce)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        parts = torch.empty(dist.get_world_size() * grad.numel())
        all_gather_single(parts, grad.contiguous().flatten())
        return parts.view(-1, *grad.shape).sum(0)


class GatherAndSumReduce(torch.autograd.Function):
    """Shortcut: the forward's sum by gathering everything."""

    @staticmethod
    def forward(ctx, partial):
        parts = torch.empty(dist.get_world_size() * partial.numel())
        all_gather_single(parts, partial.contiguous().flatten())
        return parts.view(-1, *partial.shape).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ScaledCopy(torch.autograd.Function):
    """Shortcut: no communication, assuming every rank's gradient is the same (grad × world size)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * dist.get_world_size()


class PlainAllReduce:
    """Shortcut: dist.all_reduce outside any autograd.Function (autograd does not see it)."""

    @staticmethod
    def apply(partial):
        total = partial * 1
        dist.all_reduce(total)
        return total


# --- 01c.2 ----------------------------------------------------------------------------------------

NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
}


class Spy(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        namespace, _, name = func.name().partition("::")
        op = NAMES.get(name.strip("_"))
        if op is not None:
            functional = namespace == "_c10d_functional"
            if op == "all_gather":
                full = out if functional else args[0]
            elif op == "reduce_scatter":
                full = args[0] if functional else args[1]
            else:
                full = args[0]
            full = full[0] if isinstance(full, (list, tuple)) else full
            self.calls.append((op, full.numel() * full.element_size()))
        return out


class SpyOfInputs(TorchDispatchMode):
    """Wrong: notes the first tensor handed in (an all-gather's input is one rank's piece)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        namespace, _, name = func.name().partition("::")
        op = NAMES.get(name.strip("_"))
        if op is not None:
            first = args[0] if namespace == "_c10d_functional" or op != "all_gather" else args[1]
            first = first[0] if isinstance(first, (list, tuple)) else first
            self.calls.append((op, first.numel() * first.element_size()))
        return out


def _package_spy_class():
    return importlib.import_module("mgpu_helpers.collectives").__dict__["Collective" + "Spy"]


class RenamedPackageSpy(_package_spy_class()):
    """Shortcut: the package's spy under another name."""


class DelegatingSpy(TorchDispatchMode):
    """Shortcut: lets the package's spy do the dispatch and copies its answer."""

    def __init__(self):
        super().__init__()
        self.inner = _package_spy_class()()

    @property
    def calls(self):
        return [(c.op, c.nbytes) for c in self.inner.calls]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.inner.__torch_dispatch__(func, types, args, kwargs)


class LargestTensorSpy(TorchDispatchMode):
    """Correct variant: the full tensor is the largest one a collective touches (the gathered output,
    the reduce-scatter's input, the all-reduce's one tensor)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = NAMES.get(func.name().partition("::")[2].strip("_"))
        if op is not None:
            sizes = [
                t.numel() * t.element_size()
                for t in pytree.tree_leaves((args, out))
                if isinstance(t, torch.Tensor)
            ]
            self.calls.append((op, max(sizes)))
        return out


class CopiedPackageSpy(TorchDispatchMode):
    """Shortcut: CollectiveSpy's source pasted in, with the package's private name table and helper."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        namespace, _, name = func.name().partition("::")
        op = _NAMES.get(name.strip("_"))
        if namespace in ("c10d", "_c10d_functional") and op is not None:
            if op == "all_gather":
                full = _tensors(args[0] if namespace == "c10d" else out)
            elif op == "reduce_scatter":
                full = _tensors(args[1] if namespace == "c10d" else args[0])
            else:
                full = _tensors(args[0])
            self.calls.append((op, sum(t.numel() * t.element_size() for t in full)))
        return out


class PatchingSpy:
    """Shortcut: wraps torch.distributed's Python functions instead of watching the dispatcher
    (DTensor's collectives never go through them)."""

    def __init__(self):
        self.calls = []
        self.saved = {}

    def __enter__(self):
        def wrap(name, op, which):
            real = getattr(dist, name)

            def counted(*args, **kwargs):
                t = args[which]
                self.calls.append((op, t.numel() * t.element_size()))
                return real(*args, **kwargs)

            self.saved[name] = real
            setattr(dist, name, counted)

        wrap("all_reduce", "all_reduce", 0)
        for name in ("all_gather_single", "all_gather_into_tensor"):  # torch >= 2.13 / older
            if hasattr(dist, name):
                wrap(name, "all_gather", 0)
        for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            if hasattr(dist, name):
                wrap(name, "reduce_scatter", 1)
        return self

    def __exit__(self, *exc):
        for name, real in self.saved.items():
            setattr(dist, name, real)


SOLUTIONS = {"01c.1": (Copy, Reduce), "01c.2": (Spy,)}
WRONG = {"01c.1": (SwappedCopy, Reduce), "01c.2": (SpyOfInputs,)}
SHORTCUTS = {
    "01c.1": {
        "torch_differentiable_all_reduce_as_Reduce": (Copy, TorchsAllReduceAsReduce),
        "all_gather_and_sum_in_Copy": (GatherAndSumCopy, Reduce),
        "all_gather_and_sum_in_Reduce": (Copy, GatherAndSumReduce),
        "no_communication_grad_times_world_size": (ScaledCopy, Reduce),
        "plain_dist_all_reduce_outside_autograd": (Copy, PlainAllReduce),
    },
    "01c.2": {
        "package_spy_renamed": (RenamedPackageSpy,),
        "package_spy_inside": (DelegatingSpy,),
        "patch_torch_distributed_functions": (PatchingSpy,),
        "package_spy_source_with_private_names": (CopiedPackageSpy,),
    },
}
VARIANTS = {"01c.2": {"largest_tensor_is_the_full_one": (LargestTensorSpy,)}}
