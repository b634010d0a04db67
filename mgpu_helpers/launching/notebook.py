"""Used by notebooks 02a, 02b, 02c, 04a, 04b, 04c, 05b, 05c, 07b, 07c and 08 (and by
:mod:`mgpu_helpers.pipeline` and the graders): run a function on N processes from a notebook and get each
rank's return value back.

    from mgpu_helpers.launching import launch

    def work(rank, world_size):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)  # the process group is already initialised
        return t.item()

    launch(work, nprocs=2)  # -> [1.0, 1.0]

Built on PyTorch's own launcher, :func:`torch.multiprocessing.start_processes` (what ``mp.spawn``
calls); this module only adds what a notebook needs around it:

* **one start method on every machine** — the ranks are children of a forkserver that has torch
  preloaded, never forks of the kernel, and the function travels by value, so a function defined in a
  notebook cell works on a laptop, on Colab and on an 8-GPU server alike, after the notebook has run
  ``backward()`` or touched CUDA (:mod:`~mgpu_helpers.launching.server` says why fork fails there);
* **loopback only** — a fresh port on 127.0.0.1 for every launch; rank 0's store listens on 127.0.0.1
  only (:mod:`~mgpu_helpers.launching.loopback`), and so do gloo / NCCL;
* **a collective timeout** (``collective_timeout_s``) so that a rank waiting for a dead peer raises
  instead of hanging for gloo's default 30 minutes, and an overall ``timeout_s``;
* **fast failure** — when a rank raises, its traceback is raised in the cell at once (the others are
  stopped after a 1-second grace period), and every process is gone when ``launch`` returns or raises,
  and also when the kernel itself is killed (each child watches the kernel's pid);
* **return values**: each rank's result comes back (pickled through a file, as PyTorch does for
  tracebacks), in rank order.

Compared with Hugging Face Accelerate's ``notebook_launcher`` (its ``launchers.py`` as of 2026): for
more than one process it wraps torchelastic's ``elastic_launch`` with a static rendezvous at
``master_addr:use_port`` — a fixed default port, 29500, so a second job while that port is taken
clashes — and *forks* the kernel (spawn only on XPU / ROCm), refusing once CUDA is initialised. Fork is
faster to start (nothing to pickle, no server) but fails at the first backward once the kernel has run
one on a GPU machine, which our notebooks do to compute reference gradients; Accelerate asks users to
keep all CUDA work inside the launched function. It can restart failed workers (``max_restarts``),
discards the ranks' return values, has no timeout of its own, and runs ``num_processes=1`` (or Colab
with fewer than 2 GPUs) in the notebook's own process. Here results come back, the port is fresh,
failures and hangs end within seconds, the backend follows the hardware, and even ``nprocs=1`` runs in
a real child process with a real process group, so code behaves the same for any N. Failed ranks are
not restarted: a notebook wants the traceback, not a retry. The price of the forkserver: the first
launch in a kernel starts it (a few seconds: it imports torch), and the payload is pickled at every
launch (captured tensors are copied, not shared).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from ..hardware import BACKENDS, choose_backend
from ..processes import LOOPBACK, free_port, stop_processes, temp_prefix
from . import server
from .loopback import bind_stores_to_loopback, loopback_env, loopback_tcp_store

__all__ = ["LaunchError", "launch"]

_START_METHODS = ("forkserver", "spawn")


class LaunchError(RuntimeError):
    """A launched rank failed, the job timed out, or the launch request cannot work as asked."""


def _choose_start_method(start_method: str | None) -> str:
    if start_method is None:
        return server.start_method()
    if start_method not in _START_METHODS:
        raise ValueError(
            f"start_method must be one of {_START_METHODS} (or None: forkserver where Python has it), not "
            f"{start_method!r}. The kernel is never forked: see mgpu_helpers.launching.server for why."
        )
    return start_method


def _check_backend(backend: str | None, nprocs: int) -> str:
    """``backend`` if it can work with ``nprocs`` processes here; None: :func:`choose_backend`."""
    if backend is None:
        return choose_backend(nprocs)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} (or None to choose), not {backend!r}")
    if backend == "nccl":
        import torch

        if not torch.distributed.is_nccl_available():
            raise ValueError("backend='nccl': this build of torch has no NCCL; use backend='gloo'.")
        gpus = torch.cuda.device_count()  # asks NVML; does not initialise CUDA
        if gpus == 0:
            raise ValueError(
                "backend='nccl' needs CUDA GPUs and none is visible; use backend='gloo' on CPUs."
            )
        if nprocs > gpus:
            raise ValueError(
                f"NCCL needs one GPU per process: you asked for {nprocs} processes but {gpus} GPU(s) are "
                f"visible. Use nprocs={gpus}, or backend='gloo' to run {nprocs} processes on the CPU."
            )
    return backend


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds such as 60, not {value!r}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds such as 60, not {value!r}")
    return float(value)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) while the children start; raise it once they are all known.

    Only the main thread can change signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _join_group(rank: int, world_size: int, port: int, backend: str, timeout: timedelta) -> None:
    """Join the default group through a store that rank 0 hosts on 127.0.0.1:``port`` only."""
    import torch.distributed as dist

    if rank == 0:
        store = loopback_tcp_store(port, world_size, timeout=timeout)
    else:
        store = dist.TCPStore(LOOPBACK, port, world_size, False, timeout=timeout)
    import torch

    # NCCL: name this rank's GPU (the worker set it), else NCCL guesses it from the rank and warns
    # at the barrier below; the communicator is then also formed here, so its errors show at once.
    device_id = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )
    # Every rank has finished connecting to every other before fn runs: otherwise a rank whose fn makes
    # no collective can return and tear the group down while a peer is still connecting to it
    # ("Gloo connectFullMesh failed ... Connection closed by peer").
    dist.barrier()


def _worker(
    rank: int,
    payload: str,
    state: dict[str, Any],
    world_size: int,
    port: int,
    backend: str,
    init_group: bool,
    collective_timeout_s: float,
    threads: int,
    result_dir: str,
    env: dict[str, str],
) -> None:
    """Runs in each child: tie its life to the kernel, take on the kernel's environment, working
    directory and ``sys.path``, set the identity, join the group, call the function."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # started while Ctrl-C was held back
    server.die_with(state)
    server.adopt(state)
    server.keep_freed_memory()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    import cloudpickle
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.set_debug_level_from_env()  # torch read TORCH_DISTRIBUTED_DEBUG at import, before env= applied
    bind_stores_to_loopback()  # also a group that fn creates itself (init_method="env://" or tcp://)
    with open(payload, "rb") as fh:
        fn, args = server.unpack(fh.read())
    if backend == "nccl":
        torch.cuda.set_device(rank)
    if init_group:
        _join_group(rank, world_size, port, backend, timedelta(seconds=collective_timeout_s))
    try:
        result = fn(rank, world_size, *args)
        if not init_group and dist.is_initialized():
            # A group fn made itself: nobody tears it down while a peer may still be connecting to it
            # ("Gloo connectFullMesh failed ... Connection closed by peer", seen once in CI), as
            # _join_group's barrier ensures for launch's own group. A failed peer makes this raise: its
            # own error, written first, is the one reported.
            with contextlib.suppress(RuntimeError):
                dist.barrier()
    except BaseException:
        # Note the time *before* tearing the group down: peers fail as soon as it goes, and the
        # parent must be able to tell the first failure from its consequences.
        import traceback

        with open(os.path.join(result_dir, f"rank{rank}.error"), "wb") as fh:
            pickle.dump((time.time(), traceback.format_exc()), fh)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(result_dir, f"rank{rank}.pkl"), "wb") as fh:
        cloudpickle.dump(result, fh)  # an instance of a class defined in the notebook comes back, too


