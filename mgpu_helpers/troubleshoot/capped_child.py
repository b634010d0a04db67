"""Used by notebook 07a (memory problems), §2 and §3: the CPU fence for out-of-memory demos.

Running out of memory in a notebook can take the whole kernel down (the Linux OOM killer, Colab's
"your session crashed"). :func:`run_with_memory_limit` runs a function in a fresh child process whose
address space is capped with ``resource.setrlimit(RLIMIT_AS)``: an allocation beyond the cap fails at
once with PyTorch's ordinary CPU allocator error, the child recovers or dies, the kernel never notices.
The child gets ``die_with_parent`` (a killed kernel takes it along) and is stopped with
``stop_processes`` on a timeout, an error or an interrupt; its files live in a ``mgpu-oom-*`` temporary
folder that is removed however the call ends.

The cap counts address space, not memory in use, so everything torch maps once and keeps — libraries,
the CUDA driver of a CUDA build, and above all the **stacks of its thread pools** (8 MiB of address
space per thread by default) — must be mapped *before* the cap, or it eats the budget: on a 16-core
machine the OpenMP team that the first large operation starts maps 15 stacks, 120 MiB, and libgomp then
ends the process ("Thread creation failed") instead of an allocation raising. :func:`_warm_up` does
that work first; the budget then covers what ``fn`` allocates. :meth:`ChildResult.explain` says in
words what happened to a child that did not return.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..processes import die_with_parent, stop_processes, temp_prefix, tune_malloc

__all__ = ["ChildResult", "run_with_memory_limit"]

_MIB = 1024**2


@dataclass
class ChildResult:
    """What :func:`run_with_memory_limit` brought back from its child process.

    ``value`` is the function's return value, ``error`` the exception it raised (re-created in this
    process, without its traceback; ``error_traceback`` holds the child's traceback as text).
    ``baseline_bytes`` is the child's address space when the cap was set; the cap was
    ``baseline_bytes + limit_bytes``. ``peak_rss_bytes`` is the child's peak
    resident memory.
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
    #: where the child got to: "start" (importing, reading its task), "cap" (warming up, setting the
    #: cap), "run" (inside ``fn``) or "done"; "" when it died before reporting.
    stage: str = ""

    @property
    def ok(self) -> bool:
        """True when the function returned normally."""
        return self.error is None and self.exitcode == 0

    def explain(self) -> str:
        """What happened in the child, in one paragraph: read it before ``value`` when ``ok`` is False."""
        from .oom import is_oom

        budget = f"{self.limit_bytes / _MIB:.0f} MiB"
        if self.ok:
            return f"the function returned normally within its budget of {budget} ({self.seconds:.1f} s)"
        if self.error is None:
            err = f"the child exited with code {self.exitcode} after reporting"
        else:
            err = f"{type(self.error).__name__}: {self.error}".strip().splitlines()[0][:400]
        if self.stage == "run" and self.error is not None:
            if is_oom(self.error):
                return (
                    f"the function ran out of memory under the cap (its budget: {budget} on top of "
                    f"{self.baseline_bytes / _MIB:.0f} MiB at start-up) and did not catch it: {err}"
                )
            where = self.error_traceback.strip().splitlines()[-3:-1] if self.error_traceback else []
            at = f" (at {' '.join(ln.strip() for ln in where)})" if where else ""
            return f"the function raised {err}{at}; this is an error in the function, not an OOM"
        if self.stage in ("start", "cap"):
            what = "load the function and its arguments" if self.stage == "start" else "set its cap"
            return f"the child could not {what}: {err}"
        hint = ""
        if "Thread creation failed" in self.stderr or "can't start new thread" in self.stderr:
            hint = (
                " It could not start a thread: every new thread's stack (8 MiB of address space by "
                "default) counts against the cap. A thread pool the function starts itself (not torch's "
                "own, started before the cap) needs a larger limit_bytes."
            )
        elif "timed out" in err:
            hint = (
                " Pass a larger timeout= if the function needs longer. A child that hangs instead may be "
                "starting threads under the cap (torch 2.11's CUDA build waits for good when an OpenMP pool "
                "wider than torch's own cannot start): fewer threads, or a larger limit_bytes."
            )
        elif self.exitcode is not None and self.exitcode < 0:
            hint = " A signal ended it (SIGKILL from outside: often the operating system's OOM killer)."
        last = [ln for ln in self.stderr.strip().splitlines() if ln.strip()][-1:]
        said = f' Its last words: "{last[0].strip()[:300]}".' if last else ""
        return f"{err}{said}{hint}"


