"""Reference solutions of notebook 08b's exercises and typical wrong attempts
(run by tests/test_solutions.py; shortcuts by tests/test_shortcuts.py, correct variants by
tests/test_grader_variants.py)."""

import math

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def parallelize(model, mesh):
    plan = {}
    for i in range(len(model.blocks)):  # the Megatron pair in every block, over "tp"
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for block in model.blocks:  # FSDP2 over "dp": one unit per block, then the root (05c)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def parallelize_swapped_mesh_dims(model, mesh):
    """Typical slip: TP over "dp" and FSDP2 over "tp" (the mesh's dimensions swapped)."""
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["dp"], plan)
    fully_shard(model, mesh=mesh["tp"])
    return model


def busiest_rank_bytes(params, dp, tp):
    held = 0  # rank (0, 0): torch.chunk's first piece, ceil(n / k), of every split; no rank holds more
    for shape, tp_dim in params.values():
        local = list(shape)
        if tp_dim is not None:
            local[tp_dim] = -(-local[tp_dim] // tp)
        local[0] = -(-local[0] // dp)
        held += math.prod(local)
    return 16 * held  # fp32 weight + gradient + Adam's two states


def busiest_rank_bytes_even(params, dp, tp):
    """Typical slip: every shard exactly 1/n of its dimension (rounded down), as if all shapes divided."""
    held = 0
    for shape, tp_dim in params.values():
        local = list(shape)
        if tp_dim is not None:
            local[tp_dim] //= tp
        local[0] //= dp
        held += math.prod(local)
    return 16 * held


# --- shortcuts: what a student might hand in instead (each must get a ❌) --------------------------------


def parallelize_ddp_only(model, mesh):
    """Plain data parallelism: a whole replica on every rank."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def parallelize_fsdp_over_all_ranks(model, mesh):
    """FSDP2 alone, over the default 1-D mesh of all 4 ranks: no tensor parallelism."""
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def parallelize_fsdp_on_the_whole_mesh(model, mesh):
    """fully_shard given the 2-D mesh: HSDP (replicated over "dp", sharded over "tp"), no TP at all."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def parallelize_tp_only(model, mesh):
    """Tensor parallelism alone: no sharding (nor gradient averaging) over "dp"."""
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    return parallelize_module(model, mesh["tp"], plan)


def parallelize_first_block_only(model, mesh):
    """Section 2's plan copied with the first block's names only: the other blocks are not TP-split."""
    parallelize_module(
        model, mesh["tp"], {"blocks.0.up": ColwiseParallel(), "blocks.0.down": RowwiseParallel()}
    )
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def parallelize_fsdp_before_tp(model, mesh):
    """Section 2's two steps swapped: FSDP2 over "dp" first, then TP over "tp" (torch refuses)."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    return model


def parallelize_root_unit_only(model, mesh):
    """Section 2's single FSDP2 unit for the whole model: no unit per block, as the exercise asks."""
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    fully_shard(model, mesh=mesh["dp"])
    return model


def busiest_rank_bytes_planner(params, dp, tp):
    """The planner's even split: Ψ/(tp) parameters sharded over dp, as if nothing were replicated."""
    from mgpu_helpers.planner import Layout, Workload, state_bytes

    n = sum(math.prod(shape) for shape, _ in params.values())
    s = state_bytes(n, Layout(dp=dp, tp=tp, zero=3), Workload(precision="fp32"))
    return s.parameters + s.gradients + s.optimizer


# --- correct variants (each must get a ✅) ------------------------------------------------------------------


def parallelize_block_by_block(model, mesh):
    """TP and FSDP2 block by block, with plans keyed inside each block, then the root."""
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def busiest_rank_bytes_every_rank(params, dp, tp):
    """Every rank (d, t) counted from real torch.chunk pieces of meta tensors, the largest kept (it is
    rank (0, 0)'s)."""

    def piece(w, k, i, dim):  # torch.chunk may return fewer than k pieces: the missing ones are empty
        pieces = w.chunk(k, dim=dim)
        return pieces[i] if i < len(pieces) else w.narrow(dim, 0, 0)

    def held(d, t):
        total = 0
        for shape, tp_dim in params.values():
            w = torch.empty(shape, device="meta")
            if tp_dim is not None:
                w = piece(w, tp, t, tp_dim)
            total += piece(w, dp, d, 0).numel()
        return 16 * total

    return max(held(d, t) for d in range(dp) for t in range(tp))


SOLUTIONS = {"08b.1": (parallelize,), "08b.2": (busiest_rank_bytes,)}
WRONG = {"08b.1": (parallelize_swapped_mesh_dims,), "08b.2": (busiest_rank_bytes_even,)}
SHORTCUTS = {
    "08b.1": {
        "ddp_only": (parallelize_ddp_only,),
        "fsdp_over_all_ranks": (parallelize_fsdp_over_all_ranks,),
        "tp_only": (parallelize_tp_only,),
        "fsdp_on_the_whole_mesh": (parallelize_fsdp_on_the_whole_mesh,),
        "first_block_only": (parallelize_first_block_only,),
        "root_unit_only": (parallelize_root_unit_only,),
        "fsdp_before_tp": (parallelize_fsdp_before_tp,),
    },
    "08b.2": {"planner_even_split": (busiest_rank_bytes_planner,)},
}
VARIANTS = {
    "08b.1": {"block_by_block": (parallelize_block_by_block,)},
    "08b.2": {"every_rank": (busiest_rank_bytes_every_rank,)},
}