def _check_launch_args(
    fn: Any, nprocs: Any, args: Any, init_process_group: Any, threads: Any, env: Any
) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function taking (rank, world_size, *args), not {type(fn).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be a whole number of processes such as 2, not {nprocs!r}")
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1 processes, not {nprocs}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of extra arguments for fn, such as (3,), not {args!r}")
    if not isinstance(init_process_group, bool):
        raise TypeError(f"init_process_group must be True or False, not {init_process_group!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads_per_process must be None (choose) or an integer >= 1, not {threads!r}")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise TypeError(f"env must be a dict of str to str such as {{'OMP_NUM_THREADS': '1'}}, not {env!r}")


def launch(
    fn: Callable[..., Any],
    nprocs: int = 2,
    *,
    args: Sequence[Any] = (),
    backend: str | None = None,
    init_process_group: bool = True,
    start_method: str | None = None,
    timeout_s: float = 300.0,
    collective_timeout_s: float = 60.0,
    threads_per_process: int | None = None,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` processes; return the results in rank order.

    Used by notebooks 02a, 02b, 04a, 04b, 05b and 07b, and by the graders.

    Args:
        fn: the function each rank runs. With ``init_process_group=True`` (default) the default process
            group already exists when it starts (``torch.distributed`` is ready to use).
        nprocs: number of processes (the world size), at least 1.
        args: extra arguments passed to ``fn`` after ``rank, world_size`` (a tuple or list).
        backend: "gloo", "nccl", or None for :func:`mgpu_helpers.hardware.choose_backend` (NCCL when
            there is a GPU for every process, else gloo). With NCCL, rank r uses ``cuda:r``.
        init_process_group: join the group before calling ``fn`` (store on ``127.0.0.1:<free port>``);
            set False to call ``dist.init_process_group`` yourself — ``MASTER_ADDR``, ``MASTER_PORT``,
            ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are set, so ``init_method="env://"`` works (and
            its store, too, listens on 127.0.0.1 only).
        start_method: None (the default) starts the ranks from a forkserver where Python has one, else
            with spawn; either way the kernel is never forked (see the module docstring), and ``fn``
            with what it uses from the notebook is pickled by value (cloudpickle), so tensors it captures
            are *copies*, and CUDA tensors must be created inside ``fn``.
        timeout_s: stop everything and raise if the job takes longer than this (seconds, > 0).
        collective_timeout_s: a collective waiting longer than this for a peer raises in that rank.
        threads_per_process: ``torch.set_num_threads`` in each child; default 1: each rank stands for
            one device and gets one core, so that runs with 1 and with N processes compare fairly (and N
            ranks on N cores do not spin-wait against each other).
        env: extra environment variables for the children, on top of this process's environment
            (which the children get as it is at the call, working directory and ``sys.path`` too).

    Raises:
        TypeError, ValueError: bad arguments (the message says what to use instead).
        LaunchError: a rank raised (its traceback is in the message) or was killed, the job timed out,
            or the function cannot be started this way.
    """
    _check_launch_args(fn, nprocs, args, init_process_group, threads_per_process, env)
    timeout_s = _check_seconds("timeout_s", timeout_s)
    collective_timeout_s = _check_seconds("collective_timeout_s", collective_timeout_s)
    backend = _check_backend(backend, nprocs)
    method = _choose_start_method(start_method)
    threads = threads_per_process or 1
    job = (fn, nprocs, tuple(args), backend, init_process_group, timeout_s, collective_timeout_s)
    return _run(*job, threads, env, method=method)


def _run(
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple[Any, ...],
    backend: str,
    init_process_group: bool,
    timeout_s: float,
    collective_timeout_s: float,
    threads: int,
    env: dict[str, str] | None,
    *,
    method: str,
) -> list[Any]:
    """:func:`launch` after its checks. ``method`` is "forkserver" or "spawn"; ``benchmarks/launch.py``
    also passes "fork" to measure what the forkserver costs against a plain fork."""
    import torch.multiprocessing as mp

    context = None
    earlier = set(multiprocessing.active_children())
    result_dir = tempfile.mkdtemp(prefix=temp_prefix("launch"))
    try:
        payload = os.path.join(result_dir, "payload.pkl")
        with open(payload, "wb") as fh:
            fh.write(server.pack(fn, args))
        if method != "fork":
            server.context()  # sets the forkserver's preload list before its first start
        worker_args = (
            payload, server.snapshot(method), nprocs, free_port(), backend, init_process_group,
            collective_timeout_s, threads, result_dir, {**loopback_env(), **(env or {})},
        )  # fmt: skip
        # a Ctrl-C now would leave children we have no handle on
        with _interrupts_deferred(), server.no_main_import():
            context = mp.start_processes(
                _worker, args=worker_args, nprocs=nprocs, join=False, start_method=method
            )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=0.1, grace_period=1.0):
            if time.monotonic() > deadline:
                alive = [i for i, p in enumerate(context.processes) if p.is_alive()]
                raise LaunchError(
                    f"timed out after {timeout_s:g} s with rank(s) {alive} still running. A rank waiting "
                    f"in a collective for a peer that never arrives blocks until collective_timeout_s "
                    f"({collective_timeout_s:g} s); raise timeout_s if the job is just slow."
                )
        results = []
        for rank in range(nprocs):
            with open(os.path.join(result_dir, f"rank{rank}.pkl"), "rb") as fh:
                results.append(pickle.load(fh))
        return results
    except mp.ProcessRaisedException as exc:
        stop_processes(context.processes, grace_s=1.0)
        raise LaunchError(_failure_report(result_dir, nprocs, exc.error_index, exc.msg)) from None
    except mp.ProcessExitedException as exc:
        how = f"was killed by {exc.signal_name}" if exc.signal_name else f"exited with code {exc.exit_code}"
        raise LaunchError(
            f"rank {exc.error_index} {how} without a Python traceback; the out-of-memory killer, a crash "
            "in native code, or a call to os._exit / sys.exit in fn are the usual causes."
        ) from None
    finally:
        # An interrupt can land inside start_processes, after some children exist but before it
        # returns their context: find them as our new multiprocessing children. (Left running, they
        # would also keep Python from exiting: it joins non-daemon children at exit.)
        started = context.processes if context is not None else []
        stop_processes([*started, *(set(multiprocessing.active_children()) - earlier)], grace_s=1.0)
        shutil.rmtree(result_dir, ignore_errors=True)
        # torch writes a failed rank's traceback to /tmp/pytorch-errorfile-*.pickle and never removes it
        for path in getattr(context, "error_files", None) or []:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _failure_report(result_dir: str, nprocs: int, index: int, msg: str) -> str:
    """Name the rank that failed *first*: when one rank dies, its peers fail too ("connection reset")."""
    failures = []
    for rank in range(nprocs):
        try:
            with open(os.path.join(result_dir, f"rank{rank}.error"), "rb") as fh:
                when, text = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError):
            continue
        failures.append((when, rank, text))
    if not failures:
        return f"rank {index} raised:\n{msg}"
    failures.sort()
    _, first, text = failures[0]
    others = [r for _, r, _ in failures[1:]]
    note = (
        f"\n(rank(s) {others} failed after it, most likely because rank {first} was gone)" if others else ""
    )
    return f"rank {first} raised first:\n{text}{note}"
