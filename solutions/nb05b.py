"""Reference solutions of notebook 05b's exercises and typical wrong attempts (tests/test_solutions.py)."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def per_rank_bytes(n_params, world_size, setup):
    weights, grads, optimizer = 4 * n_params, 4 * n_params, 8 * n_params  # fp32 + Adam's two moments
    if setup in ("ZeRO-1", "FSDP2"):
        optimizer /= world_size
    if setup == "FSDP2":
        grads /= world_size
        weights /= world_size
    return {"parameters": weights, "gradients": grads, "optimizer": optimizer}


def per_rank_bytes_zero1_shards_gradients(n_params, world_size, setup):
    """Treats ZeRO-1 as if it also kept only a shard of the gradients (that is ZeRO-2)."""
    weights, grads, optimizer = 4 * n_params, 4 * n_params, 8 * n_params
    if setup in ("ZeRO-1", "FSDP2"):
        optimizer /= world_size
        grads /= world_size
    if setup == "FSDP2":
        weights /= world_size
    return {"parameters": weights, "gradients": grads, "optimizer": optimizer}


class CheckpointedBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


class NoGradBlock(nn.Module):
    """Saves memory by not recording the graph at all: nothing to backpropagate through."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        with torch.no_grad():
            return self.block(x)


SOLUTIONS = {"05b.1": (per_rank_bytes,), "05b.2": (CheckpointedBlock,)}
WRONG = {"05b.1": (per_rank_bytes_zero1_shards_gradients,), "05b.2": (NoGradBlock,)}
