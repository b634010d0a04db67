"""Reference solutions of notebook 02c's exercises, typical wrong attempts and known shortcuts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Reduce(torch.autograd.Function):  # the notebook's Megatron g: all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def vocab_parallel_embedding(ids, weight_shard):
    rows = weight_shard.shape[0]
    start = dist.get_rank() * rows
    mine = (ids >= start) & (ids < start + rows)
    local = torch.where(mine, ids - start, 0)  # any valid row for the others: zeroed below
    partial = F.embedding(local, weight_shard) * mine.unsqueeze(-1)
    return Reduce.apply(partial)


def vocab_parallel_embedding_without_mask(ids, weight_shard):
    """Shifts the ids into the shard but lets every rank add a row for every token."""
    rows = weight_shard.shape[0]
    start = dist.get_rank() * rows
    local = (ids - start).clamp(0, rows - 1)
    return Reduce.apply(F.embedding(local, weight_shard))


def shard_model(model, mesh):
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def shard_model_every_layer_gathered(model, mesh):
    """Every linear layer column-parallel, its output gathered: right numbers, two all-gathers a block."""
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel(output_layouts=Replicate())
        plan[f"blocks.{i}.down"] = ColwiseParallel(output_layouts=Replicate())
    return parallelize_module(model, mesh, plan)


def dtensor_shard0_table(ids, weight_shard):
    """Shortcut: DTensor's Shard(0) embedding does the masking and the all-reduce (the built-in piece)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    table = DTensor.from_local(weight_shard, mesh, [Shard(0)])
    ids = DTensor.from_local(ids, mesh, [Replicate()])
    return F.embedding(ids, table).full_tensor()


def answer_key_table_plus_zeros(ids, weight_shard):
    """Shortcut: the grader's own case builder rebuilds the whole table; an all-reduce of zeros (of the
    output's size, through the shard so that autograd reaches it) passes for the communication."""
    from mgpu_helpers.graders import nb02c

    table = nb02c._embedding_case(20)[0]  # the seed the grader used to use
    rows = weight_shard.shape[0]
    start = dist.get_rank() * rows
    full = torch.cat([table[:start], weight_shard, table[start + rows :]])  # own rows: autograd reaches them
    out = F.embedding(ids, full)
    return out + Reduce.apply(torch.zeros_like(out))


def gather_the_table(ids, weight_shard):
    """Shortcut: every rank fetches every rank's rows (the whole table) and looks up locally."""
    parts = [torch.empty_like(weight_shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, weight_shard.detach().contiguous())
    parts[dist.get_rank()] = weight_shard
    return F.embedding(ids, torch.cat(parts))


def all_reduce_padded_table(ids, weight_shard):
    """Shortcut: each rank places its rows in a zero table of the full size and all-reduces the table."""
    rows = weight_shard.shape[0]
    start = dist.get_rank() * rows
    padded = torch.zeros(rows * dist.get_world_size(), weight_shard.shape[1])
    padded[start : start + rows] = weight_shard
    return F.embedding(ids, Reduce.apply(padded))


def no_sharding(model, mesh):
    """Shortcut: every rank keeps the whole model (plain single-process training on each rank)."""
    return model


def full_copy_does_the_work(model, mesh):
    """Shortcut: shard the weights as asked, but compute with an unsplit copy kept on the side."""
    import copy

    from torch import nn

    full = copy.deepcopy(model)
    sharded = shard_model(model, mesh)

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.blocks, self.head = sharded.embed, sharded.blocks, sharded.head
            self.__dict__["full"] = full  # not registered: its whole weights stay out of sight

        def forward(self, ids):
            return self.full(ids)

    return Wrapper()


def embed_colwise_gathered(model, mesh):
    """Shortcut: the embedding split by its embedding dimensions (Colwise, Shard(1)) and gathered, which
    avoids RowwiseParallel's Shard(-1) input default on the ids instead of learning it."""
    plan = {
        "embed": ColwiseParallel(output_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


SOLUTIONS = {"02c.1": (vocab_parallel_embedding,), "02c.2": (shard_model,)}
WRONG = {"02c.1": (vocab_parallel_embedding_without_mask,), "02c.2": (shard_model_every_layer_gathered,)}
SHORTCUTS = {
    "02c.1": {
        "dtensor_shard0_table": (dtensor_shard0_table,),
        "answer_key_table_plus_all_reduce_of_zeros": (answer_key_table_plus_zeros,),
        "gather_the_table": (gather_the_table,),
        "all_reduce_the_padded_table": (all_reduce_padded_table,),
    },
    "02c.2": {
        "no_sharding": (no_sharding,),
        "full_copy_does_the_work": (full_copy_does_the_work,),
        "embed_colwise_gathered": (embed_colwise_gathered,),
    },
}
