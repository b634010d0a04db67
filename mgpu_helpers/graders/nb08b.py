"""Used by notebook 08b's exercises: a model parallelised on a 2 × 2 mesh, TP over ``"tp"`` and FSDP2 over
``"dp"`` (08b.1), run on 4 real gloo processes started with :func:`mgpu_helpers.launching.launch`, and
the exact state bytes of rank (0, 0) of such a layout, the most any rank holds (08b.2), a plain function.

08b.1 builds, on each of 4 ranks, a float64 model of residual blocks (``blocks[i].up``: width → hidden,
``blocks[i].down``: hidden → width) and a ``head``, its shape and weights drawn at grading time, and a
2 × 2 mesh with dimensions ``("dp", "tp")``; it calls the student's ``parallelize(model, mesh)``, reads
every parameter's placements, runs one training step (each ``"dp"`` row takes its half of the batch)
and compares the loss and the full (gathered) gradients with one process's on the whole batch. Every
parameter must be sharded over ``"dp"``; each block's ``up`` split by output features and ``down`` by
input features over ``"tp"``; every block an FSDP unit of its own (2 or 3 blocks, so that a plan for
``blocks.0`` alone fails); each rank then holds a quarter of every block's matrices.

08b.2 calls the student's ``busiest_rank_bytes(params, dp, tp)`` on the notebook's 5-row layer and model
and on random models with replicated parameters and rows that ``"dp"`` splits unevenly (hidden sizes divide
by ``tp``: torch's parallel styles fail in forward on an uneven TP split), against the largest count over
every rank of ``torch.chunk``'s split (rank (0, 0)'s: the first piece of every split is the largest); on a
mismatch it names the first parameter counted wrong, with the expected bytes.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ._ranks import run_ranks

# --- 08b.1: TP over "tp", FSDP2 over "dp" ---------------------------------------------------------------

_SHARD_LIKE = ("Shard", "_StridedShard")  # FSDP2 over a TP-sharded dim 0 uses _StridedShard


class _Block(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class _Net(nn.Module):
    def __init__(self, width: int, hidden: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(width, hidden) for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _net(case: dict[str, int]) -> nn.Module:
    torch.manual_seed(case["seed"])
    return _Net(case["width"], case["hidden"], case["blocks"], case["classes"]).double()


def _data(case: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    x = torch.randn(8, case["width"], dtype=torch.float64, generator=gen)
    return x, torch.randint(0, case["classes"], (8,), generator=gen)


def _layout(p: torch.Tensor) -> dict[str, Any] | None:
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return None
    return {
        "dims": p.device_mesh.mesh_dim_names,
        "shape": tuple(p.device_mesh.shape),
        "placements": [(type(pl).__name__, getattr(pl, "dim", None)) for pl in p.placements],
        "local": p.to_local().numel(),
    }


def _step_rank(rank: int, world_size: int, parallelize: Any, case: dict[str, int]) -> dict[str, Any]:
    import logging

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # full_tensor's note
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # a wrong plan's shapes
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _net(case)
    try:
        out = parallelize(model, mesh)
    except ValueError as exc:  # TP applied to parameters FSDP2 already made DTensors on mesh["dp"]
        if "Cannot distribute a DTensor with device mesh" not in str(exc):
            raise
        return {"order": str(exc).splitlines()[0][:200]}
    module = out if isinstance(out, nn.Module) else model
    layouts = {n: _layout(p) for n, p in model.named_parameters()}
    units = [isinstance(block, FSDPModule) for block in model.blocks]
    x, y = _data(case)
    half = slice(4 * mesh["dp"].get_local_rank(), 4 * mesh["dp"].get_local_rank() + 4)
    try:
        loss = F.cross_entropy(module(x[half]), y[half])
        loss.backward()
    except Exception as exc:  # reported after the placements, which say more
        return {
            "layouts": layouts,
            "units": units,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
        }
    total = loss.detach().clone()
    dist.all_reduce(total, group=mesh["dp"].get_group())
    grads, grad_local = {}, {}
    for n, p in model.named_parameters():
        g = p.grad
        grads[n] = None if g is None else (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
        grad_local[n] = None if g is None else (g.to_local() if isinstance(g, DTensor) else g).numel()
    return {
        "layouts": layouts,
        "units": units,
        "loss": (total / 2).item(),
        "grads": grads,
        "grad_local": grad_local,
    }


def _tp_placement(name: str) -> tuple[str, int | None] | None:
    """What the "tp" dimension must hold for this parameter (None: not split over "tp")."""
    if name.endswith("up.weight") or name.endswith("up.bias"):
        return ("Shard", 0)
    if name.endswith("down.weight"):
        return ("Shard", 1)
    if name.endswith("down.bias"):
        return ("Replicate", None)  # added once, after the partial outputs are summed
    return None


def _check_layout(rank: int, name: str, lay: dict[str, Any] | None) -> None:
    if lay is None:
        raise Wrong(
            f"on rank {rank}, {name} is a plain tensor: every parameter must end up a DTensor sharded over "
            "the mesh's 'dp' dimension (a whole copy on every rank is plain data parallelism)."
        )
    dims = tuple(lay["dims"] or (f"unnamed {i}" for i in range(len(lay["placements"]))))
    placements = dict(zip(dims, lay["placements"], strict=True))
    if placements.get("dp", ("",))[0] == "Replicate" and len(dims) == 2:
        raise Wrong(
            f"on rank {rank}, {name} is replicated over 'dp' and sharded over 'tp' ({lay['placements']}): "
            "given the whole 2-D mesh, fully_shard replicates over the first dimension and shards over the "
            "second (HSDP). Here FSDP2 must shard over the 'dp' dimension alone."
        )
    if "dp" not in placements or placements["dp"][0] not in _SHARD_LIKE:
        raise Wrong(
            f"on rank {rank}, {name} lives on a mesh with dimensions {lay['dims']} of shape {lay['shape']} "
            f"with placements {lay['placements']}: it is not sharded over the 'dp' dimension of the mesh "
            "you were given. FSDP2 must shard over mesh['dp'] — not over all 4 ranks, not over 'tp'."
        )
    want = _tp_placement(name)
    got = placements.get("tp")
    if want is None:
        if got is not None and got[0] != "Replicate":
            raise Wrong(
                f"on rank {rank}, {name} is split over 'tp' ({got[0]}, dim {got[1]}); only the blocks' up "
                "and down layers are tensor-parallel here, the head stays whole on every 'tp' rank."
            )
        return
    if got is None:
        raise Wrong(
            f"on rank {rank}, {name} is not split over the mesh's 'tp' dimension: each block's up and down "
            "layers must be tensor-parallel over mesh['tp'] (notebook 02c)."
        )
    if got != want:
        where = f"{got[0]} along dim {got[1]}" if got[1] is not None else got[0]
        raise Wrong(
            f"on rank {rank}, {name} is {where} over 'tp': a block's first layer must "
            "leave its output features split between the 'tp' ranks and the second must take them split "
            "(notebook 02c), so that nothing is gathered in between."
        )


@exercise(
    "08b.1",
    "TP over 'tp', FSDP2 over 'dp'",
    task="parallelize(model, mesh) on a ('dp', 'tp') mesh: every block's up/down pair tensor-parallel over "
    "'tp', the head whole under TP, FSDP2 over 'dp' with one unit per block and one for the root; it returns "
    "the model. On 4 gloo ranks (2 × 2) with a float64 model drawn at grading: every placement read, one "
    "step's loss and full gradients compared with one process's on the whole batch, a quarter of each "
    "block's matrices per rank.",
    hint="section 2's two steps, in the same order, for a model of blocks: a TP plan with an entry for each "
    "block's pair (02c.2 wrote such plans) on the right sub-mesh, then one FSDP2 unit per block before the "
    "root (05c section 1) on the other. Return the model.",
)
def grade_parallelize(parallelize: Callable[[nn.Module, Any], Any]) -> str:
    """4 gloo ranks, a drawn model shape: placements, one step's loss and gradients, bytes per rank."""
    if not callable(parallelize):
        raise Wrong(f"pass the function parallelize itself, not {type(parallelize).__name__}")
    rng = random.Random(secrets.randbits(32))
    case = {
        "seed": rng.randrange(10**6),
        "width": rng.choice((8, 12, 16)),
        "hidden": rng.choice((16, 24, 32)),
        "blocks": rng.choice((2, 3)),  # more than one: a plan for blocks.0 alone must fail
        "classes": rng.choice((3, 5)),
    }
    ranks = run_ranks(_step_rank, 4, parallelize, case, timeout_s=60.0, collective_timeout_s=10.0)
    reference = _net(case)
    x, y = _data(case)
    loss = F.cross_entropy(reference(x), y)
    loss.backward()
    params = dict(reference.named_parameters())
    order = sorted(params, key=lambda n: _tp_placement(n) is not None)  # the replicated ones say more
    for rank, r in enumerate(ranks):
        if "order" in r:
            raise Wrong(
                f"on rank {rank}, parallelize raised ValueError: {r['order']} TP was asked to split "
                "parameters that FSDP2 had already made DTensors on mesh['dp']: apply TP first, then FSDP2 "
                "(section 2)."
            )
        for name in order:
            _check_layout(rank, name, r["layouts"].get(name))
    for rank, r in enumerate(ranks):
        if not all(r["units"]):
            raise Wrong(
                f"on rank {rank}, blocks {[i for i, u in enumerate(r['units']) if not u]} are not FSDP units "
                "of their own: the exercise asks for one unit per block besides the root (05c section 1), so "
                "that a deep model gathers one block's weights at a time."
            )
    for rank, r in enumerate(ranks):
        if "error" in r:
            raise Wrong(
                f"the parameters are laid out right, but one training step raised on rank {rank}: "
                f"{r['error']}"
            )
        if abs(r["loss"] - loss.item()) > 1e-10:
            raise Wrong(
                f"rank {rank}'s loss, averaged over the 'dp' rows, is {r['loss']:.10f}; one process on the "
                f"whole batch gets {loss.item():.10f}."
            )
        for name, p in params.items():
            g = r["grads"].get(name)
            if g is None or g.shape != p.grad.shape:
                raise Wrong(f"rank {rank}: {name} has no gradient of its full shape after backward.")
            diff = (g - p.grad).abs().max().item()
            if not diff < 1e-9:
                raise Wrong(
                    f"rank {rank}: the full gradient of {name} differs from one process's on the whole batch "
                    f"by up to {diff:.3g}."
                )
    matrices = [n for n in params if n.endswith(("up.weight", "down.weight"))]
    for rank, r in enumerate(ranks):
        for name in matrices:
            whole, local = params[name].numel(), r["layouts"][name]["local"]
            if local * 4 != whole or r["grad_local"][name] != local:
                raise Wrong(
                    f"rank {rank} holds {local:,} of {name}'s {whole:,} numbers (gradient: "
                    f"{r['grad_local'][name]:,}); on a 2 × 2 mesh each rank should hold a quarter."
                )
    shape = f"{case['blocks']} block(s) of {case['width']} → {case['hidden']} → {case['width']}"
    return (
        f"on 4 gloo ranks ({shape}, drawn now): every block's up and down split over 'tp' the Megatron way, "
        "every parameter sharded over 'dp'; one step's loss and full gradients equal one process's on the "
        "whole batch (float64), and each rank holds a quarter of every block's matrices and their gradients."
    )


