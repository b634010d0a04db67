"""Used by notebook 00's exercises: ``pick_device()`` (00.1) and ``machine_report(nprocs)`` (00.2).

Both graders call the student's function on this machine as it is, and then on machines it pretends
to be: ``torch.cuda.is_available`` / ``torch.cuda.device_count`` (and, for 00.2,
``torch.distributed.is_nccl_available``; ``torch.accelerator``'s answers too) are replaced for the
duration of one call, so that a CPU-only laptop, a one-GPU Colab runtime and a 2- or 4-GPU server are
all checked on any machine. The exercises
ask for the rule written with ``torch.cuda`` and ``os``: a function that asks :mod:`mgpu_helpers.hardware`
instead (``choose_backend``, ``recommended_device``, ``describe_node``) is told so on a pretend machine.
Nothing here touches a GPU: a pretend GPU exists only in those answers. The real machine's answers are
compared with :mod:`mgpu_helpers.hardware` (``describe_node``, ``choose_backend``). For 00.2's CPU count,
where ``os.sched_getaffinity`` exists (Linux), the grader also pretends to be a container that lets this
process run on 3 of a 64-core machine's cores, so that counting the machine (``os.cpu_count()``) instead
of the cores the process may use is told apart on any machine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

from ..exercises import Wrong, exercise
from ..hardware import choose_backend, describe_node
from ..hardware import sources as _sources

#: Pretend machines: (description, number of CUDA GPUs torch would see).
_PRETEND = (
    ("a CPU-only laptop", 0),
    ("a 1-GPU Colab runtime", 1),
    ("a 2-GPU Kaggle box", 2),
    ("a 4-GPU server", 4),
)


@contextlib.contextmanager
def _pretend_gpus(count: int, where: str) -> Iterator[None]:
    """For the duration of the block, torch reports ``count`` CUDA GPUs (0: none, CUDA unavailable); a
    student function that asks the course's hardware helpers instead of torch is refused afterwards."""
    asked: list[bool] = []

    def helper_asked(*args: Any, **kwargs: Any) -> bool:
        asked.append(True)
        return False

    with contextlib.ExitStack() as stack:
        for owner, name, value in (
            (torch.cuda, "is_available", lambda: count > 0),
            (torch.cuda, "device_count", lambda: count),
            (dist, "is_nccl_available", lambda: count > 0),
            (_sources, "_cuda_usable", helper_asked),
        ):
            stack.enter_context(mock.patch.object(owner, name, value))
        # The device-generic API must say the same, as on a CUDA build of torch (Colab's, also on its CPU
        # runtime): without check_available=True it names the build's accelerator, GPU or not.
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "current_accelerator"):
            gpu = torch.device("cuda") if count > 0 else None

            def current_accelerator(check_available: bool = False) -> torch.device | None:
                return gpu if check_available else torch.device("cuda")

            stack.enter_context(mock.patch.object(accelerator, "current_accelerator", current_accelerator))
            stack.enter_context(mock.patch.object(accelerator, "is_available", lambda: count > 0))
            stack.enter_context(mock.patch.object(accelerator, "device_count", lambda: count))
        yield
    if asked:
        raise Wrong(
            f"on {where} your function asked mgpu_helpers.hardware (choose_backend, recommended_device or "
            "describe_node) instead of deciding itself: write the rule with torch.cuda and os."
        )


def _call(fn: Callable[..., Any], where: str, *args: Any) -> Any:
    """Call the student's function; a crash on a pretend machine becomes feedback naming that machine."""
    try:
        return fn(*args)
    except (NotImplementedError, Wrong):
        raise
    except Exception as exc:
        raise Wrong(
            f"on {where} your function raised {type(exc).__name__}: {exc}. It should only ask torch "
            "what it can use, not use a GPU: a pretend machine's GPUs exist only in torch's answers."
        ) from exc


def _device_ok(got: Any, gpus: int, where: str) -> None:
    if not isinstance(got, torch.device):
        raise Wrong(f"on {where} it returned {got!r} (a {type(got).__name__}), not a torch.device.")
    if gpus == 0 and got.type != "cpu":
        raise Wrong(
            f"on {where} (no usable CUDA GPU; torch is a CUDA build, as on Colab) it returned {got}, which "
            "that machine cannot use: ask whether CUDA is *available*, not whether torch was built with it."
        )
    if gpus > 0 and got.type != "cuda":
        raise Wrong(f"on {where} ({gpus} CUDA GPU(s)) it returned {got}: the GPU was left unused.")
    if gpus > 0 and got.index not in (None, 0):
        raise Wrong(f"on {where} ({gpus} CUDA GPU(s)) it returned {got}, not the first GPU.")


