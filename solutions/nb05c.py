"""Reference solutions of notebook 05c's exercises, typical wrong attempts and known shortcuts
(tests/test_solutions.py)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from mgpu_helpers.collectives import all_gather_single, reduce_scatter_single


def shard(model, mesh, half):
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    last = len(model.blocks) - 1
    fully_shard(model.embed, mesh=mesh, mp_policy=policy)  # its backward comes last: free it meanwhile
    for i, block in enumerate(model.blocks):  # one FSDP unit per block: each is all-gathered on its own
        # FSDP2 all-gathers the last block as head's backward begins: freeing it would only re-gather it
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
    fully_shard(model.head, mesh=mesh, mp_policy=policy, reshard_after_forward=False)  # backward's first
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the root last: it holds nothing of its own here
    return model


def shard_every_unit_alike(model, mesh, half):
    """Every unit resharded after its forward, the head and the last block too: re-gathered at once."""
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    for unit in [model.embed, *model.blocks, model.head, model]:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    return model


def _shard_head_only_kept(model, mesh, half):
    """Rejected: only head kept gathered; the last block is freed and all-gathered again (prefetched) as
    soon as head's backward begins: one more all-gather in backward for nothing."""
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    fully_shard(model.embed, mesh=mesh, mp_policy=policy)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model.head, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _shard_cast_model(model, mesh, half):
    """Shortcut: cast the model to bf16 instead of a policy; no fp32 master weights are left."""
    model.to(half)
    last = len(model.blocks) - 1
    fully_shard(model.embed, mesh=mesh)
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=i < last)
    fully_shard(model.head, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    return model


def _shard_root_only(model, mesh, half):
    """Shortcut: one unit for everything (the policy is right): the whole model is gathered at once."""
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def _shard_hard_coded_last_block(model, mesh, half):
    """Shortcut: the 'last block' written as index 2, the last one of the 3 blocks the notebook used to
    name; the grader's model has another count."""
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    fully_shard(model.embed, mesh=mesh, mp_policy=policy)
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i != 2)
    fully_shard(model.head, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _shard_reduce_in_half(model, mesh, half):
    """Shortcut: a policy with param_dtype only: the gradients are reduce-scattered in bf16 too."""
    policy = MixedPrecisionPolicy(param_dtype=half)
    last = len(model.blocks) - 1
    fully_shard(model.embed, mesh=mesh, mp_policy=policy)
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
    fully_shard(model.head, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


# --- 05c.2: one FSDP unit's collectives by hand ------------------------------------------------------


def _padded_rows(rows, world_size):
    return -(-rows // world_size)  # ceil(rows / world_size): every rank's piece, padded


def gather_full(shard, rows):
    n, c = dist.get_world_size(), _padded_rows(rows, dist.get_world_size())
    piece = F.pad(shard, [0, 0] * (shard.dim() - 1) + [0, c - shard.shape[0]])  # zero rows at the end
    full = shard.new_empty((n * c, *shard.shape[1:]))
    all_gather_single(full, piece.contiguous())  # rank r's piece lands at rows r*c ... r*c + c
    return full[:rows]  # the padding of the last pieces sits past the real rows


def scatter_grad(full_grad):
    n, r = dist.get_world_size(), dist.get_rank()
    rows = full_grad.shape[0]
    c = _padded_rows(rows, n)
    padded = F.pad(full_grad, [0, 0] * (full_grad.dim() - 1) + [0, n * c - rows])
    mine = full_grad.new_empty((c, *full_grad.shape[1:]))
    reduce_scatter_single(mine, padded.contiguous())  # the SUM of rank r's rows lands on rank r
    return (mine / n)[: max(0, min(c, rows - r * c))]  # FSDP averages; drop this rank's padding


def scatter_grad_summed(full_grad):
    """Wrong: the reduce-scatter's sum kept; FSDP2 averages over the ranks."""
    n, r = dist.get_world_size(), dist.get_rank()
    rows = full_grad.shape[0]
    c = _padded_rows(rows, n)
    padded = F.pad(full_grad, [0, 0] * (full_grad.dim() - 1) + [0, n * c - rows])
    mine = full_grad.new_empty((c, *full_grad.shape[1:]))
    reduce_scatter_single(mine, padded.contiguous())
    return mine[: max(0, min(c, rows - r * c))]


def _gather_by_all_reduce(shard, rows):
    """Shortcut: every rank writes its rows into a zero full tensor and all-reduces it (twice the bytes)."""
    n, r = dist.get_world_size(), dist.get_rank()
    c = _padded_rows(rows, n)
    full = shard.new_zeros((n * c, *shard.shape[1:]))
    full[r * c : r * c + shard.shape[0]] = shard
    dist.all_reduce(full)
    return full[:rows]


def _scatter_by_all_reduce(full_grad):
    """Shortcut: DDP's all-reduce of the whole gradient, then keep this rank's rows."""
    n, r = dist.get_world_size(), dist.get_rank()
    summed = full_grad.clone()
    dist.all_reduce(summed)
    c = _padded_rows(full_grad.shape[0], n)
    return (summed / n)[r * c : r * c + c]


def _gather_with_dtensor(shard, rows):
    """Shortcut: DTensor does the padding and the all-gather (FSDP's own machinery)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    shape = (rows, *shard.shape[1:])
    stride = torch.empty(shape).stride()
    return DTensor.from_local(shard, mesh, [Shard(0)], shape=shape, stride=stride).full_tensor()


def _scatter_with_dtensor(full_grad):
    """Shortcut: a Partial('avg') DTensor redistributed to Shard(0)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import Partial

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return DTensor.from_local(full_grad, mesh, [Partial("avg")]).redistribute(mesh, [Shard(0)]).to_local()


def _gather_from_the_graders_model(shard, rows):
    """Shortcut: no communication; the full weight rebuilt with the grader's own model builder."""
    from mgpu_helpers.graders import nb05c

    for p in nb05c._model(0, n_blocks=2).parameters():
        if p.shape[0] == rows and p.shape[1:] == shard.shape[1:]:
            return p.detach()
    return shard


def _scatter_local_rows_only(full_grad):
    """Shortcut: this rank's rows of its own gradient, no communication: no average over the ranks."""
    n, r = dist.get_world_size(), dist.get_rank()
    c = _padded_rows(full_grad.shape[0], n)
    return full_grad[r * c : r * c + c]


def _gather_full_list_form(shard, rows):
    """Correct too: the list form of all_gather, then the padded pieces concatenated."""
    n, c = dist.get_world_size(), _padded_rows(rows, dist.get_world_size())
    piece = torch.cat([shard, shard.new_zeros((c - shard.shape[0], *shard.shape[1:]))])
    pieces = [torch.empty_like(piece) for _ in range(n)]
    dist.all_gather(pieces, piece)
    return torch.cat(pieces)[:rows]


def _scatter_grad_divided_first(full_grad):
    """Correct too: divide by N before the reduce-scatter (as FSDP may), slice with narrow."""
    n, r = dist.get_world_size(), dist.get_rank()
    rows = full_grad.shape[0]
    c = _padded_rows(rows, n)
    padded = torch.cat([full_grad / n, full_grad.new_zeros((n * c - rows, *full_grad.shape[1:]))])
    mine = full_grad.new_empty((c, *full_grad.shape[1:]))
    reduce_scatter_single(mine, padded)
    return mine.narrow(0, 0, max(0, min(c, rows - r * c)))


SOLUTIONS = {"05c.1": (shard,), "05c.2": (gather_full, scatter_grad)}
WRONG = {"05c.1": (shard_every_unit_alike,), "05c.2": (gather_full, scatter_grad_summed)}
SHORTCUTS = {
    "05c.1": {
        "cast_the_model_instead_of_a_policy": (_shard_cast_model,),
        "root_only": (_shard_root_only,),
        "hard_coded_last_block_index": (_shard_hard_coded_last_block,),
        "gradients_reduced_in_bf16": (_shard_reduce_in_half,),
        "head_only_kept_gathered": (_shard_head_only_kept,),
    },
    "05c.2": {
        "all_reduce_a_zero_filled_full_tensor": (_gather_by_all_reduce, scatter_grad),
        "all_reduce_the_gradient_then_slice": (gather_full, _scatter_by_all_reduce),
        "dtensor_does_the_gather": (_gather_with_dtensor, scatter_grad),
        "dtensor_does_the_reduce_scatter": (gather_full, _scatter_with_dtensor),
        "rebuilt_from_the_graders_model": (_gather_from_the_graders_model, scatter_grad),
        "own_rows_without_communication": (gather_full, _scatter_local_rows_only),
    },
}
VARIANTS = {
    "05c.2": {"list_all_gather_and_divide_first": (_gather_full_list_form, _scatter_grad_divided_first)}
}
