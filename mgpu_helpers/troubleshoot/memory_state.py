"""Used by notebook 07a (memory problems), §1–§4 and its ``oom_demo`` module: read and free memory on
the host and on a GPU.

* :func:`process_rss` — this process's resident host memory (psutil);
* :func:`memory_snapshot` — every counter that applies to a device: RSS, and on CUDA PyTorch's
  allocated / reserved / peak bytes plus the driver's view (NVML, what ``nvidia-smi`` shows);
* :func:`free_memory` — ``gc.collect()``, ``torch.cuda.empty_cache()``, glibc's ``malloc_trim``, then a
  snapshot: what "clean up after an OOM" means in code.
"""

from __future__ import annotations

import ctypes
import gc
import sys

import torch

__all__ = ["free_memory", "memory_snapshot", "process_rss"]

DeviceLike = str | int | torch.device


def _as_device(device: DeviceLike | None, *, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` (None: the CPU); a clear error for nonsense or a missing GPU."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, bool) or not isinstance(device, str | int | torch.device):
        raise TypeError(
            f"{name} must be a device such as 'cpu', 'cuda:0', 0 or torch.device('cuda', 0), "
            f"not {type(device).__name__}"
        )
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"{name} index must be >= 0 (a CUDA device number), not {device}")
        dev = torch.device("cuda", device)
    else:
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{name} {device!r} is not a device; pass 'cpu', 'cuda' or 'cuda:0'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {str(dev)!r} needs a CUDA GPU and torch sees none here; pass 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"{name} {str(dev)!r} does not exist: torch sees {torch.cuda.device_count()} GPU(s), "
                f"pass cuda:0 … cuda:{torch.cuda.device_count() - 1}"
            )
    return dev


def process_rss() -> int:
    """Resident set size of this process in bytes (the host RAM it occupies now), from psutil."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def memory_snapshot(device: DeviceLike | None = None) -> dict[str, int]:
    """One reading of every memory counter that applies to ``device`` (default: CPU only).

    Always ``process_rss``. For a CUDA device also ``cuda_allocated`` (bytes in live tensors),
    ``cuda_reserved`` (held by PyTorch's caching allocator: allocated + cached), ``cuda_max_allocated``
    (peak since the last reset) and, where NVML works, ``nvml_used``/``nvml_total`` (the whole GPU, all
    processes, including CUDA contexts: what ``nvidia-smi`` and GPUtil show).
    """
    dev = _as_device(device)
    snap = {"process_rss": process_rss()}
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        snap["cuda_allocated"] = int(torch.cuda.memory_allocated(index))
        snap["cuda_reserved"] = int(torch.cuda.memory_reserved(index))
        snap["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(index))
        from ..hardware import nvml_memory

        for gpu in nvml_memory() or []:
            if gpu["index"] == index:
                snap["nvml_used"], snap["nvml_total"] = int(gpu["used"]), int(gpu["total"])
    return snap


def _malloc_trim() -> bool:
    """Ask glibc to give freed heap memory back to the OS (the CPU's ``empty_cache``); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False


def free_memory(device: DeviceLike | None = None) -> dict[str, int]:
    """Release what nothing refers to any more, then return :func:`memory_snapshot` of ``device``.

    ``gc.collect()`` frees tensors held only by reference cycles (an exception's traceback, for
    example, refers to the frames that refer to the tensors). On CUDA, ``torch.cuda.empty_cache()``
    returns the caching allocator's unused blocks to the driver; on Linux, ``malloc_trim(0)`` does the
    same for the C heap. Neither frees a tensor that is still referenced: that needs ``del``.
    """
    dev = _as_device(device)
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    _malloc_trim()
    return memory_snapshot(dev)