@exercise(
    "00.1",
    "pick the device",
    task="pick_device() returns a torch.device: the first CUDA GPU when PyTorch can use one, else the CPU. "
    "Called on this machine, then on pretend machines with 0, 1, 2 and 4 GPUs (torch.cuda's and "
    "torch.accelerator's answers replaced for the call, as on a CUDA build of torch); asking "
    "mgpu_helpers.hardware instead is refused, and it may only ask, not use a GPU.",
    hint="ask torch whether CUDA is usable; the answer is a torch.device: the first GPU, else the CPU",
)
def _grade_pick_device(pick_device: Callable[[], Any]) -> str:
    real_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _device_ok(_call(pick_device, "this machine"), real_gpus, "this machine")
    for where, gpus in _PRETEND:
        with _pretend_gpus(gpus, where):
            got = _call(pick_device, where)
        _device_ok(got, gpus, where)
    return f"right on this machine ({real_gpus} GPU(s)) and on pretend machines with 0, 1, 2 and 4 GPUs."


#: A container (or ``taskset``) that lets this process run on 3 of a 64-core machine's cores.
_CONTAINER = ("a container that lets this process use 3 of a 64-core machine's cores", 64, {0, 1, 2})


def _cpu_counts() -> set[int]:
    """The honest answers to 'how many CPU cores may this process run on': its affinity where ``os`` can
    tell (Linux), else the machine's count; Python 3.13's ``os.process_cpu_count()`` says the same."""
    if hasattr(os, "sched_getaffinity"):
        counts = {len(os.sched_getaffinity(0))}
    else:
        counts = {n for n in (os.cpu_count(), describe_node().cpu_cores_logical) if n}
    if hasattr(os, "process_cpu_count"):
        counts.add(os.process_cpu_count())
    return counts


def _cpus_ok(got: Any, cpus: set[int], machine: int, where: str) -> None:
    if got not in cpus:
        of = f" of the machine's {machine} (a container or taskset can leave a process fewer)."
        raise Wrong(
            f"on {where} it reported {got!r} CPU cores; this process may run on {min(cpus)}"
            + (of if machine not in cpus else ".")
        )


def _report_ok(report: Any, nprocs: int, gpus: int, where: str, backend: str) -> None:
    if not isinstance(report, dict) or not {"cpus", "gpus", "backend"} <= set(report):
        raise Wrong(f"on {where} it returned {report!r}, not a dict with the keys 'cpus', 'gpus', 'backend'.")
    if report["gpus"] != gpus:
        raise Wrong(f"on {where} it reported {report['gpus']!r} GPUs; torch there can use {gpus}.")
    if report["backend"] != backend:
        raise Wrong(
            f"on {where}, for {nprocs} process(es) it chose {report['backend']!r}; with {gpus} GPU(s) "
            f"that job needs {backend!r}."
        )


@exercise(
    "00.2",
    "report the machine",
    task=(
        "machine_report(nprocs) returns a dict: 'cpus' (the cores this process may run on), 'gpus' (the "
        "CUDA GPUs PyTorch can use), 'backend' ('nccl' or 'gloo' for nprocs processes here). Checked "
        "against describe_node() and choose_backend() here, then for 1, 2 and 4 processes on pretend 0-, "
        "1-, 2- and 4-GPU machines and (on Linux) a container allowing 3 of 64 cores; asking "
        "mgpu_helpers.hardware is refused."
    ),
    hint=(
        "count the cores this process may use with os, the GPUs with torch.cuda; NCCL needs a GPU of its "
        "own for every process, gloo runs anywhere"
    ),
)
def _grade_machine_report(machine_report: Callable[[int], Any]) -> str:
    info = describe_node()
    cpus = _cpu_counts()
    for nprocs in (1, 2):
        report = _call(machine_report, "this machine", nprocs)
        _report_ok(report, nprocs, info.gpu_count, "this machine", choose_backend(nprocs, info=info))
        _cpus_ok(report["cpus"], cpus, os.cpu_count() or 0, "this machine")
    if hasattr(os, "sched_getaffinity"):
        where, machine, allowed = _CONTAINER
        with contextlib.ExitStack() as pretend:
            pretend.enter_context(mock.patch.object(os, "cpu_count", lambda: machine))
            pretend.enter_context(mock.patch.object(os, "sched_getaffinity", lambda pid: set(allowed)))
            with contextlib.suppress(ImportError):  # psutil asks the kernel itself: it pretends too
                import psutil

                pretend.enter_context(
                    mock.patch.object(psutil.Process, "cpu_affinity", lambda self, *a: sorted(allowed))
                )
            report = _call(machine_report, where, 1)
        _report_ok(report, 1, info.gpu_count, where, choose_backend(1, info=info))
        _cpus_ok(report["cpus"], {len(allowed)}, machine, where)
    for where, gpus in _PRETEND:
        for nprocs in (1, 2, 4):
            with _pretend_gpus(gpus, where):
                report = _call(machine_report, where, nprocs)
            _report_ok(report, nprocs, gpus, where, "nccl" if gpus >= nprocs else "gloo")
    return (
        f"this machine: {info.gpu_count} GPU(s), {min(cpus)} CPU core(s) for this process, backend as "
        "mgpu_helpers.hardware chooses it; jobs of 1, 2 and 4 processes on pretend machines with 0, 1, 2 and "
        "4 GPUs" + ("; and a container allowing 3 of 64 cores." if hasattr(os, "sched_getaffinity") else ".")
    )
