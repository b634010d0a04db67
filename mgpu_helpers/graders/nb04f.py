"""Used by notebook 04f's exercises: a ZeRO-1 Adam (04f.1) run on 2 real gloo processes started with
:func:`mgpu_helpers.launching.launch`, and the bytes one rank sends per step (04f.2), a plain function.

04f.1 builds the student's ``cls(params, lr)`` on 2 ranks around a float64 MLP whose widths and weights
are drawn at grading time (the same weights on both ranks), and runs 3 steps (forward on the rank's own
samples, ``backward()``, ``step()``). Checks: every rank's parameters equal one process's
``torch.optim.Adam`` on all samples after each step; the Adam state that the object's optimizers hold
(every ``torch.optim.Optimizer`` reachable through its attributes) covers each parameter element once
over the ranks (padding up to N - 1 elements allowed), no rank holding much more than its share; and the
updated parameters really travel: in a fourth step the grader adds a mark to what ``dist.all_gather``
(or ``all_gather_into_tensor``) and ``dist.broadcast`` deliver from the *other* rank, and every rank's
parameters must show it. torch's ``ZeroRedundancyOptimizer`` is not accepted.

04f.2 calls the student's ``bytes_sent(n_params, world_size, bytes_per_number, method)`` on fixed and
random cases of DDP, ZeRO-1 with an all-reduce and ZeRO-1 with a reduce-scatter, against a ring's bytes
per rank; calling the grader's own count is refused.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, calls_during, exercise
from ._ranks import run_ranks

_STEPS = 3  # Adam's state after 3 steps: a dropped or reset state shows
_LR = 0.01
_MARK = 1000.0  # added by the grader to what arrives from another rank in the probe step


def _model(widths: tuple[int, ...], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).double()


def _batch(widths: tuple[int, ...], seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 7 + step)
    return torch.randn(8, widths[0], dtype=torch.float64, generator=gen), torch.randint(
        0, widths[-1], (8,), generator=gen
    )


def _optimizers(obj: Any, depth: int = 0, seen: set[int] | None = None) -> list[torch.optim.Optimizer]:
    """Every torch.optim.Optimizer reachable from ``obj`` through attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4 or isinstance(obj, (torch.Tensor, str, bytes, int, float)):
        return []
    seen.add(id(obj))
    found = [obj] if isinstance(obj, torch.optim.Optimizer) else []
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif isinstance(obj, torch.optim.Optimizer):
        children = [v for k, v in vars(obj).items() if k not in ("state", "param_groups")]
    elif hasattr(obj, "__dict__") and not isinstance(obj, (nn.Module, type)):
        children = list(vars(obj).values())
    else:
        children = []
    for child in children:
        found += _optimizers(child, depth + 1, seen)
    return found


def _state_elements(optimizers: list[torch.optim.Optimizer]) -> int:
    """Elements of the optimizers' state tensors of one dimension or more (Adam: exp_avg, exp_avg_sq)."""
    seen: set[int] = set()
    total = 0
    for opt in optimizers:
        for state in opt.state.values():
            for t in state.values():
                if isinstance(t, torch.Tensor) and t.dim() > 0 and id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel()
    return total


