"""Used by notebook 07 (troubleshooting), §3: find the largest batch size that fits in memory.

* :func:`search_max_batch_size` — the search itself, on a yes/no question ``fits(batch_size)``: grow ×2
  until the first failure, then bisect between the last size that fit and the first that failed
  (the notebook prints its source);
* :func:`find_max_batch_size` — the search on a real training step: an out-of-memory error means "does
  not fit", memory is freed after every failure, every attempt is recorded as a :class:`Probe`, and with
  ``memory_limit`` it all runs under a fence (a capped child process on the CPU, ``cuda_memory_cap``
  on a GPU);
* :class:`BatchSizeSearch` — the answer, with a table and a plot of the probes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .capped_child import run_with_memory_limit
from .cuda_cap import cuda_memory_cap
from .memory_state import DeviceLike, _as_device, free_memory
from .oom import is_oom

__all__ = ["BatchSizeSearch", "Probe", "find_max_batch_size", "search_max_batch_size"]


def _check_search(fn: Any, fn_name: str, start: Any, max_batch: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{fn_name} must be a function of the batch size, not {type(fn).__name__}")
    for name, value in (("start", start), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int batch size (e.g. 1), not {value!r}")
    if start < 1:
        raise ValueError(f"start must be a batch size >= 1, not {start}")
    if max_batch < start:
        raise ValueError(f"max_batch ({max_batch}) must be >= start ({start}); pass a larger max_batch")


def search_max_batch_size(
    fits: Callable[[int], bool], start: int = 1, max_batch: int = 1 << 16
) -> tuple[int, int | None]:
    """Largest batch size in ``[start, max_batch]`` for which ``fits(batch_size)`` is True.

    Assumes that what fits is a prefix: if ``b`` fits, every smaller size fits. Returns
    ``(largest, first_failure)``: ``largest`` is 0 if not even ``start`` fits, ``first_failure`` is the
    smallest size seen to fail, None if ``max_batch`` fits. ``fits`` is called about ``2·log2(largest)``
    times.
    """
    _check_search(fits, "fits", start, max_batch)
    if not fits(start):
        return 0, start
    good, bad = start, None
    while bad is None and good < max_batch:  # 1. grow ×2 until the first failure
        b = min(good * 2, max_batch)
        if fits(b):
            good = b
        else:
            bad = b
    while bad is not None and bad - good > 1:  # 2. binary search in (good, bad)
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, bad


@dataclass
class Probe:
    """One attempt of the batch-size finder."""

    batch_size: int
    fits: bool
    seconds: float
    error: str | None = None  # first line of the OOM message


@dataclass
class BatchSizeSearch:
    """Result of :func:`find_max_batch_size`.

    ``largest`` is the largest batch size that fitted (0 if even ``start`` did not);
    ``first_failure`` the smallest size seen to fail (None if ``max_batch`` fitted), so with a
    complete search ``first_failure == largest + 1``. ``probes`` lists every attempt in order.
    ``where`` says what enforced the limit.
    """

    largest: int
    first_failure: int | None
    probes: list[Probe] = field(default_factory=list)
    where: str = "in this process"
    memory_limit: int | None = None

    def table(self) -> str:
        """The probes as aligned text, one line each."""
        lines = [f"{'#':>3}  {'batch':>7}  {'result':<7}  {'seconds':>7}"]
        for i, p in enumerate(self.probes, 1):
            lines.append(f"{i:>3}  {p.batch_size:>7}  {'fits' if p.fits else 'OOM':<7}  {p.seconds:>7.3f}")
        return "\n".join(lines)

    def plot(self, ax: Any = None, title: str | None = None) -> Any:
        """Batch size of each probe in order: green fits, red OOM; the answer as a dashed line."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3))
        xs = list(range(1, len(self.probes) + 1))
        ax.plot(xs, [p.batch_size for p in self.probes], color="0.7", lw=1, zorder=1)
        for x, p in zip(xs, self.probes, strict=True):
            ax.scatter(x, p.batch_size, color="tab:green" if p.fits else "tab:red", zorder=2, s=30)
        ax.axhline(self.largest, ls="--", color="tab:green", lw=1, label=f"largest that fits: {self.largest}")
        ax.scatter([], [], color="tab:green", label="fits")
        ax.scatter([], [], color="tab:red", label="out of memory")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("probe")
        ax.set_ylabel("batch size")
        ax.set_title(title or f"Batch-size search ({self.where})")
        ax.legend(fontsize=8, loc="lower right")
        return ax


