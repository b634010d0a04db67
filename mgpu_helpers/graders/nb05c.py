"""Used by notebook 05c's exercises: sharding a model with FSDP2 per block with a mixed-precision policy
(05c.1), and one FSDP unit's all-gather and reduce-scatter written by hand with plain collectives on
padded shards, checked against FSDP2 itself (05c.2).

05c.1 calls the student's ``shard(model, mesh, half)`` on 2 real gloo processes and checks what FSDP2
then does: the root, ``embed``, every block and ``head`` are FSDP units, every parameter is a ``DTensor``
sharded on dim 0, each linear layer computes in ``half`` (a forward pre-hook reads the weight's and the
input's dtype), after the forward exactly the units backward needs at once still hold full weights:
``head``, whose backward runs first, and the last block, which FSDP2 all-gathers (prefetches) as the
head's backward begins, so freeing it would only re-gather it at once (head only: one more all-gather in
backward, counted). The others are ``DTensor`` shards again, so the backward all-gathers ``embed`` and
every block but the last, the all-gathers are in ``half`` and the gradients are reduce-scattered in fp32
(:class:`~mgpu_helpers.collectives.CollectiveSpy`, the package's version of notebook 01c's spy),
and the full gradients equal a single-process fp32 run on the whole batch within bf16's rounding (5 %).
The model has 4 blocks (the notebook does not say how many), so "the last block" must be found, not
hard-coded.

05c.2 builds, on 3 gloo ranks, a model with fresh random weights (a new seed every grading, so no
importable builder reproduces them) sharded by FSDP2, runs FSDP2's own forward and backward on each
rank's slice of a batch, and then calls the student's ``gather_full(shard, rows)`` on every parameter's
local shard (``to_local()``: uneven, e.g. 2, 2 and 1 rows of a 5-row weight) and
``scatter_grad(full_grad)`` on every full gradient of a plain copy of the model run on the same slice.
The results must equal FSDP2's ``full_tensor()`` and its gradient shards, and the spy must see exactly
one collective per call: an all-gather of the padded full size (not an all-reduce of a zero-filled
full tensor, which moves twice the bytes), and a reduce-scatter of the padded full size (not an
all-reduce of the whole gradient, DDP's traffic). ``DTensor`` and FSDP's own functions (which would do
the work) are rejected by name and at run time.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..collectives import CollectiveSpy
from ..exercises import Wrong, exercise
from ._ranks import run_ranks

_WIDTH, _CLASSES, _BATCH = 64, 5, 12  # 5 output rows: padded shards; 12 splits over 1, 2 and 3 ranks
_BLOCKS = 4  # 05c.1: the notebook does not name the count, so the last block cannot be hard-coded


class _Block(nn.Module):
    def __init__(self, width: int = _WIDTH) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class _Net(nn.Module):
    """A transformer-shaped stack: an input layer, residual blocks, an output layer."""

    def __init__(self, n_blocks: int = _BLOCKS) -> None:
        super().__init__()
        self.embed = nn.Linear(_WIDTH, _WIDTH)
        self.blocks = nn.ModuleList(_Block() for _ in range(n_blocks))
        self.head = nn.Linear(_WIDTH, _CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _model(seed: int = 0, n_blocks: int = _BLOCKS) -> _Net:
    torch.manual_seed(seed)
    return _Net(n_blocks)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(_BATCH, _WIDTH, generator=g), torch.randint(0, _CLASSES, (_BATCH,), generator=g)


def _my_part(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _batch(step)
    k = _BATCH // world_size
    return x[rank * k : (rank + 1) * k], y[rank * k : (rank + 1) * k]


# --- 05c.1 ------------------------------------------------------------------------------------------


def _shard_rank(rank: int, world_size: int, shard: Callable[..., Any]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = _model()
    # the policies the student builds (reduce_dtype None means param_dtype): torch 2.15 reduces in fp32
    # on gloo whatever the policy says, so there the traffic alone cannot tell a bf16 reduction apart
    policies: list[Any] = []
    original_init = MixedPrecisionPolicy.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        policies.append(self)

    MixedPrecisionPolicy.__init__ = recording_init  # type: ignore[method-assign]
    try:
        returned = shard(model, mesh, torch.bfloat16)
    finally:
        MixedPrecisionPolicy.__init__ = original_init  # type: ignore[method-assign]
    asked = {p.reduce_dtype or p.param_dtype for p in policies} - {None, torch.float32}
    model = model if returned is None else returned
    if not isinstance(model, nn.Module):
        return {"error": f"shard returned {type(model).__name__}, not the model"}
    units = {
        "embed": model.embed,
        **{f"blocks.{i}": b for i, b in enumerate(model.blocks)},
        "head": model.head,
    }
    report: dict[str, Any] = {
        "root": isinstance(model, FSDPModule),
        "not_units": [name for name, unit in units.items() if not isinstance(unit, FSDPModule)],
        "not_sharded": [
            n
            for n, p in model.named_parameters()
            if not (isinstance(p, DTensor) and p.placements == (Shard(0),))
        ],
    }
    if report["not_sharded"]:
        return report
    dtypes: dict[str, tuple[torch.dtype, torch.dtype]] = {}

    def record(name: str, layer: nn.Module, args: tuple[Any, ...]) -> None:
        dtypes.setdefault(name, (layer.weight.dtype, args[0].dtype))

    for name, layer in model.named_modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_pre_hook(functools.partial(record, name))
    x, y = _my_part(0, rank, world_size)
    forward, backward = CollectiveSpy(), CollectiveSpy()
    with forward:
        loss = F.cross_entropy(model(x).float(), y)
    # the units that still hold full (plain) parameters after the forward
    kept = [name for name, unit in units.items() if not isinstance(next(unit.parameters()), DTensor)]
    with backward:
        loss.backward()
    report.update(
        dtypes=dtypes,
        kept=kept,
        gathers=forward.count("all_gather"),
        regathers=backward.count("all_gather"),
        gather_dtypes=sorted({str(c.dtype) for c in forward.calls + backward.calls if c.op == "all_gather"}),
        reduce_dtypes=sorted(
            {str(c.dtype) for c in backward.calls if c.op == "reduce_scatter"} | {str(d) for d in asked}
        ),
        param_dtypes=sorted({str(p.dtype) for p in model.parameters()}),
        grads={n: p.grad.full_tensor() if p.grad is not None else None for n, p in model.named_parameters()},
    )
    return report


@exercise(
    "05c.1",
    "shard per block with a mixed-precision policy",
    task="`shard(model, mesh, half)` returns the model with `embed`, each block and `head` as FSDP units "
    "under the root, computing in `half` with fp32 gradient reduction, and keeping gathered after the "
    "forward exactly the units backward needs at once. On 2 gloo ranks, bf16, an unstated block count: "
    "units, fp32 `Shard(0)` parameters, compute and all-gather dtypes, the units left gathered, backward "
    "all-gathers, and gradients within 5 % of fp32.",
    hint="fully_shard embed, each block and head first (each its own all-gather), the root last; every "
    "call takes the mesh and a MixedPrecisionPolicy (which dtype computes, which reduces the gradients); "
    "per unit, reshard_after_forward decides whether it is gathered again in backward: ask, for each "
    "unit, whether backward needs its weights at once: its backward runs first, or FSDP2 all-gathers it "
    "as the first backward begins.",
)
def grade_shard(shard: Callable[..., Any]) -> str:
    """Run ``shard(model, mesh, torch.bfloat16)`` on 2 gloo ranks and check what FSDP2 then does."""
    if not callable(shard):
        raise Wrong(f"pass your function shard itself, not {type(shard).__name__}.")
    reports = run_ranks(_shard_rank, 2, shard)
    report = reports[0]
    if "error" in report:
        raise Wrong(report["error"] + ".")
    if not report["root"]:
        raise Wrong("the model itself is not an FSDP module: the root was never sharded.")
    if report["not_units"]:
        raise Wrong(
            f"{', '.join(report['not_units'])} {'is' if len(report['not_units']) == 1 else 'are'} not FSDP "
            "units of their own, so their weights are all-gathered together with the root's, all at once."
        )
    if report["not_sharded"]:
        raise Wrong(f"{report['not_sharded'][0]} is not a DTensor sharded on dim 0 (Shard(0)).")
    for name, (weight, given) in report["dtypes"].items():
        if weight != torch.bfloat16 or given != torch.bfloat16:
            raise Wrong(f"layer {name} computed with a {weight} weight on a {given} input, not in bfloat16.")
    if report["param_dtypes"] != ["torch.float32"]:
        raise Wrong(f"the sharded parameters are {report['param_dtypes']}, not fp32 master weights.")
    if report["gather_dtypes"] != ["torch.bfloat16"]:
        raise Wrong(
            f"the weights were all-gathered in {', '.join(report['gather_dtypes'])}: the policy casts each "
            "shard to the compute dtype before the all-gather, halving its bytes."
        )
    if report["reduce_dtypes"] != ["torch.float32"]:
        raise Wrong(f"the gradients were reduce-scattered in {', '.join(report['reduce_dtypes'])}, not fp32.")
    blocks = len(_model().blocks)
    # backward needs these at once: head's backward runs first, and FSDP2 prefetches (all-gathers) the
    # last block as the head's backward begins
    first = ["head", f"blocks.{blocks - 1}"]
    kept = report["kept"]
    if sorted(kept) != sorted(first):
        late = [name for name in kept if name not in first]
        problems = [f"{', '.join(late)} stay gathered until their backward, which comes late"] if late else []
        if "head" not in kept:
            problems.append("head is freed though its backward runs first")
        if first[1] not in kept:
            problems.append(
                f"{first[1]} is freed though FSDP2 all-gathers it again as soon as head's backward begins "
                "(it prefetches the next unit in backward order)"
            )
        raise Wrong(
            f"after the forward, the units holding full weights are {kept or 'none'}: "
            f"{'; '.join(problems)} (the backward ran {report['regathers']} all-gathers)."
        )
    if report["regathers"] != blocks:
        raise Wrong(
            f"the backward pass ran {report['regathers']} all-gathers; with embed and {blocks} blocks it "
            f"needs {blocks}: embed and every block but the last."
        )
    reference = _model()
    x, y = _batch(0)
    F.cross_entropy(reference(x), y).backward()
    worst = 0.0
    for name, p in reference.named_parameters():
        got = report["grads"][name]
        if got is None:
            raise Wrong(f"{name} has no gradient after backward.")
        error = ((got.float() - p.grad).norm() / p.grad.norm()).item()
        if not error < 0.05:
            raise Wrong(
                f"the gradient of {name} differs from a single-process fp32 run on the whole batch by "
                f"{error:.1%} (bf16 rounding explains up to 5 %)."
            )
        worst = max(worst, error)
    return (
        f"on 2 ranks: embed, {blocks} blocks and head are FSDP units ({report['gathers']} all-gathers "
        f"in forward, {report['regathers']} in backward; head and blocks.{blocks - 1} stay gathered), "
        "every parameter is an fp32 Shard(0) DTensor, every layer computes in bf16, gradients are reduced "
        f"in fp32 and are within {worst:.1%} of fp32 single-process gradients"
    )


# --- 05c.2 ------------------------------------------------------------------------------------------

_BY_HAND_RANKS = 3  # 5 head rows -> 2, 2, 1; 64 rows -> 22, 22, 20: uneven shards that need padding
#: What would do the exercise's work for the student: DTensor's own redistribution, FSDP itself.
_READY_MADE = ("from_local", "distribute_tensor", "full_tensor", "redistribute", "fully_shard")


def _expected_bytes(full: torch.Tensor, world_size: int) -> int:
    """The padded full size in bytes: world_size pieces of ceil(rows / world_size) rows each."""
    rows = full.shape[0]
    return world_size * math.ceil(rows / world_size) * (full.numel() // max(rows, 1)) * full.element_size()


def _one_call(spy: CollectiveSpy, op: str, full: torch.Tensor, world_size: int) -> str:
    """'' when the spy saw exactly one ``op`` of the padded full size, else what it saw instead."""
    seen = [(c.op, c.nbytes) for c in spy.calls]
    want = _expected_bytes(full, world_size)
    if not seen:
        return (
            f"no collective ran: the other ranks' pieces cannot reach this rank without one (wanted one {op})"
        )
    if [o for o, _ in seen] != [op]:
        return f"the collectives were {[o for o, _ in seen]}, not one {op}"
    if seen[0][1] != want:
        return (
            f"the {op} moved a full size of {seen[0][1]:,} B, not the padded {want:,} B (every piece padded)"
        )
    return ""


def _by_hand_rank(
    rank: int, world_size: int, gather_full: Callable[..., Any], scatter_grad: Callable[..., Any], seed: int
) -> dict[str, Any]:
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh("cpu", (world_size,))
    model = _model(seed, n_blocks=2)  # fresh random weights at every grading
    plain = copy.deepcopy(model)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(_BATCH, _WIDTH, generator=g), torch.randint(0, _CLASSES, (_BATCH,), generator=g)
    k = _BATCH // world_size
    x, y = x[rank * k : (rank + 1) * k], y[rank * k : (rank + 1) * k]
    F.cross_entropy(model(x), y).backward()  # FSDP2 itself: the reference
    params = dict(model.named_parameters())
    full_ref = {n: p.full_tensor().detach() for n, p in params.items()}

    made: list[str] = []
    problems: list[str] = []  # every rank makes every call (a rank that stopped early would hang the rest)
    real_from_local = DTensor.from_local

    def watched_from_local(*args: Any, **kwargs: Any) -> Any:
        made.append("DTensor.from_local")
        return real_from_local(*args, **kwargs)

    def check(
        fn: str, what: str, got: Any, want: torch.Tensor, spy: CollectiveSpy, op: str, full: torch.Tensor
    ) -> str:
        if made:
            return f"{fn} made a DTensor ({made[0]}): that is FSDP's own {op.replace('_', '-')}"
        odd = _one_call(spy, op, full, world_size)
        if odd:
            return f"{fn}, for {what}: {odd}"
        if not isinstance(got, torch.Tensor) or isinstance(got, DTensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return f"{fn} returned {shape} for {what}, not a plain tensor of shape {tuple(want.shape)}"
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-7):
            diff = (got - want).abs().max().item()
            return f"{fn}'s result for {what} differs from FSDP2's by up to {diff:.3g}"
        return ""

    DTensor.from_local = staticmethod(watched_from_local)  # type: ignore[method-assign]
    try:
        for name, p in params.items():
            local = p.to_local().detach().clone()
            with CollectiveSpy() as spy:
                got = gather_full(local, p.shape[0])
            what = f"{name} (this rank's shard {tuple(local.shape)} of {tuple(p.shape)})"
            problems.append(
                check("gather_full", what, got, full_ref[name], spy, "all_gather", full_ref[name])
            )
        F.cross_entropy(plain(x), y).backward()  # this rank's slice, full weights: this rank's full gradients
        for name, q in plain.named_parameters():
            want = params[name].grad.to_local()
            with CollectiveSpy() as spy:
                got = scatter_grad(q.grad.detach().clone())
            what = f"the gradient of {name} (FSDP2 averages the ranks' gradients)"
            problems.append(check("scatter_grad", what, got, want, spy, "reduce_scatter", q.grad))
    finally:
        DTensor.from_local = staticmethod(real_from_local)  # type: ignore[method-assign]
    found = [p for p in problems if p]
    if found:
        return {"problem": found[0]}
    return {"problem": "", "params": len(params)}


@exercise(
    "05c.2",
    "one FSDP unit's all-gather and reduce-scatter by hand",
    task="`gather_full(shard, rows)` → the full parameter from this rank's dim-0 piece and its row count; "
    "`scatter_grad(full_grad)` → this rank's piece of the gradient averaged over the ranks. On 3 gloo "
    "ranks, with fresh random weights sharded by FSDP2 (uneven pieces), they must return FSDP2's "
    "`full_tensor()` and gradient shards, each call making exactly one all-gather or reduce-scatter of the "
    "padded full size; DTensor and `fully_shard` are refused.",
    hint="all_gather_single and reduce_scatter_single need pieces of one size: pad every piece to "
    "ceil(rows / world size) rows with zeros before the collective and drop the padding after; FSDP2 "
    "averages the gradients, the collective sums them.",
    forbid=_READY_MADE,
)
def grade_by_hand(gather_full: Callable[..., Any], scatter_grad: Callable[..., Any]) -> str:
    """Run both on 3 gloo ranks against FSDP2's own all-gathered weights and gradient shards."""
    for name, fn in (("gather_full", gather_full), ("scatter_grad", scatter_grad)):
        if not callable(fn):
            raise Wrong(f"pass your functions gather_full and scatter_grad; {name} is a {type(fn).__name__}.")
    seed = int.from_bytes(os.urandom(4), "little")
    reports = run_ranks(_by_hand_rank, _BY_HAND_RANKS, gather_full, scatter_grad, seed)
    for rank, report in enumerate(reports):
        if report["problem"]:
            raise Wrong(f"rank {rank}: {report['problem']}.")
    return (
        f"on {_BY_HAND_RANKS} ranks, for all {reports[0]['params']} parameters (uneven shards included), one "
        "all-gather of the padded size gives FSDP2's full weights and one reduce-scatter its gradient shards"
    )