def _marking(rank: int, real: dict[str, Any]) -> dict[str, Any]:
    """Wrappers of all_gather and broadcast that add _MARK to what arrives from another rank."""

    def done(handle: Any) -> None:
        if handle is not None:
            handle.wait()

    def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        handle = real["all_gather"](tensor_list, tensor, *args, **kwargs)
        done(handle)
        for j, t in enumerate(tensor_list):
            if j != rank:
                t += _MARK
        return handle

    def broadcast(tensor: torch.Tensor, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        handle = real["broadcast"](tensor, src, *args, **kwargs)
        done(handle)
        if src != rank:
            tensor += _MARK
        return handle

    def into_tensor(name: str) -> Any:  # all_gather_into_tensor / all_gather_single: one output tensor
        def gather(output: torch.Tensor, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            handle = real[name](output, tensor, *args, **kwargs)
            done(handle)
            for j, piece in enumerate(output.chunk(max(1, output.numel() // max(1, tensor.numel())))):
                if j != rank:
                    piece += _MARK
            return handle

        return gather

    wrapped = {"all_gather": all_gather, "broadcast": broadcast}
    return wrapped | {name: into_tensor(name) for name in real if name not in wrapped}


def _zero_rank(rank: int, world_size: int, cls: Any, widths: tuple[int, ...], seed: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    model = _model(widths, seed)  # the same weights on every rank
    opt = cls(model.parameters(), _LR)
    after = []
    for step in range(_STEPS + 1):
        model.zero_grad(set_to_none=True)
        x, y = _batch(widths, seed + rank, step)  # each rank its own samples
        F.cross_entropy(model(x), y).backward()
        if step < _STEPS:
            opt.step()
        else:  # the probe: what arrives from the other rank carries a mark
            names = ("all_gather", "broadcast", "all_gather_into_tensor", "all_gather_single")
            real = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
            for module in (dist, c10d):
                for name, fn in _marking(rank, real).items():
                    setattr(module, name, fn)
            try:
                opt.step()
            finally:
                for module in (dist, c10d):
                    for name, fn in real.items():
                        setattr(module, name, fn)
        after.append([p.detach().clone() for p in model.parameters()])
    optimizers = _optimizers(opt)
    return {
        "after": after,
        "n_optimizers": len(optimizers),
        "torch_zero": any(type(o).__name__ == "ZeroRedundancyOptimizer" for o in optimizers),
        "state": _state_elements(optimizers),
    }


def _reference(widths: tuple[int, ...], seed: int, world_size: int) -> list[list[torch.Tensor]]:
    model = _model(widths, seed)
    adam = torch.optim.Adam(model.parameters(), lr=_LR)
    out = []
    for step in range(_STEPS + 1):
        adam.zero_grad(set_to_none=True)
        batches = [_batch(widths, seed + r, step) for r in range(world_size)]
        loss = sum(F.cross_entropy(model(x), y) for x, y in batches) / world_size  # equal shares
        loss.backward()
        adam.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out


@exercise(
    "04f.1",
    "a sharded Adam (ZeRO-1)",
    task="Finish `ShardedAdam(params, lr)`: each rank keeps Adam state for its own share of the parameters "
    "only, yet after `step()` every rank holds what one Adam on all samples gives. On 2 gloo ranks (MLP and "
    "data drawn at grading): the parameters after each of 3 steps against `torch.optim.Adam`; the moments of "
    "the optimizers it holds cover each element once over the ranks, about evenly; a mark added to what "
    "`dist.all_gather`/`dist.broadcast` deliver must reach the parameters. `ZeroRedundancyOptimizer` is "
    "refused.",
    hint="in __init__, cut the flattened parameters into N equal slices (section 2's flatten(params, N) "
    "pads them; .chunk(N)[rank]) and build torch.optim.Adam over a Parameter holding your slice only. In "
    "step(): flatten the gradients, all-reduce and divide by N, give your slice's part to your Parameter's "
    ".grad, step your Adam, then dist.all_gather every rank's updated slice into the chunks of one flat "
    "tensor and copy_into the model's parameters (section 2).",
    forbid=("ZeroRedundancyOptimizer",),
)
def grade_sharded_adam(cls: Any) -> str:
    """2 gloo ranks, a drawn float64 MLP, 3 steps: parameters, state per rank, updates that travel."""
    if not callable(cls):
        raise Wrong(f"pass the class itself, not {type(cls).__name__}")
    seed = 1000 + secrets.randbelow(10**6)
    g = torch.Generator().manual_seed(seed)
    widths = tuple(int(w) for w in torch.randint(8, 25, (4,), generator=g))
    widths += (int(torch.randint(2, 6, (1,), generator=g)),)  # 4 Linear layers, 2 to 5 classes
    ranks = run_ranks(_zero_rank, 2, cls, widths, seed)
    n = len(ranks)
    expected = _reference(widths, seed, n)
    sizes = [p.numel() for p in expected[0]]
    psi = sum(sizes)
    for step in range(_STEPS):
        for rank, got in enumerate(ranks):
            pairs = zip(got["after"][step], expected[step], strict=True)
            diff = max((a - b).abs().max().item() for a, b in pairs)
            if not diff < 1e-10:
                others = max(
                    (a - b).abs().max().item()
                    for a, b in zip(ranks[0]["after"][step], ranks[1]["after"][step], strict=True)
                )
                apart = " The ranks' parameters also differ from each other." if others > 1e-10 else ""
                raise Wrong(
                    f"after step {step + 1}, rank {rank}'s parameters differ from one process's "
                    f"torch.optim.Adam(lr={_LR}) on all {8 * n} samples by up to {diff:.3g}.{apart}"
                )
    if any(r["torch_zero"] for r in ranks):
        raise Wrong("your object holds torch's ZeroRedundancyOptimizer: write the sharding yourself.")
    for rank, r in enumerate(ranks):
        if r["n_optimizers"] == 0 or r["state"] == 0:
            raise Wrong(
                f"rank {rank}'s object holds no torch.optim optimizer with state: keep the Adam that steps "
                "this rank's shard as an attribute (the grader measures its state)."
            )
    total = sum(r["state"] for r in ranks)
    share = -(-psi // n)
    per_rank = ", ".join(f"rank {i}: {r['state'] // 2:,}" for i, r in enumerate(ranks))
    if not 2 * psi <= total <= 2 * (psi + n - 1):
        raise Wrong(
            f"the model has {psi:,} parameter elements, and the ranks hold Adam moments for {per_rank} "
            f"elements ({total // 2:,} together): in ZeRO-1 each element's exp_avg and exp_avg_sq live on "
            "exactly one rank."
        )
    if any(r["state"] > 2 * (share + max(sizes)) for r in ranks):
        raise Wrong(
            f"the shares are far from even ({per_rank} of {psi:,} elements): each rank should own "
            f"about 1/{n}."
        )
    for rank, r in enumerate(ranks):
        moved = sum(
            int(((a - b).abs() > _MARK / 2).sum())
            for a, b in zip(r["after"][_STEPS], expected[_STEPS], strict=True)
        )
        if moved == 0:
            raise Wrong(
                "in a fourth step the grader marked what dist.all_gather (or all_gather_into_tensor) and "
                f"dist.broadcast delivered to rank {rank} from the other rank, and rank {rank}'s parameters "
                "did not change: the other rank's shard was computed locally, or it came through another "
                "collective (an all_reduce of zero-padded slices sends twice an all-gather's bytes). The "
                "other rank's updated shard must reach this rank through dist.all_gather or dist.broadcast."
            )
    return (
        f"on {n} real gloo processes, a drawn MLP of {psi:,} parameters: equal to torch.optim.Adam on all "
        f"samples after {_STEPS} steps; Adam moments per rank ({per_rank} elements) cover the model once; "
        "the other rank's updated parameters arrived through the collectives."
    )


# --- 04f.2: what one rank sends per step -----------------------------------------------------------------

_METHODS = ("ddp", "zero1_all_reduce", "zero1_reduce_scatter")


def _sent(n_params: int, world_size: int, bytes_per_number: int, method: str) -> float:
    share = (world_size - 1) / world_size * n_params * bytes_per_number  # one ring pass over the rank's data
    return {"ddp": 2 * share, "zero1_all_reduce": 3 * share, "zero1_reduce_scatter": 2 * share}[method]


_FIXED_SENT = ((9_924, 2, 4), (924_682, 2, 4), (7 * 10**9, 8, 2), (10**6, 1, 4), (1_000, 5, 8))


@exercise(
    "04f.2",
    "what one rank sends per step",
    task="`bytes_sent(n_params, world_size, bytes_per_number, method)` → the bytes one rank sends per "
    "training step on a ring, for `method` 'ddp', 'zero1_all_reduce' and 'zero1_reduce_scatter', padding "
    "ignored. Checked for the three methods on 5 fixed cases (one with N = 1) and 8 drawn at grading time, "
    "to a relative 1e-6; calling the grader's own count is refused.",
    hint="on a ring, each of the N ranks sends (N - 1)/N of the data once in a reduce-scatter and once in "
    "an all-gather; an all-reduce is a reduce-scatter followed by an all-gather. Count which collectives "
    "each method runs on Ψ numbers of bytes_per_number bytes.",
)
def grade_bytes_sent(bytes_sent: Any) -> str:
    """Fixed and random cases of the three methods, against the ring's per-rank volume."""
    if not callable(bytes_sent):
        raise Wrong(f"pass the function bytes_sent itself, not {type(bytes_sent).__name__}")
    rng = torch.Generator().manual_seed(secrets.randbits(32))
    randoms = [
        (int(torch.randint(1, 10**9, (1,), generator=rng)), int(torch.randint(2, 65, (1,), generator=rng)), 2)
        for _ in range(8)
    ]
    for n_params, world, b in (*_FIXED_SENT, *randoms):
        for method in _METHODS:
            args = (n_params, world, b, method)
            got, own = calls_during(bytes_sent, lambda code: code is _sent.__code__, *args)
            if own:
                raise Wrong("your bytes_sent calls the grader's own count: write the formula.")
            want = _sent(*args)
            if not isinstance(got, (int, float)) or isinstance(got, bool):
                raise Wrong(f"bytes_sent must return a number of bytes, not {type(got).__name__}.")
            if abs(got - want) > 1e-6 * max(1.0, want):
                raise Wrong(
                    f"for Ψ = {n_params:,} numbers of {b} bytes on N = {world} ranks, method {method!r}, you "
                    f"return {got:,.0f} bytes per rank; that is not what the ring sends."
                )
    return f"your counts match the ring's bytes per rank for the 3 methods on {len(_FIXED_SENT) + 8} cases."
