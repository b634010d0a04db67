"""Used by notebook 07a (memory problems), §2 and §3 on a GPU: the GPU fence for out-of-memory demos.

:func:`cuda_memory_cap` lowers ``torch.cuda.set_per_process_memory_fraction`` for a block, so
``torch.OutOfMemoryError`` comes long before the card is full, and restores it afterwards. The CPU
counterpart is :func:`~mgpu_helpers.troubleshoot.run_with_memory_limit` (a capped child process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .memory_state import DeviceLike, _as_device, free_memory

__all__ = ["cuda_memory_cap"]


def cuda_memory_cap(limit_bytes: int, device: DeviceLike = 0) -> contextlib.AbstractContextManager[float]:
    """Let the block allocate at most ``limit_bytes`` on ``device`` beyond the tensors alive now.

    Use it as ``with cuda_memory_cap(128 * 1024**2, "cuda:0") as fraction: ...``. Frees what nothing
    refers to (:func:`free_memory`), then sets ``torch.cuda.set_per_process_memory_fraction`` to
    (allocated now + ``limit_bytes``) / capacity for the block and back to 1.0 afterwards; yields the
    fraction.

    Why *allocated* and not *reserved*: the fraction bounds the allocator's reserved segments, and a
    segment that holds a live tensor (a model left on the GPU, cuBLAS's workspace) cannot be released, so
    after ``empty_cache`` reserved = allocated + the free room inside those segments. Counting from
    reserved would hand the block that room on top of ``limit_bytes`` (up to ~20 MiB per such segment),
    and a batch-size search would find more than a budget of ``limit_bytes`` allows; counting from
    allocated gives the block ``limit_bytes`` in all, free room included. The room inside a segment only
    takes tensors that fit in it, so what the block can use is at most ``limit_bytes``, never more — as
    long as that room is smaller than ``limit_bytes`` (true for the MiB-sized budgets of the demos).
    The cap is per device and per process: other GPUs and other processes are not affected.

    An allocation past the cap raises ``torch.OutOfMemoryError`` exactly as a full GPU would, but the GPU
    still has room, so nothing else (other processes, the notebook) is affected. The cap covers tensors
    and the allocator's cache, not the CUDA context (a few hundred MiB that ``nvidia-smi`` shows on top).

    Args:
        limit_bytes: extra bytes the block may allocate (an int > 0).
        device: a CUDA device: its index (``0``), ``"cuda:0"`` or a ``torch.device``.
    """
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
        raise TypeError(
            f"limit_bytes must be an int number of bytes (e.g. 128 * 1024**2), not {limit_bytes!r}"
        )
    if limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be > 0 bytes the capped block may allocate, not {limit_bytes}")
    if isinstance(device, str | torch.device) and not str(device).startswith("cuda"):
        raise ValueError(
            f"cuda_memory_cap caps a CUDA device, not {str(device)!r}; pass 0, 'cuda:0' or "
            "torch.device('cuda', 0). On a CPU use run_with_memory_limit(...) instead."
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "cuda_memory_cap needs a CUDA GPU. On a CPU, reproduce OOM in a capped child process with "
            "run_with_memory_limit(...) instead."
        )
    dev = _as_device(device)
    return _capped(limit_bytes, dev)


@contextlib.contextmanager
def _capped(limit_bytes: int, dev: torch.device) -> Iterator[float]:
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free_memory(dev)
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, (torch.cuda.memory_allocated(index) + limit_bytes) / total)  # see the docstring
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    try:
        yield fraction
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        free_memory(dev)
