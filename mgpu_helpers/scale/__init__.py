"""Used by notebooks 05d and 05g: the scale lab — the course's own sharding code run as ONE rank of a job
of 8 to 1,024 GPUs on a CPU, its memory and traffic counted from the rank's real tensors.

* :mod:`.world` — :func:`fake_world`: this process as rank ``r`` of ``n`` with torch's fake backend;
* :mod:`.llama` — Llama 3's block (GQA, RoPE, SwiGLU), its tensor-parallel plan and its context parallelism;
* :mod:`.count` — :func:`rank_state` and :class:`SavedActivations`: bytes by category on this rank;
* :mod:`.dryrun` — :func:`dry_run`: all of that for any layout in one call (05d's "measure this layout").
"""

from .count import SavedActivations, local, rank_state, unique_bytes
from .dryrun import DryRun, dry_run
from .llama import Block, LlamaBlocks, tp_plan
from .world import fake_world

__all__ = [
    "Block",
    "DryRun",
    "LlamaBlocks",
    "SavedActivations",
    "dry_run",
    "fake_world",
    "local",
    "rank_state",
    "tp_plan",
    "unique_bytes",
]
