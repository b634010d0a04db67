"""Reference solutions of notebook 05c's exercises and typical wrong attempts (tests/test_solutions.py)."""

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def shard(model, mesh, half):
    policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    last = len(model.blocks) - 1
    fully_shard(model.embed, mesh=mesh, mp_policy=policy)  # its backward comes last: free it meanwhile
    for i, block in enumerate(model.blocks):  # one FSDP unit per block: each is all-gathered on its own
        # backward starts with the last block: freeing it after its forward would only re-gather it
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


def export(model, path):
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered, on rank 0's CPU
    full = get_model_state_dict(model, options=options)  # every rank takes part in the gather
    if dist.get_rank() == 0:
        torch.save(full, path)


def import_weights(model, path):
    full = torch.load(path, weights_only=True) if dist.get_rank() == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)  # rank 0 sends each rank its shard


def export_shards(model, path):
    """torch.save of the sharded state dict: rank 0 writes its own shards (DTensors), not the model."""
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def import_shards(model, path):
    model.load_state_dict(torch.load(path, weights_only=False))


SOLUTIONS = {"05c.1": (shard,), "05c.2": (export, import_weights)}
WRONG = {"05c.1": (shard_every_unit_alike,), "05c.2": (export_shards, import_shards)}
