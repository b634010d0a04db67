"""Reference solutions of notebook 05b's exercises, typical wrong attempts and known shortcuts
(tests/test_solutions.py)."""

from torch.utils.checkpoint import checkpoint
from torch.utils.checkpoint import checkpoint_sequential as _torch_segments

from mgpu_helpers.memory import predict_memory as _predictor


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


def _per_rank_bytes_from_the_predictor(n_params, world_size, setup):
    """Shortcut: the course's predictor under another name (the name check alone would miss it)."""
    return _ready_made(n_params, world_size, setup)


def _ready_made(n_params, world_size, setup):
    stage = {"DDP": 0, "ZeRO-1": 1, "FSDP2": 3}[setup]
    full = _predictor(n_params, precision="fp32", optimizer="adam", zero_stage=stage, dp_size=world_size)
    return {k: v for k, v in full.as_dict().items() if k in ("parameters", "gradients", "optimizer")}


def _checkpoint_sequential_renamed(blocks, x, segments):
    """Shortcut: torch's checkpoint_sequential under another name."""
    return _torch_segments(blocks, segments, x, use_reentrant=False)


def _one_checkpoint_for_everything(blocks, x, segments):
    """Shortcut: one checkpoint around all blocks: one input kept, but backward rebuilds all at once."""
    return checkpoint(blocks, x, use_reentrant=False)


SHORTCUTS = {
    "05b.1": {"predictor_under_another_name": (_per_rank_bytes_from_the_predictor,)},
    "05b.2": {
        "checkpoint_sequential_under_another_name": (_checkpoint_sequential_renamed,),
        "one_checkpoint_for_everything": (_one_checkpoint_for_everything,),
    },
}
