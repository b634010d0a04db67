"""Used by notebook 07 (troubleshooting), §2: what an out-of-memory error is, and recovering from one.

* :func:`is_oom` — does this exception mean "an allocation failed" (CUDA, the CPU allocator, Python)?
* :class:`TrainingStep` — training at a given batch size with memory that grows fast with the batch
  (a vocabulary-sized output layer): the step the OOM demo and the batch-size finder try.
* :func:`reproduce_oom` — run a step that does not fit, recover, run one that fits, reading memory at
  every stage; meant to run under a fence (``run_with_memory_limit`` or ``cuda_memory_cap``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import whole
from .memory_state import _as_device, free_memory, memory_snapshot

__all__ = ["TrainingStep", "is_oom", "reproduce_oom"]

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


@dataclass
class TrainingStep:
    """Training at a given batch size, as a batch-size finder or an OOM demo tries it.

    Each call builds a :class:`~mgpu_helpers.models.LargeOutputModel` and an Adam optimizer on
    ``device`` and runs ``steps`` full steps (forward, cross-entropy, backward, ``optimizer.step()``).
    Two steps, because Adam creates its state in the first step: only from the second step on does the
    peak include it, as it will for the rest of training. Returns the last loss as a float. Nothing
    outlives the call, so memory is back where it was afterwards — also after an OOM, once the
    exception is gone. The large output layer makes memory grow quickly with the batch size while the
    compute stays small.

    A picklable dataclass, so it can be sent to a capped child process.
    """

    in_features: int = 64
    hidden: int = 16
    vocab_size: int = 32_000
    steps: int = 2
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        for name, example in (
            ("in_features", "64"),
            ("hidden", "16"),
            ("vocab_size", "32_000"),
            ("steps", "2"),
        ):
            whole(f"TrainingStep.{name}", getattr(self, name), 1, example)
        if not isinstance(self.device, str):
            raise TypeError(
                f"TrainingStep.device must be a string such as 'cpu' or 'cuda:0', not {self.device!r}"
            )
        _as_device(self.device, name="TrainingStep.device")

    def build(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """A fresh model and optimizer on ``device`` (each call makes its own; handy for estimates)."""
        from ..models import LargeOutputModel

        torch.manual_seed(self.seed)
        model = LargeOutputModel(self.in_features, self.hidden, self.vocab_size).to(self.device)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def __call__(self, batch_size: int) -> float:
        whole("batch_size", batch_size, 1, "64")
        model, optimizer = self.build()
        for _ in range(self.steps):
            x = torch.randn(batch_size, self.in_features, device=self.device)
            y = torch.randint(0, self.vocab_size, (batch_size,), device=self.device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.item()


def _check_reproduce_args(too_big: Any, fits: Any, step: Any) -> None:
    whole("too_big", too_big, 1, "448")
    whole("fits", fits, 1, "64")
    if fits >= too_big:
        raise ValueError(
            f"fits ({fits}) must be smaller than too_big ({too_big}): pass e.g. too_big=448, fits=64"
        )
    if step is not None and not isinstance(step, TrainingStep):
        raise TypeError(f"step must be a TrainingStep (or None for the default), not {type(step).__name__}")


def reproduce_oom(
    too_big: int, fits: int, *, device: str = "cpu", step: TrainingStep | None = None
) -> dict[str, Any]:
    """Run training that runs out of memory, recover, and run training that fits.

    Meant to run under a fence: in a capped child (``run_with_memory_limit``) on the CPU, or inside
    ``cuda_memory_cap`` on a GPU. A :class:`~mgpu_helpers.memory.MemoryTracker` counts every tensor
    made meanwhile, so "memory is back at its baseline" is checked exactly. Returns the error's type and
    message, the line of the step that raised it, and memory readings: at the baseline, inside the
    ``except`` block (the exception's traceback still holds the failed step's tensors), after the
    ``except`` block, after :func:`free_memory`, and after the step that fits.

    Args:
        too_big: a batch size that does not fit under the fence.
        fits: a smaller batch size that does.
        device: where to train (``"cpu"`` in a capped child, ``"cuda:0"`` under ``cuda_memory_cap``).
        step: the training step (default :class:`TrainingStep`); its ``device`` is replaced by ``device``.
    """
    _check_reproduce_args(too_big, fits, step)
    from ..memory import MemoryTracker

    step = dataclasses.replace(step or TrainingStep(), device=str(device))  # validates the device
    step_file = sys.modules[type(step).__module__].__file__
    step(1)  # warm-up: the first step loads kernels and libraries (RSS grows once, not a leak)
    free_memory(device)
    tracker = MemoryTracker()
    readings: dict[str, dict[str, int]] = {}

    def read(label: str) -> None:
        readings[label] = {"tracked": tracker.current_total, **memory_snapshot(device)}

    with tracker:
        read("baseline")
        error_type = message = failed_at = None
        try:
            step(too_big)
        except Exception as exc:
            if not is_oom(exc):
                raise
            error_type, message = type(exc).__name__, str(exc)
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == step_file]
            failed_at = frames[-1].line if frames else None
            read("inside except")
        # Only the text was kept: leaving the except block dropped the exception and its frames.
        read("after except")
        free_memory(device)
        read("after free_memory")
        loss = step(fits)
        free_memory(device)
        read(f"after batch {fits}")
    tracker.close()
    return {
        "error_type": error_type,
        "message": message,
        "failed_at": failed_at,
        "loss": loss,
        "readings": readings,
    }
