"""Used by notebook 07a (its ``oom_demo`` module and the batch-size finder) and by :mod:`.diagnose`:
:func:`is_oom` — does this exception mean "an allocation failed" (CUDA, the CPU allocator, Python)?

The training step, the OOM reproduction and the batch-size search themselves are written in notebook
07a, where the student reads them.
"""

from __future__ import annotations

import re

import torch

__all__ = ["is_oom"]

#: Message fragments of allocation failures (also used by ``diagnose``).
_OOM_PATTERNS = (
    r"out of memory",
    r"can't allocate memory",
    r"not enough memory",
    r"Cannot allocate memory",
    r"CUBLAS_STATUS_ALLOC_FAILED",
    r"std::bad_alloc",
)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means "an allocation failed": ``torch.OutOfMemoryError`` (CUDA), the CPU
    allocator's ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory"), or ``MemoryError``."""
    if not isinstance(exc, BaseException):
        raise TypeError(
            f"is_oom takes a caught exception (except Exception as exc), not {type(exc).__name__}"
        )
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(re.search(p, str(exc), re.I) for p in _OOM_PATTERNS)