# --- 08b.2: a rank's state budget (rank (0, 0), the busiest) ------------------------------------------------

#: The notebook's digits MLP: (shape, dim split over "tp" or None).
_DIGITS = {
    "0.weight": ((128, 64), 0),
    "0.bias": ((128,), 0),
    "2.weight": ((128, 128), 1),
    "2.bias": ((128,), None),
    "4.weight": ((10, 128), None),
    "4.bias": ((10,), None),
}


def _chunks(n: int, k: int) -> list[int]:
    size = -(-n // k)  # torch.chunk: pieces of ceil(n / k), the last ones shorter or empty
    return [max(0, min(size, n - i * size)) for i in range(k)]


def _busiest(params: dict[str, tuple[tuple[int, ...], int | None]], dp: int, tp: int) -> int:
    best = 0
    for d in range(dp):
        for t in range(tp):
            total = 0
            for shape, tp_dim in params.values():
                local = list(shape)
                if tp_dim is not None:
                    local[tp_dim] = _chunks(local[tp_dim], tp)[t]
                local[0] = _chunks(local[0], dp)[d]
                total += math.prod(local)
            best = max(best, 16 * total)
    return best


#: Section 4's nn.Linear(8, 5) under FSDP2 on 2 ranks (a 2 × 1 mesh): rank 0 holds 3 rows, 432 B.
_FIVE_ROWS = {"weight": ((5, 8), None), "bias": ((5,), None)}


def _random_params(rng: random.Random, tp: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Hidden sizes divide by ``tp`` (torch's parallel styles fail in forward on an uneven TP split);
    the rows FSDP2 splits over "dp" mostly do not."""
    params: dict[str, tuple[tuple[int, ...], int | None]] = {}
    for i in range(rng.randint(1, 3)):
        width, hidden = rng.randint(3, 40), tp * rng.randint(1, 90 // tp)
        params[f"blocks.{i}.up.weight"] = ((hidden, width), 0)
        params[f"blocks.{i}.up.bias"] = ((hidden,), 0)
        params[f"blocks.{i}.down.weight"] = ((width, hidden), 1)
        params[f"blocks.{i}.down.bias"] = ((width,), None)
    params["head.weight"] = ((rng.randint(2, 11), rng.randint(3, 40)), None)
    return params


@exercise(
    "08b.2",
    "a rank's state budget",
    task="busiest_rank_bytes(params, dp, tp) returns an int: the bytes (fp32 weight, gradient, two Adam "
    "states) that rank (0, 0) of a dp × tp mesh holds under section 2's layout, every split as torch.chunk "
    "makes it: section 4's budget per rank. Compared exactly with the grader's count on section 4's 5-row "
    "layer (2 × 1) and model (2 × 2), then on 20 random models whose 'dp' splits are uneven, dp and tp from "
    "2 to 4; a miss names the first parameter counted wrong.",
    hint="per parameter: the dim split over 'tp' keeps torch.chunk's first piece, ceil(n / tp); then "
    "FSDP2 keeps the first piece, ceil(rows / dp), of dim 0 of what is left; a parameter TP leaves whole "
    "keeps only that dim-0 piece. Count 16 bytes per number held (fp32 weight, gradient, two Adam states).",
)
def grade_busiest(busiest_rank_bytes: Callable[..., int]) -> str:
    """Section 4's 5-row layer (2 × 1) and model (2 × 2), then 20 random models with uneven "dp" splits."""
    if not callable(busiest_rank_bytes):
        raise Wrong(f"pass the function busiest_rank_bytes itself, not {type(busiest_rank_bytes).__name__}")
    rng = random.Random(secrets.randbits(32))
    meshes = [(rng.choice((2, 3, 4)), rng.choice((2, 3, 4))) for _ in range(20)]
    cases = [(_FIVE_ROWS, 2, 1), (_DIGITS, 2, 2)] + [(_random_params(rng, tp), dp, tp) for dp, tp in meshes]
    for k, (params, dp, tp) in enumerate(cases):
        got = busiest_rank_bytes(dict(params), dp, tp)
        want = _busiest(params, dp, tp)
        if not isinstance(got, int) or isinstance(got, bool):
            raise Wrong(f"busiest_rank_bytes must return a whole number of bytes, not {type(got).__name__}.")
        if got == want:
            continue
        case = ("section 4's 5-row layer, " if k == 0 else "section 4's model, " if k == 1 else "") + (
            f"dp={dp}, tp={tp}"
        )
        for name, (shape, tp_dim) in params.items():  # the first parameter counted wrong, alone
            one, want_one = (
                busiest_rank_bytes({name: (shape, tp_dim)}, dp, tp),
                _busiest({name: (shape, tp_dim)}, dp, tp),
            )
            if one != want_one:
                split = "left whole by TP" if tp_dim is None else f"split over 'tp' along dim {tp_dim}"
                raise Wrong(
                    f"{case}: for {name} alone, of shape {shape} and {split}, you return {one:,} B; "
                    f"rank (0, 0) holds {want_one:,} B ({want_one // 16:,} numbers × 16 B). The whole model: "
                    f"you return {got:,} B, rank (0, 0) holds {want:,} B."
                )
        raise Wrong(
            f"{case}: you return {got:,} B for the whole model, rank (0, 0) holds {want:,} B, though every "
            "parameter alone comes out right: the total must be the sum of the parameters' bytes."
        )
    return (
        "your count matches torch.chunk's shards on section 4's 5-row layer and model, and on 20 random "
        "models with uneven 'dp' splits."
    )
