"""Used by notebook 05b's exercises: a per-rank memory budget for DDP, ZeRO-1 and FSDP2, checked against a
real sharded run on 2 gloo processes (05b.1), and activation checkpointing in segments (05b.2).

05b.1 trains one step of fp32 Adam in each setup on two real gloo processes (``DistributedDataParallel``,
``ZeroRedundancyOptimizer``, FSDP2's ``fully_shard``) and counts, on every rank, the bytes of the
parameters, gradients and optimizer state that rank holds (:func:`mgpu_helpers.precision.local_state_bytes`);
the student's budget must be within 5 % of each (the rest is whole-tensor partitioning, FSDP's padding
and Adam's 4-byte step counters). It also checks N = 4 against the formulas of ZeRO's paper.

05b.2 runs 12 residual blocks through the student's ``checkpoint_in_segments`` with 2 and 4 segments and
compares with the plain blocks: the same output and gradients (to 1e-6), at most one block input per
segment kept between forward and backward, and an activation peak under a target fraction of the plain
one (all bytes from :class:`mgpu_helpers.memory.MemoryTracker`). ``checkpoint_sequential``, torch's own
version, is not accepted.

Answer keys are refused by name (``forbid``) and at run time: a profiler hook sees whether the student's
function ends up in the course's predictor (``mgpu_helpers.memory.estimate``), in this grader's own
formulas, or in ``checkpoint_sequential``, however it was imported or renamed.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, calls_during, exercise

_SETUPS = ("DDP", "ZeRO-1", "FSDP2")


def _watched(fn: Callable[..., Any], answer_keys: Callable[[Any], bool], *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)`` and the names of the functions it reached for which ``answer_keys(code)`` is true."""
    result, codes = calls_during(fn, answer_keys, *args)
    return result, [code.co_name for code in codes]


def _is_the_predictor(code: Any) -> bool:
    """The course's memory predictor, or this grader's formulas: the answer to 05b.1."""
    from ..memory import estimate

    return code.co_filename in (estimate.__file__, __file__)


def _refuse(hits: list[str], what: str) -> None:
    if hits:
        raise Wrong(f"your code reached {hits[0]}, {what}: write it yourself.")


_CATEGORIES = ("parameters", "gradients", "optimizer")


def _shard_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8))