# ------------------------------------------------------------------------------------- in the child
def _address_space() -> int:
    """This process's virtual address-space size in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _warm_up() -> None:
    """Map now, before the cap, what torch maps once and keeps (module docstring). Child only.

    ``torch.cuda.is_available()`` loads the driver in a CUDA build (no GPU is visible in the child); a
    small training step loads the lazily loaded libraries; an element-wise operation and a matrix
    product large enough for every intra-op thread start the OpenMP team (and MKL's threads) at full
    width — ``at::parallel_for`` starts only as many threads as the work has grains of 32,768 elements.
    """
    threads = max(1, torch.get_num_threads())
    torch.cuda.is_available()  # a CUDA build loads the driver here; CUDA_VISIBLE_DEVICES="" hides GPUs
    layer = torch.nn.Linear(256, 256)
    loss = torch.nn.functional.cross_entropy(layer(torch.randn(256, 256)), torch.zeros(256, dtype=torch.long))
    loss.backward()
    torch.optim.Adam(layer.parameters()).step()
    big = torch.ones(2 * 32_768 * threads)  # two grains per thread: the whole team
    big.mul_(2.0).sum()
    torch.mm(torch.ones(512, 512), torch.ones(512, 512))
    del layer, loss, big


def _cap_address_space(limit_bytes: int) -> int:
    """Cap this process's address space at baseline + ``limit_bytes``; return the baseline. Child only.

    The baseline is the address space after the warm-up. Every block of 128 KiB or more (a tensor's
    storage, say) is a mapping of its own, so those get exactly ``limit_bytes``; smaller ones may also
    reuse the free room left inside malloc's heap (trimmed first: a few MiB at most). Subtracting that
    room from the budget instead took it from the large blocks: with the CUDA build of torch 2.11 on
    an H100 machine (9 MiB free in the heap) a 56 MiB tensor no longer fitted in 64 MiB.
    """
    import mmap
    import resource

    # glibc's malloc, tuned so that address space tracks memory in use: one arena (a failed allocation
    # would otherwise reserve a fresh 64 MiB one) and every block >= 128 KiB mmap-ed, so that freeing it
    # unmaps it
    tune_malloc(arena_max=1, mmap_threshold=128 * 1024)
    _warm_up()  # thread pools, libraries, the driver: mapped now, they do not count against the budget
    gc.collect()
    tune_malloc(trim=True)  # the heap's free top back: less room the cap does not see
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
    """Entry point of the capped child: ``python -c "..._child_main()" PAYLOAD RESULT``."""
    payload_path, result_path = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    out: dict[str, Any] = {"baseline": 0, "error": None, "traceback": "", "value": None, "stage": "start"}
    try:
        with open(payload_path, "rb") as fh:
            sys_path, blob, limit = pickle.load(fh)
        for entry in reversed(sys_path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        fn, args, kwargs = pickle.loads(blob)
        out["stage"] = "cap"
        out["baseline"] = _cap_address_space(limit)
        out["stage"] = "run"
        out["value"] = fn(*args, **kwargs)
        out["stage"] = "done"
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


# ------------------------------------------------------------------------------------- in the parent
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


def _check_arguments(fn: Any, limit_bytes: Any, timeout: Any) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function to run in the child, not {type(fn).__name__}")
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
        raise TypeError(
            f"limit_bytes must be an int number of bytes (e.g. 128 * 1024**2), not {limit_bytes!r}"
        )
    if limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be > 0 bytes of extra memory for the child, not {limit_bytes}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds > 0 (e.g. 120), not {timeout}")


def _why_no_result(returncode: int | None, timed_out: bool, timeout: float) -> str:
    if timed_out:
        return f"timed out after {timeout:g} s and was stopped"
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
    return f"died with exit code {returncode}"


def _load_result(path: str) -> dict[str, Any]:
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return pickle.loads(data)
    except Exception as exc:  # e.g. an exception class whose __init__ needs other arguments
        return {
            "value": None,
            "error": RuntimeError(f"the child's result could not be unpickled here: {exc}"),
            "traceback": "",
            "baseline": 0,
        }


def run_with_memory_limit(
    fn: Callable[..., Any], *args: Any, limit_bytes: int, timeout: float = 120.0, **kwargs: Any
) -> ChildResult:
    """Run ``fn(*args, **kwargs)`` in a fresh Python process allowed ``limit_bytes`` of extra memory.

    The child imports torch, runs a small warm-up (libraries, the driver of a CUDA build, its thread
    pools at full width: see the module docstring), then caps its address space at its current size
    plus ``limit_bytes`` (``RLIMIT_AS``; Linux only — elsewhere the child refuses to run rather than
    risk a real OOM). Any allocation beyond the cap fails immediately inside the child with PyTorch's
    CPU allocator error; this process is never at risk. Like ``multiprocessing``'s spawn, the child
    finds ``fn`` by module and name, so ``fn`` must live in an importable module (not a notebook);
    ``args`` and the return value must be picklable. The child is stopped after ``timeout`` seconds,
    and also when this call is interrupted or fails.

    Returns a :class:`ChildResult`; an exception inside ``fn`` does not raise here but comes back as
    ``result.error`` (so that a notebook can look at it with :func:`~mgpu_helpers.troubleshoot.diagnose`),
    and so does a child that timed out or died before reporting. Check ``result.ok`` before reading
    ``result.value`` (None when the child did not return); ``result.explain()`` says what happened.
    """
    _check_arguments(fn, limit_bytes, timeout)
    if sys.platform != "linux":
        raise OSError("run_with_memory_limit needs Linux (RLIMIT_AS); on macOS or Windows use Colab or WSL.")
    _check_importable(fn)
    blob = pickle.dumps((fn, args, kwargs))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child works on the host: CUDA would need terabytes of VA
    env["MKL_DISABLE_FAST_MM"] = "1"  # MKL's own buffer cache would otherwise hold freed memory
    code = "from mgpu_helpers.troubleshoot.capped_child import _child_main; _child_main()"
    with tempfile.TemporaryDirectory(prefix=temp_prefix("oom")) as tmp:
        payload, result = os.path.join(tmp, "payload.pkl"), os.path.join(tmp, "result.pkl")
        with open(payload, "wb") as fh:
            pickle.dump((list(sys.path), blob, limit_bytes), fh)
        with open(os.path.join(tmp, "stderr.txt"), "w+b") as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-c", code, payload, result],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                start_new_session=True,  # a Ctrl-C in a terminal reaches only this process ...
                preexec_fn=die_with_parent,  # ... and a killed parent takes the child along
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # timeout, KeyboardInterrupt or any other error here: no child survives this call
                if proc.poll() is None:
                    killed = stop_processes([proc], grace_s=1.0)
                    # stop_processes reaps the child itself, so Popen never sees its status: record it.
                    proc.returncode = -(signal.SIGKILL if proc.pid in killed else signal.SIGTERM)
            seconds = time.monotonic() - start
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if not os.path.exists(result) or os.path.getsize(result) == 0:
            why = _why_no_result(proc.returncode, timed_out, timeout)
            return ChildResult(
                error=RuntimeError(f"the capped child process {why} before reporting.\n{stderr[-2000:]}"),
                limit_bytes=limit_bytes,
                seconds=seconds,
                exitcode=proc.returncode,
                stderr=stderr,
            )
        out = _load_result(result)
    return ChildResult(
        value=out["value"],
        error=out["error"],
        error_traceback=out["traceback"],
        limit_bytes=limit_bytes,
        baseline_bytes=int(out["baseline"]),
        peak_rss_bytes=int(out.get("peak_rss", 0)),
        seconds=seconds,
        exitcode=proc.returncode,
        stderr=stderr,
        stage=str(out.get("stage", "")),
    )
