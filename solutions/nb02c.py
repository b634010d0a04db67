"""Reference solutions of notebook 02c's exercises, and typical wrong attempts
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


SOLUTIONS = {"02c.1": (vocab_parallel_embedding,), "02c.2": (shard_model,)}
WRONG = {"02c.1": (vocab_parallel_embedding_without_mask,), "02c.2": (shard_model_every_layer_gathered,)}
