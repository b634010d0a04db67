"""Reference solutions of notebook 05b's exercises and typical wrong attempts (tests/test_solutions.py)."""

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


def checkpoint_in_segments(blocks, x, segments):
    size = len(blocks) // segments
    for start in range(0, len(blocks), size):
        x = checkpoint(blocks[start : start + size], x, use_reentrant=False)  # one checkpoint per segment
    return x


def checkpoint_every_block(blocks, x, segments):
    """Section 4's pattern, one checkpoint per block: ignores the segments and keeps every block's input."""
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x


SOLUTIONS = {"05b.1": (per_rank_bytes,), "05b.2": (checkpoint_in_segments,)}
WRONG = {"05b.1": (per_rank_bytes_zero1_shards_gradients,), "05b.2": (checkpoint_every_block,)}