def _probe_search(
    try_batch: Callable[[int], Any], start: int, max_batch: int, device: DeviceLike
) -> BatchSizeSearch:
    """:func:`search_max_batch_size` on ``try_batch`` (OOM: does not fit); also runs in a capped child."""
    probes: list[Probe] = []

    def fits(b: int) -> bool:
        t0 = time.perf_counter()
        error = None
        try:
            try_batch(b)
        except Exception as exc:
            if not is_oom(exc):
                raise
            error = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        if error is not None:
            # Out of the except block the exception and its frames are gone; now memory can be freed.
            free_memory(device)
        probes.append(Probe(b, error is None, time.perf_counter() - t0, error))
        return error is None

    largest, first_failure = search_max_batch_size(fits, start, max_batch)
    free_memory(device)
    return BatchSizeSearch(largest, first_failure, probes)


def _check_limits(memory_limit: Any, dev: torch.device, timeout: Any) -> None:
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, int):
            raise TypeError(
                f"memory_limit must be None or an int number of bytes (e.g. 64 * 1024**2), "
                f"not {memory_limit!r}"
            )
        if memory_limit <= 0:
            raise ValueError(f"memory_limit must be > 0 bytes (or None for no limit), not {memory_limit}")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"memory_limit can be enforced on 'cpu' or a CUDA device, not {str(dev)!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds > 0 (e.g. 300), not {timeout}")


def find_max_batch_size(
    try_batch: Callable[[int], Any],
    *,
    start: int = 1,
    max_batch: int = 1 << 16,
    memory_limit: int | None = None,
    device: DeviceLike = "cpu",
    timeout: float = 300.0,
) -> BatchSizeSearch:
    """Largest batch size for which ``try_batch(batch_size)`` runs without running out of memory.

    :func:`search_max_batch_size` with "fits" meaning that ``try_batch`` raised no out-of-memory error
    (:func:`~mgpu_helpers.troubleshoot.is_oom`; any other error propagates). After every failed attempt
    and at the end it calls :func:`~mgpu_helpers.troubleshoot.free_memory`, so when it returns the
    memory is as clean as ``try_batch`` left it (a ``try_batch`` that keeps nothing leaves nothing).

    Args:
        try_batch: runs one step at the given batch size (e.g. :class:`~mgpu_helpers.troubleshoot.
            TrainingStep`); must not keep references to what it allocates.
        start: first batch size tried; if it does not fit, ``largest`` is 0.
        max_batch: the search stops growing here.
        memory_limit: bytes the search may use. On the CPU the whole search runs in a child process capped
            at its start-up size plus this (``run_with_memory_limit``; ``try_batch`` must then be
            picklable and importable). On a CUDA ``device`` it runs here inside ``cuda_memory_cap``.
            None: no extra limit, search in this process against the device's real capacity.
        device: where ``try_batch`` allocates; decides how ``memory_limit`` is enforced.
        timeout: seconds before a capped child is stopped.
    """
    _check_search(try_batch, "try_batch", start, max_batch)
    dev = _as_device(device)
    _check_limits(memory_limit, dev, timeout)
    if memory_limit is None:
        return _probe_search(try_batch, start, max_batch, dev)
    if dev.type == "cuda":
        with cuda_memory_cap(memory_limit, dev) as fraction:
            result = _probe_search(try_batch, start, max_batch, dev)
        result.where = f"{dev}, capped with set_per_process_memory_fraction({fraction:.4f})"
    else:
        child = run_with_memory_limit(
            _probe_search, try_batch, start, max_batch, "cpu", limit_bytes=memory_limit, timeout=timeout
        )
        if child.error is not None:
            raise RuntimeError(
                f"the batch-size search failed in its capped child: {type(child.error).__name__}: "
                f"{child.error}\n{child.error_traceback}"
            ) from child.error
        result = child.value
        result.where = "CPU child process capped with RLIMIT_AS"
    result.memory_limit = memory_limit
    return result
