"""Troubleshooting tools: reproduce out-of-memory errors safely, find the largest batch, name an error.

Running out of memory in a notebook can take the whole kernel down (the Linux OOM killer, Colab's
"your session crashed"), so every OOM in the course happens inside a fence:

* **CPU**: :func:`run_with_memory_limit` runs a function in a fresh child process whose address space
  is capped with ``resource.setrlimit(RLIMIT_AS)``. An allocation beyond the cap fails at once with
  PyTorch's ordinary CPU allocator error; the child recovers or dies, the notebook kernel never notices.
* **GPU**: :func:`cuda_memory_cap` lowers ``torch.cuda.set_per_process_memory_fraction`` for a block,
  so ``torch.OutOfMemoryError`` comes long before the card is full, and restores it afterwards.

On top of that:

* :func:`find_max_batch_size` grows the batch size until it runs out of memory, backs off, and
  binary-searches the largest size that fits, cleaning up after every failure. With ``memory_limit``
  it runs under one of the fences above, so it can be tested on a CPU.
* :func:`diagnose` turns a caught exception (or an error text, e.g. a worker's stderr) into a short
  :class:`Diagnosis` with next steps: out of memory, device or dtype mismatch, index out of range /
  device-side assert, a distributed timeout, an unpicklable spawn target, CUDA setup problems.
* :func:`memory_growth` says whether a per-step series of memory readings keeps growing (a leak).
* ``python -m mgpu_helpers.troubleshoot hang --timeout 2`` under torchrun is a two-rank job in which
  rank 1 never joins rank 0's ``all_reduce``: a real hang that the process-group timeout turns into an
  error (notebook 07 §5).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "KINDS",
    "BatchSizeSearch",
    "ChildResult",
    "Diagnosis",
    "MemoryGrowth",
    "Probe",
    "TrainingStep",
    "cuda_memory_cap",
    "diagnose",
    "find_max_batch_size",
    "free_memory",
    "is_oom",
    "memory_growth",
    "memory_snapshot",
    "process_rss",
    "reproduce_oom",
    "run_with_memory_limit",
]

_MIB = 1024**2


# ---------------------------------------------------------------------------------------------- monitoring
def process_rss() -> int:
    """Resident set size of this process in bytes (the host RAM it occupies now), from psutil."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def memory_snapshot(device: str | torch.device | None = None) -> dict[str, int]:
    """One reading of every memory counter that applies to ``device`` (default: CPU only).

    Always ``process_rss``. For a CUDA device also ``cuda_allocated`` (bytes in live tensors),
    ``cuda_reserved`` (held by PyTorch's caching allocator: allocated + cached), ``cuda_max_allocated``
    (peak since the last reset) and, where NVML works, ``nvml_used``/``nvml_total`` (the whole GPU, all
    processes, including CUDA contexts: what ``nvidia-smi`` and GPUtil show).
    """
    snap = {"process_rss": process_rss()}
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        snap["cuda_allocated"] = int(torch.cuda.memory_allocated(index))
        snap["cuda_reserved"] = int(torch.cuda.memory_reserved(index))
        snap["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(index))
        from .hardware import nvml_memory

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


def free_memory(device: str | torch.device | None = None) -> dict[str, int]:
    """Release what nothing refers to any more, then return :func:`memory_snapshot`.

    ``gc.collect()`` frees tensors held only by reference cycles (an exception's traceback, for
    example, refers to the frames that refer to the tensors). On CUDA, ``torch.cuda.empty_cache()``
    returns the caching allocator's unused blocks to the driver; on Linux, ``malloc_trim(0)`` does the
    same for the C heap. Neither frees a tensor that is still referenced: that needs ``del``.
    """
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    _malloc_trim()
    return memory_snapshot(device)


# ---------------------------------------------------------------------------------------------- OOM
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
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(re.search(p, str(exc), re.I) for p in _OOM_PATTERNS)


@contextlib.contextmanager
def cuda_memory_cap(limit_bytes: int, device: int | str | torch.device = 0) -> Iterator[float]:
    """Let PyTorch's caching allocator on ``device`` use at most ``limit_bytes`` more than it holds now.

    Sets ``torch.cuda.set_per_process_memory_fraction`` to (reserved now + ``limit_bytes``) / capacity
    for the block and back to 1.0 afterwards; yields the fraction. An allocation past the cap raises
    ``torch.OutOfMemoryError`` exactly as a full GPU would, but the GPU still has room, so nothing else
    (other processes, the notebook) is affected. The cap covers tensors and the allocator's cache,
    not the CUDA context (a few hundred MiB that ``nvidia-smi`` shows on top).
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "cuda_memory_cap needs a CUDA GPU. On a CPU, reproduce OOM in a capped child process with "
            "run_with_memory_limit(...) instead."
        )
    dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free_memory(dev)
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, (torch.cuda.memory_reserved(index) + int(limit_bytes)) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    try:
        yield fraction
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        free_memory(dev)


@dataclass
class ChildResult:
    """What :func:`run_with_memory_limit` brought back from its child process.

    ``value`` is the function's return value, ``error`` the exception it raised (re-created in this
    process, without its traceback; ``error_traceback`` holds the child's traceback as text).
    ``baseline_bytes`` is the child's address space when the cap was set; the cap was
    ``baseline_bytes + limit_bytes``. ``peak_rss_bytes`` is the child's peak resident memory.
    ``exitcode`` is the child's exit status (negative: killed by that signal).
    """

    value: Any = None
    error: BaseException | None = None
    error_traceback: str = ""
    limit_bytes: int = 0
    baseline_bytes: int = 0
    peak_rss_bytes: int = 0
    seconds: float = 0.0
    exitcode: int | None = None
    stderr: str = ""

    @property
    def ok(self) -> bool:
        """True when the function returned normally."""
        return self.error is None and self.exitcode == 0


def _address_space() -> int:
    """This process's virtual address-space size in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _cap_address_space(limit_bytes: int) -> int:
    """Cap this process's address space at (now + ``limit_bytes``); return the baseline. Child only."""
    import mmap
    import resource

    with contextlib.suppress(OSError, AttributeError):  # glibc's malloc, tuned so that address space
        libc = ctypes.CDLL(None)  # tracks memory in use: one arena (a failed allocation would otherwise
        libc.mallopt(-8, 1)  # reserve a fresh 64 MiB arena; M_ARENA_MAX) and every block >= 128 KiB
        libc.mallopt(-3, 128 * 1024)  # mmap-ed, so that freeing it unmaps it (fixed M_MMAP_THRESHOLD)
    # One tiny training step before the cap: thread pools, autograd's threads and lazily loaded
    # libraries map their memory now, and do not count against the budget.
    layer = torch.nn.Linear(8, 8)
    torch.optim.Adam(layer.parameters()).step(layer(torch.ones(4, 8)).sum().backward())
    del layer
    baseline = _address_space()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = baseline + int(limit_bytes)
    if hard != resource.RLIM_INFINITY and cap > hard:
        raise RuntimeError(f"the hard address-space limit ({hard} B) is below the requested cap ({cap} B)")
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:  # prove that the cap is enforced: mapping twice the budget must fail (and touches no memory)
        probe = mmap.mmap(-1, 2 * int(limit_bytes) + _MIB)
    except (OSError, MemoryError):
        return baseline
    probe.close()
    raise RuntimeError(
        "this operating system does not enforce RLIMIT_AS (macOS ignores it), so an OOM here would not "
        "be contained; run the OOM demos on Linux or Colab"
    )


def _child_main() -> None:
    """Entry point of the capped child started by :func:`run_with_memory_limit`."""
    payload_path, result_path = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    out: dict[str, Any] = {"baseline": 0, "error": None, "traceback": "", "value": None}
    try:
        with open(payload_path, "rb") as fh:
            sys_path, blob, limit = pickle.load(fh)
        for entry in reversed(sys_path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        fn, args, kwargs = pickle.loads(blob)
        out["baseline"] = _cap_address_space(limit)
        out["value"] = fn(*args, **kwargs)
    except BaseException as exc:  # hand every failure back to the parent
        out["traceback"] = traceback.format_exc()
        out["error"] = exc
    import resource

    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    out["seconds"] = time.monotonic() - start
    try:
        data = pickle.dumps(out)
    except Exception:  # an unpicklable value or exception: send its text
        out["value"] = repr(out["value"])
        if out["error"] is not None:
            out["error"] = RuntimeError(f"{type(out['error']).__name__}: {out['error']}")
        data = pickle.dumps(out)
    with open(result_path, "wb") as fh:
        fh.write(data)


def _check_importable(fn: Callable[..., Any]) -> None:
    """Raise a ValueError that says what to do when a fresh child process could not load ``fn``."""
    name = getattr(fn, "__qualname__", repr(fn))
    fix = "Define it at module level in a .py file and import it, as multiprocessing's spawn requires."
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise ValueError(
            f"{name!r} cannot be sent to a child process ({type(exc).__name__}: {exc}). {fix}"
        ) from exc
    if getattr(fn, "__module__", None) == "__main__":
        raise ValueError(
            f"{name!r} is defined in __main__ (a notebook or a script): a child process would fail with "
            f"\"Can't get attribute '{name}' on <module '__main__'>\". {fix}"
        )


def run_with_memory_limit(
    fn: Callable[..., Any], *args: Any, limit_bytes: int, timeout: float = 120.0, **kwargs: Any
) -> ChildResult:
    """Run ``fn(*args, **kwargs)`` in a fresh Python process allowed ``limit_bytes`` of extra memory.

    The child imports torch, starts its thread pool, then caps its address space at its current size
    plus ``limit_bytes`` (``RLIMIT_AS``; Linux only — elsewhere the child refuses to run rather than
    risk a real OOM). Any allocation beyond the cap fails immediately inside the child with PyTorch's
    CPU allocator error; this process is never at risk. Like ``multiprocessing``'s spawn, the child
    finds ``fn`` by module and name, so ``fn`` must live in an importable module (not a notebook);
    ``args`` and the return value must be picklable. The child is killed after ``timeout`` seconds.

    Returns a :class:`ChildResult`; an exception inside ``fn`` does not raise here but comes back as
    ``result.error`` (so that a notebook can look at it with :func:`diagnose`).
    """
    if sys.platform != "linux":
        raise OSError("run_with_memory_limit needs Linux (RLIMIT_AS); on macOS or Windows use Colab or WSL.")
    if limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    _check_importable(fn)
    blob = pickle.dumps((fn, args, kwargs))
    with tempfile.TemporaryDirectory(prefix="mgpu_oom_") as tmp:
        payload, result = os.path.join(tmp, "payload.pkl"), os.path.join(tmp, "result.pkl")
        with open(payload, "wb") as fh:
            pickle.dump((list(sys.path), blob, int(limit_bytes)), fh)
        code = "from mgpu_helpers.troubleshoot import _child_main; _child_main()"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env["CUDA_VISIBLE_DEVICES"] = ""  # the child works on the host: CUDA would need terabytes of VA
        env["MKL_DISABLE_FAST_MM"] = "1"  # MKL's own buffer cache would otherwise hold freed memory
        with tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-c", code, payload, result],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            seconds = time.monotonic() - start
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if not os.path.exists(result) or os.path.getsize(result) == 0:
            timed_out = seconds >= timeout
            why = (
                f"timed out after {timeout:.0f} s" if timed_out else f"died with exit code {proc.returncode}"
            )
            return ChildResult(
                error=RuntimeError(f"the capped child process {why} before reporting.\n{stderr[-2000:]}"),
                limit_bytes=int(limit_bytes),
                seconds=seconds,
                exitcode=proc.returncode,
                stderr=stderr,
            )
        with open(result, "rb") as fh:
            out = pickle.load(fh)
    return ChildResult(
        value=out["value"],
        error=out["error"],
        error_traceback=out["traceback"],
        limit_bytes=int(limit_bytes),
        baseline_bytes=int(out["baseline"]),
        peak_rss_bytes=int(out.get("peak_rss", 0)),
        seconds=seconds,
        exitcode=proc.returncode,
        stderr=stderr,
    )


# ---------------------------------------------------------------------------------------------- probes
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

    def build(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """A fresh model and optimizer on ``device`` (each call makes its own; handy for estimates)."""
        from .models import LargeOutputModel

        torch.manual_seed(self.seed)
        model = LargeOutputModel(self.in_features, self.hidden, self.vocab_size).to(self.device)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def __call__(self, batch_size: int) -> float:
        model, optimizer = self.build()
        for _ in range(self.steps):
            x = torch.randn(batch_size, self.in_features, device=self.device)
            y = torch.randint(0, self.vocab_size, (batch_size,), device=self.device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.item()


def reproduce_oom(
    too_big: int, fits: int, *, device: str = "cpu", step: TrainingStep | None = None
) -> dict[str, Any]:
    """Run training that runs out of memory, recover, and run training that fits.

    Meant to run under a fence: in a capped child (:func:`run_with_memory_limit`) on the CPU, or inside
    :func:`cuda_memory_cap` on a GPU. A :class:`~mgpu_helpers.memory.MemoryTracker` counts every tensor
    made meanwhile, so "memory is back at its baseline" is checked exactly. Returns the error's type and
    message, the line of the step that raised it, and memory readings: at the baseline, inside the
    ``except`` block (the exception's traceback still holds the failed step's tensors), after the
    ``except`` block, after :func:`free_memory`, and after the step that fits.
    """
    from .memory import MemoryTracker

    step = dataclasses.replace(step or TrainingStep(), device=device)
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
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == __file__]
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


# ---------------------------------------------------------------------------------------------- finder
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


def _search(
    try_batch: Callable[[int], Any], start: int, max_batch: int, device: str | torch.device | None
) -> BatchSizeSearch:
    """Grow ×2 until OOM, then binary-search between the last size that fit and the first that failed."""
    probes: list[Probe] = []

    def fits(b: int) -> bool:
        t0 = time.perf_counter()
        error = None
        try:
            try_batch(b)
        except Exception as exc:
            if not is_oom(exc):
                raise
            error = str(exc).strip().splitlines()[0][:200]
        if error is not None:
            # Out of the except block the exception and its frames are gone; now memory can be freed.
            free_memory(device)
        probes.append(Probe(b, error is None, time.perf_counter() - t0, error))
        return error is None

    if not fits(start):
        return BatchSizeSearch(0, start, probes)
    good, bad = start, None
    while bad is None and good < max_batch:  # 1. grow until the first failure
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
    free_memory(device)
    return BatchSizeSearch(good, bad, probes)


def find_max_batch_size(
    try_batch: Callable[[int], Any],
    *,
    start: int = 1,
    max_batch: int = 1 << 16,
    memory_limit: int | None = None,
    device: str | torch.device = "cpu",
    timeout: float = 300.0,
) -> BatchSizeSearch:
    """Largest batch size for which ``try_batch(batch_size)`` runs without running out of memory.

    The search doubles the batch size from ``start`` until an attempt fails with an out-of-memory error
    (:func:`is_oom`; any other error propagates), then binary-searches between the last size that fit
    and the first that failed. After every attempt it calls :func:`free_memory`, so when it returns the
    memory is as clean as ``try_batch`` left it (a ``try_batch`` that keeps nothing leaves nothing).

    Args:
        try_batch: runs one step at the given batch size (e.g. :class:`TrainingStep`); must not keep
            references to what it allocates.
        start: first batch size tried; if it does not fit, ``largest`` is 0.
        max_batch: the search stops growing here.
        memory_limit: bytes the search may use. On the CPU the whole search runs in a child process capped
            at its start-up size plus this (:func:`run_with_memory_limit`; ``try_batch`` must then be
            picklable and importable). On a CUDA ``device`` it runs here inside :func:`cuda_memory_cap`.
            None: no extra limit, search in this process against the device's real capacity.
        device: where ``try_batch`` allocates; decides how ``memory_limit`` is enforced.
        timeout: seconds before a capped child is killed.
    """
    if start < 1 or max_batch < start:
        raise ValueError(f"need 1 <= start <= max_batch, got start={start}, max_batch={max_batch}")
    dev = torch.device(device)
    if memory_limit is None:
        return _search(try_batch, start, max_batch, dev)
    if dev.type == "cuda":
        with cuda_memory_cap(memory_limit, dev) as fraction:
            result = _search(try_batch, start, max_batch, dev)
        result.where = f"{dev}, capped with set_per_process_memory_fraction({fraction:.4f})"
    else:
        child = run_with_memory_limit(
            _search, try_batch, start, max_batch, "cpu", limit_bytes=memory_limit, timeout=timeout
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


# ---------------------------------------------------------------------------------------------- leaks
@dataclass
class MemoryGrowth:
    """Trend of a memory series taken once per step (see :func:`memory_growth`)."""

    bytes_per_step: float
    total_growth: int
    steps: int
    growing: bool

    def __str__(self) -> str:
        verdict = "GROWING: something keeps memory across steps" if self.growing else "flat"
        return (
            f"{self.bytes_per_step:,.0f} B/step over {self.steps} steps ({self.total_growth:+,} B): {verdict}"
        )


def memory_growth(values: Sequence[float], *, min_bytes_per_step: float = 1.0) -> MemoryGrowth:
    """Least-squares slope of per-step memory readings (e.g. ``tracker.mark(...).total`` each step).

    ``growing`` is True when the slope is at least ``min_bytes_per_step`` and memory rose from the first
    to the last reading. In a healthy loop the reading at the same point of each step is the same
    (tracked bytes) or close to it (RSS: choose a threshold above its noise).
    """
    n = len(values)
    if n < 2:
        raise ValueError("memory_growth needs at least two readings")
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    var = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / var
    total = int(values[-1] - values[0])
    return MemoryGrowth(slope, total, n, slope >= min_bytes_per_step and total > 0)


# ---------------------------------------------------------------------------------------------- diagnose
#: Kinds :func:`diagnose` can return.
KINDS: tuple[str, ...] = (
    "out_of_memory",
    "index_out_of_range",
    "device_mismatch",
    "dtype_mismatch",
    "distributed_timeout",
    "unpicklable_target",
    "cuda_setup",
    "unknown",
)


@dataclass(frozen=True)
class Diagnosis:
    """A short reading of an error: what kind it is, what it means, what to do next.

    Only text is kept (never the exception), so holding a diagnosis does not keep the failed step's
    tensors alive through the exception's traceback.
    """

    kind: str
    title: str
    explanation: str
    next_steps: tuple[str, ...]
    evidence: str = ""
    details: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"[{self.kind}] {self.title}"]
        if self.evidence:
            lines.append(f"  evidence: {self.evidence}")
        lines.append(f"  meaning:  {self.explanation}")
        for key, value in self.details.items():
            lines.append(f"  {key}: {value}")
        lines.append("  next steps:")
        lines += [f"    {i}. {s}" for i, s in enumerate(self.next_steps, 1)]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Rule:
    kind: str
    patterns: tuple[str, ...]
    title: str
    explanation: str
    next_steps: tuple[str, ...]


_RULES: tuple[_Rule, ...] = (
    _Rule(
        "index_out_of_range",
        (
            r"device-side assert",
            r"Target -?\d+ is out of bounds",
            r"index out of range",
            r"index -?\d+ is out of bounds",
            r"Assertion `t >= 0 && t < n_classes` failed",
            r"srcIndex < srcSelectDimSize",
        ),
        "An index is outside the tensor it indexes (on a GPU: a device-side assert)",
        "Typically a class label >= the number of classes (or negative) in cross_entropy, or a token id "
        ">= the embedding size. On a GPU the kernel only records an assert, so the message is vague and "
        "may point at a later line.",
        (
            "Check the indices against the size they index: labels in [0, num_classes) for cross_entropy, "
            "token ids in [0, num_embeddings) for an embedding (e.g. assert y.min() >= 0 and y.max() < C).",
            "Rerun the failing step on the CPU for a readable message, or on the GPU with "
            "CUDA_LAUNCH_BLOCKING=1 so the traceback points at the failing operation.",
            "After a device-side assert the process's CUDA context is broken: restart the kernel/process.",
        ),
    ),
    _Rule(
        "out_of_memory",
        _OOM_PATTERNS,
        "Out of memory",
        "An allocation failed: the step needs more memory than the device has free right now. The line in "
        "the traceback is only where the last allocation happened, not what filled the memory.",
        (
            "Halve the batch size (down to 1 to see whether the model fits at all); find_max_batch_size "
            "finds the largest that fits.",
            "Clean up before retrying: drop references (del; keep the message, not the exception), "
            "gc.collect(), torch.cuda.empty_cache(); check memory is back at its baseline.",
            "If memory grows every step, look for tensors kept across steps: total += loss -> loss.item(); "
            "evaluate under torch.no_grad().",
            "Need less per sample: mixed precision (torch.autocast), gradient checkpointing, or sharding "
            "across GPUs (FSDP/ZeRO).",
        ),
    ),
    _Rule(
        "device_mismatch",
        (
            r"Expected all tensors to be on the same device",
            r"is not on the expected device",
            r"found at least two devices",
            r"Input type \(torch\.cuda\.\w+\) and weight type \(torch\.[A-Z]\w*\)",
            r"Input type \(torch\.[A-Z]\w*\) and weight type \(torch\.cuda\.\w+\)",
        ),
        "Tensors on different devices meet in one operation",
        "Every operation needs all of its tensors on one device; one of them (often the labels, a newly "
        "created tensor, or the model) was left on another.",
        (
            "Move the odd one out with .to(device): inputs and labels every batch; the model once "
            "(model.to(device) moves its parameters in place), before creating the optimizer.",
            "Create new tensors where they are used: torch.zeros(n, device=x.device).",
            "In multi-GPU code pick the GPU from the local rank: torch.cuda.set_device(local_rank), "
            "device = f'cuda:{local_rank}'.",
        ),
    ),
    _Rule(
        "dtype_mismatch",
        (
            r"same dtype",
            r"expected scalar type \w+ but found \w+",
            r"expected target dtype",
            r"Found dtype \w+ but expected \w+",
            r"Input type \(.+\) and (weight|bias) type \(.+\) should be the same",
            r"result type \w+ can't be cast to the desired output type",
        ),
        "Tensors of different dtypes meet in one operation",
        "Matrix products and layers need matching floating dtypes (float32 vs float64 is the classic: NumPy "
        "arrays default to float64), and cross_entropy needs int64 class labels.",
        (
            "Convert the input to the model's dtype: x.to(model.weight.dtype), or "
            "torch.from_numpy(a).float() for NumPy data.",
            "Class labels must be int64: y.long().",
            "For mixed precision let torch.autocast choose the dtypes instead of calling .half() on parts.",
        ),
    ),
    _Rule(
        "distributed_timeout",
        (
            r"Timed out waiting \d+ ?ms",
            r"Watchdog caught collective operation timeout",
            r"failed to pass monitoredBarrier",
            r"Socket Timeout",
            r"DistStoreError",
            r"(collective|barrier|rendezvous|store|gloo|nccl)[^\n]*timed? ?out|timed? ?out[^\n]*(collective|"
            r"barrier|rendezvous|store|gloo|nccl)",
        ),
        "A distributed operation timed out: some rank never joined",
        "A collective (all_reduce, barrier, ...) waits until every rank calls it. One rank did not, because "
        "it crashed, is stuck elsewhere, or took a different code path; the timeout turned the hang into "
        "this error.",
        (
            "Make every rank call the same collectives in the same order: no rank-dependent `if` around "
            "all_reduce/barrier, and the same number of batches per rank (DistributedSampler, drop_last).",
            "Find the missing rank: dist.monitored_barrier() (gloo) names it; TORCH_DISTRIBUTED_DEBUG=DETAIL "
            "logs collectives; NCCL_DEBUG=INFO for NCCL. Read every rank's log, not only rank 0's.",
            "While debugging pass a short init_process_group(timeout=timedelta(seconds=...)), so that a "
            "hang fails fast instead of waiting the default 10 minutes (NCCL) or 30 minutes (gloo).",
            "If it is the rendezvous that timed out: check MASTER_ADDR/MASTER_PORT, the firewall, and that "
            "every node was started.",
        ),
    ),
    _Rule(
        "unpicklable_target",
        (
            r"Can't get attribute '[^']+' on <module",
            r"Can't pickle local object",
            r"Can't pickle <function <lambda>",
            r"attribute lookup \S+ on __main__ failed",
            r"cannot pickle '[^']+' object",
        ),
        "A worker function or argument could not be pickled for a new process",
        "spawn (used by torch.multiprocessing.spawn and DataLoader workers on macOS/Windows, and needed with "
        "CUDA) starts a fresh Python that imports the function by module and name. A function defined in a "
        "notebook (module __main__), a lambda or a nested function cannot be found there.",
        (
            "Put the worker in a .py file and import it (from my_workers import train); pass settings as "
            "arguments (functools.partial works).",
            "Arguments must be picklable too: no open files, locks, generators or live connections; build "
            "them inside the worker.",
            "Or launch a script with torchrun instead of spawning from the notebook (mgpu_helpers.launch).",
        ),
    ),
    _Rule(
        "cuda_setup",
        (
            r"CUDNN_STATUS_NOT_INIT",
            r"CUDNN_STATUS_\w+",
            r"driver version is insufficient",
            r"no kernel image is available",
            r"Found no NVIDIA driver",
            r"Torch not compiled with CUDA",
            r"CUDA initialization",
            r"Cannot re-initialize CUDA in forked subprocess",
            r"NVML_SUCCESS == r",
        ),
        "CUDA could not start (driver, toolkit or library problem)",
        "The GPU libraries failed before any real work: the NVIDIA driver, the CUDA runtime PyTorch was "
        "built with and cuDNN must fit together. CUDNN_STATUS_NOT_INIT usually means cuDNN could not "
        "initialise: a version mismatch, or no GPU memory left when it started.",
        (
            "Compare versions: nvidia-smi shows the driver and the newest CUDA it supports; "
            "torch.version.cuda and torch.backends.cudnn.version() must not need newer.",
            "Reinstall torch from the index that matches the driver (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu1XX); do not mix conda and pip CUDA libraries.",
            "Check for other processes filling the GPU (nvidia-smi) and restart the runtime; 'no kernel "
            "image' means the build does not support this GPU model.",
            "'Cannot re-initialize CUDA in forked subprocess': start workers with spawn, or touch CUDA only "
            "inside the workers.",
        ),
    ),
)

_UNKNOWN = _Rule(
    "unknown",
    (),
    "Not a pattern this helper knows",
    "Read the message from the bottom: the last line names the error, the deepest frame in your own code "
    "is usually where to look.",
    (
        "Reproduce with a tiny batch on the CPU: errors there are raised where they happen, with readable "
        "messages.",
        "On a GPU rerun with CUDA_LAUNCH_BLOCKING=1 so the traceback points at the failing operation.",
        "Search the exact last line of the message in the PyTorch forums and GitHub issues.",
    ),
)


def _error_text(error: BaseException | str) -> tuple[str, list[type]]:
    """All messages of an exception and its causes (or the text itself), and the exception types."""
    if isinstance(error, str):
        return error, []
    parts, types, seen = [], [], set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        types.append(type(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts), types


def _details(kind: str, text: str) -> dict[str, str]:
    details: dict[str, str] = {}
    if kind == "out_of_memory":
        m = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)", text)
        if m:
            details["requested"] = m.group(1)
        m = re.search(r"you tried to allocate (\d+) bytes", text)
        if m:
            details["requested"] = f"{int(m.group(1)):,} B (host RAM)"
        m = re.search(r"([\d.]+ ?[KMGT]i?B) is reserved by PyTorch but unallocated", text)
        if m:
            details["reserved but unallocated"] = (
                f"{m.group(1)} (if large: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                "against fragmentation)"
            )
    if kind == "unpicklable_target":
        m = re.search(r"Can't get attribute '([^']+)'", text)
        if m:
            details["missing in the child"] = m.group(1)
    if kind == "distributed_timeout":
        m = re.search(r"Timed out waiting (\d+) ?ms", text) or re.search(r"ran for (\d+) milliseconds", text)
        if m:
            details["waited"] = f"{int(m.group(1)) / 1000:g} s"
    return details


def diagnose(error: BaseException | str) -> Diagnosis:
    """Name the kind of ``error`` and suggest next steps.

    ``error`` is a caught exception (its ``__cause__``/``__context__`` chain is read too) or an error
    text, such as a worker's stderr or a :class:`~mgpu_helpers.launch.TorchrunError` message. Known kinds
    are listed in :data:`KINDS`; anything else gets the ``"unknown"`` diagnosis with general advice.
    """
    text, types = _error_text(error)
    if any(issubclass(t, torch.OutOfMemoryError | MemoryError) for t in types):
        rule, evidence = next(r for r in _RULES if r.kind == "out_of_memory"), _first_line(text)
    else:
        rule, evidence = _UNKNOWN, ""
        for candidate in _RULES:
            match = next((m for p in candidate.patterns if (m := re.search(p, text))), None)
            if match:
                rule, evidence = candidate, _line_of(text, match.start())
                break
        if rule is _UNKNOWN:
            evidence = _first_line(text)
    return Diagnosis(
        rule.kind, rule.title, rule.explanation, rule.next_steps, evidence, _details(rule.kind, text)
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:240]


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()[:240]


# ---------------------------------------------------------------------------------------------- hang demo
def _hang(timeout_s: float) -> None:
    """Worker of the hang demo (run under torchrun with 2 processes): rank 1 skips rank 0's all_reduce."""
    import datetime

    import torch.distributed as dist

    from .launch import RESULT_PREFIX

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    # A side channel both ranks can reach: torchrun's own key-value store at MASTER_ADDR:MASTER_PORT.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=60),
    )
    if rank == 0:
        report: dict[str, Any] = {"rank": 0}
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))  # rank 1 never calls this: without a timeout, a hang forever
            report["error_type"] = None
        except Exception as exc:
            report.update(error_type=type(exc).__name__, message=str(exc), kind=diagnose(exc).kind)
        report["waited_s"] = round(time.monotonic() - start, 3)
        print(RESULT_PREFIX + json.dumps(report), flush=True)
        store.set("mgpu_troubleshoot/rank0_done", "1")
    else:
        # The "bug": this rank is busy elsewhere and never joins the all_reduce. It stays alive until
        # rank 0 has seen its timeout (if it exited, rank 0 would see "connection closed" instead).
        store.wait(["mgpu_troubleshoot/rank0_done"])
        print(RESULT_PREFIX + json.dumps({"rank": rank, "skipped_all_reduce": True}), flush=True)
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m mgpu_helpers.troubleshoot hang --timeout 2`` (under torchrun)."""
    parser = argparse.ArgumentParser(prog="python -m mgpu_helpers.troubleshoot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    hang = sub.add_parser("hang", help="two ranks, one skips an all_reduce: a hang turned into an error")
    hang.add_argument("--timeout", type=float, default=2.0, help="process-group timeout in seconds")
    args = parser.parse_args(argv)
    if args.command == "hang":
        _hang(args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