def _measure_rank(rank: int, world_size: int) -> dict[str, dict[str, int]]:
    """One fp32 Adam step in each setup on this rank; the bytes it holds right after the step."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..precision import local_state_bytes

    assert dist.get_backend() == "gloo"
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 128, generator=g), torch.randint(0, 8, (16,), generator=g)
    measured = {}
    for setup in _SETUPS:
        model = _shard_model()
        if setup == "FSDP2":
            mesh = init_device_mesh("cpu", (world_size,))
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            net, opt = model, torch.optim.Adam(model.parameters())
            holder = opt
        else:
            net = DDP(model)
            if setup == "ZeRO-1":
                opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
                holder = opt.optim
            else:
                opt = holder = torch.optim.Adam(model.parameters())
        F.cross_entropy(net(x), y).backward()
        opt.step()
        measured[setup] = local_state_bytes(model, holder)
    return measured


def _formula(n_params: int, world_size: int, setup: str) -> dict[str, float]:
    shard = {"DDP": 0, "ZeRO-1": 1, "FSDP2": 3}[setup]
    return {
        "parameters": 4 * n_params / (world_size if shard >= 3 else 1),
        "gradients": 4 * n_params / (world_size if shard >= 2 else 1),
        "optimizer": 8 * n_params / (world_size if shard >= 1 else 1),
    }


def _as_budget(budget: Any, call: str) -> dict[str, float]:
    if not isinstance(budget, dict) or set(budget) != set(_CATEGORIES):
        raise Wrong(f"{call} returned {budget!r}, not a dict with the keys {', '.join(_CATEGORIES)}.")
    for key, value in budget.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise Wrong(f"{call}[{key!r}] is {value!r}, not a number of bytes.")
    return {k: float(v) for k, v in budget.items()}


@exercise(
    "05b.1",
    "a per-rank memory budget, checked against a real sharded run",
    task='`per_rank_bytes(n_params, world_size, setup)` → a dict of the bytes of `"parameters"`, '
    '`"gradients"` and `"optimizer"` one rank holds in fp32 Adam training, for `setup` `"DDP"`, '
    '`"ZeRO-1"` or `"FSDP2"`. For 2 ranks it must be within 5 % of what each rank of a real 2-process '
    "gloo run holds after one step; for 4 and 8 within 1 % of the formulas of ZeRO's paper. The course's "
    "predictor is refused.",
    hint="fp32 Adam keeps 4 bytes of weight, 4 of gradient and 8 of optimizer state per parameter; "
    "ask for each setup which of the three it divides among the ranks.",
    forbid=("predict_memory", "estimate", "_formula"),
)
def grade_budget(per_rank_bytes: Callable[[int, int, str], dict]) -> str:
    """Compare ``per_rank_bytes(n_params, world_size, setup)`` with what 2 real ranks hold."""
    if not callable(per_rank_bytes):
        raise Wrong(f"pass your function per_rank_bytes itself, not {type(per_rank_bytes).__name__}.")
    from ..launching import launch
    from ..models import count_parameters

    psi = count_parameters(_shard_model())

    def budget(n: int, setup: str) -> dict[str, float]:
        result, hits = _watched(per_rank_bytes, _is_the_predictor, psi, n, setup)
        _refuse(hits, "the course's ready-made predictor")
        return _as_budget(result, f"per_rank_bytes({psi}, {n}, {setup!r})")

    budgets = {s: budget(2, s) for s in _SETUPS}
    per_rank = launch(_measure_rank, nprocs=2, backend="gloo", threads_per_process=1)
    worst = 0.0
    for rank, measured in enumerate(per_rank):
        for setup in _SETUPS:
            for cat in _CATEGORIES:
                got, real = budgets[setup][cat], measured[setup][cat]
                error = abs(got - real) / real
                if error > 0.05:
                    raise Wrong(
                        f"for {setup} your budget says {got:,.0f} B of {cat} per rank, but rank {rank} "
                        f"of a real 2-process run holds {real:,} B ({got / real:.3g}x)."
                    )
                worst = max(worst, error)
    for n in (4, 8):  # more ranks than this grader can start: the formulas of ZeRO's paper
        for setup in _SETUPS:
            got, want = budget(n, setup), _formula(psi, n, setup)
            for cat in _CATEGORIES:
                if not math.isclose(got[cat], want[cat], rel_tol=0.01):
                    raise Wrong(
                        f"with N = {n} ranks your {setup} {cat} budget is {got[cat]:,.0f} B, "
                        f"{got[cat] / want[cat]:.3g}x what each of {n} ranks would hold."
                    )
    return (
        f"within {worst:.1%} of the bytes that both ranks of real DDP, ZeRO-1 and FSDP2 runs hold "
        f"(Ψ = {psi:,}), and right for N = 4 and 8"
    )


class _Block(nn.Module):
    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


def _step(
    model: nn.Module, x: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor | None], int, int]:
    """Output, gradients, activation bytes held between forward and backward, and their peak."""
    from ..memory import MemoryTracker

    model.zero_grad(set_to_none=True)
    tracker = MemoryTracker(model)
    with tracker:
        out = forward(x)
        if not isinstance(out, torch.Tensor):
            raise Wrong(f"your function returned {type(out).__name__}, not the output tensor.")
        held = tracker.mark("after forward").bytes["other"]
        if not out.requires_grad:
            raise Wrong("the output does not require grad: backward cannot reach a weight.")
        out.square().mean().backward()
    tracker.close()
    return out.detach(), [p.grad for p in model.parameters()], held, tracker.peak["other"]


_N_BLOCKS = 12
_TARGETS = {2: 0.6, 4: 0.4}  # segments -> the largest allowed activation peak, as a fraction of the plain one


@exercise(
    "05b.2",
    "activation checkpointing in segments, to a memory target",
    task="`checkpoint_in_segments(blocks, x, segments)` → the output of the `nn.Sequential` `blocks` on "
    "`x`, run as `segments` equal groups of consecutive blocks, each checkpointed as one piece. On 12 "
    "residual blocks with 2 and 4 segments: output and every gradient equal the plain blocks' (to 1e-6), at "
    "most `segments` block inputs alive between forward and backward, activation peak ≤ 0.6× and 0.4× the "
    "plain one. `checkpoint_sequential` is refused.",
    hint="checkpoint keeps only the input of whatever it runs and rebuilds that piece's intermediates in "
    "backward: the pieces you hand it decide how many inputs stay alive and how much is rebuilt at once.",
    forbid=("checkpoint_sequential",),
)
def grade_segments(checkpoint_in_segments: Callable[[nn.Module, torch.Tensor, int], torch.Tensor]) -> str:
    """Run ``checkpoint_in_segments(blocks, x, segments)`` on 12 blocks with 2 and 4 segments."""
    if not callable(checkpoint_in_segments):
        raise Wrong(
            f"pass your function checkpoint_in_segments itself, not {type(checkpoint_in_segments).__name__}."
        )
    torch.manual_seed(0)
    blocks = nn.Sequential(*[_Block() for _ in range(_N_BLOCKS)])
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(1))
    one_input = x.numel() * x.element_size()  # the bytes of one block's input (and output)
    out_p, grads_p, _, peak_p = _step(blocks, x, blocks)
    from torch.utils.checkpoint import checkpoint_sequential

    torch_version = inspect.unwrap(checkpoint_sequential).__code__
    hits: list[str] = []

    def run(t: torch.Tensor, segments: int) -> torch.Tensor:
        out, reached = _watched(
            checkpoint_in_segments, lambda code: code is torch_version, blocks, t, segments
        )
        hits.extend(reached)
        return out

    seen = []
    for segments, target in _TARGETS.items():
        out, grads, held, peak = _step(blocks, x, lambda t, s=segments: run(t, s))
        _refuse(hits, "torch's own version of this exercise")
        what = f"with {segments} segments"
        if out.shape != out_p.shape or not torch.allclose(out, out_p, rtol=0, atol=1e-6):
            raise Wrong(f"{what} the output differs from that of the plain blocks.")
        for i, (gp, g) in enumerate(zip(grads_p, grads, strict=True)):
            if g is None:
                raise Wrong(f"{what} parameter tensor {i} got no gradient in backward.")
            if not torch.allclose(g, gp, rtol=0, atol=1e-6):
                diff = (g - gp).abs().max().item()
                raise Wrong(
                    f"{what} parameter tensor {i}'s gradient differs from the plain one by {diff:.3g}."
                )
        if held > (segments + 0.5) * one_input:
            raise Wrong(
                f"{what}, {held / one_input:.1f} block inputs' worth of activations ({held / 2**20:.2f} MiB) "
                f"stay alive between forward and backward; {segments} checkpointed segments keep at most "
                f"{segments}."
            )
        if peak > target * peak_p:
            raise Wrong(
                f"{what} the activation peak is {peak / peak_p:.2f}x that of the plain blocks "
                f"({peak / 2**20:.2f} of {peak_p / 2**20:.2f} MiB); the target is {target}x."
            )
        seen.append(f"{segments} segments: {held / one_input:.0f} inputs kept, peak {peak / peak_p:.2f}x")
    return (
        f"same output and gradients as {_N_BLOCKS} plain blocks; {'; '.join(seen)} (measured by the tracker)"
    )
