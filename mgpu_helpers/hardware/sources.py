"""Used by every notebook through :func:`mgpu_helpers.hardware.describe_node`, and by the memory panel
and notebook 07 through :func:`nvml_memory`: what each source says about this machine.

The host (CPU model, cores, RAM via psutil) and the three GPU sources -- NVML (``pynvml``), GPUtil
(``nvidia-smi``) and ``torch.cuda`` -- are asked separately; each query returns its rows plus one
sentence saying what it found or why it failed, and never raises. ``torch.cuda`` is asked
fork-safely (see the package docstring, "Fork safety"): nothing here creates a CUDA context unless
``allow_cuda_init`` is True or CUDA is already initialised in this process.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from ._rows import MIB, _as_str, _err, _finite, _names_summary, _plural, _Row, _try

# --------------------------------------------------------------------------------------
# host (CPU, RAM)
# --------------------------------------------------------------------------------------


def _cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """CPU model name from /proc/cpuinfo, sysctl (macOS) or ``platform.processor()``."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            ).stdout
            if out.strip():
                return " ".join(out.split())
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        proc = platform.processor().strip()
    except Exception:
        proc = ""
    if proc and proc.lower() != "unknown":
        return proc
    return "unknown CPU"


def _host_memory_and_cores() -> tuple[int | None, int | None, int | None, int | None, str | None]:
    """(logical cores, physical cores, RAM total, RAM available, failure sentence or None)."""
    logical = os.cpu_count()
    try:
        import psutil

        logical = psutil.cpu_count(logical=True) or logical
        physical = psutil.cpu_count(logical=False)
        vm = psutil.virtual_memory()
        return logical, physical, int(vm.total), int(vm.available), None
    except Exception as exc:
        return logical, None, None, None, f"host: psutil failed ({_err(exc)}); RAM and physical cores unknown"


# --------------------------------------------------------------------------------------
# NVML and GPUtil (driver numbering)
# --------------------------------------------------------------------------------------


def _nvml_failure(exc: BaseException) -> str:
    """Explain an ``nvmlInit`` failure in one sentence."""
    kind = type(exc).__name__
    if kind == "NVMLError_LibraryNotFound":
        return (
            "nvml: NVIDIA driver library not found (NVMLError_LibraryNotFound) "
            "— normal on a machine without an NVIDIA GPU"
        )
    if kind == "NVMLError_DriverNotLoaded":
        return (
            "nvml: NVIDIA driver library found but the driver is not loaded "
            "(NVMLError_DriverNotLoaded) — run nvidia-smi to check the driver"
        )
    if kind == "NVMLError_LibRmVersionMismatch":
        return (
            "nvml: driver/library version mismatch (NVMLError_LibRmVersionMismatch) "
            "— the NVIDIA driver was updated; reboot (or reload the nvidia kernel module)"
        )
    if kind == "NVMLError_NoPermission":
        return "nvml: no permission to talk to the NVIDIA driver (NVMLError_NoPermission)"
    return f"nvml: nvmlInit failed ({_err(exc)})"


def _query_nvml() -> tuple[list[_Row], str]:
    """Ask NVML (pynvml) for every GPU the driver knows, in the driver's (PCI bus) order."""
    try:
        import pynvml
    except Exception as exc:
        return [], f"nvml: import pynvml failed ({_err(exc)}) — pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return [], _nvml_failure(exc)
    rows: list[_Row] = []
    try:
        driver = _try(lambda: _as_str(pynvml.nvmlSystemGetDriverVersion()))
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            return [], f"nvml: nvmlDeviceGetCount failed ({_err(exc)})"
        problems: list[str] = []
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception as exc:
                problems.append(f"GPU {i}: {_err(exc)}")
                continue

            def memory(h: Any = handle) -> tuple[int, int]:
                info = pynvml.nvmlDeviceGetMemoryInfo(h)
                return int(info.total), int(info.used)

            mem = _try(memory)
            util = _try(lambda h=handle: _finite(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            rows.append(
                _Row(
                    index=i,
                    name=_try(lambda h=handle: _as_str(pynvml.nvmlDeviceGetName(h))) or None,
                    memory_total_bytes=mem[0] if mem else None,
                    memory_used_bytes=mem[1] if mem else None,
                    utilization_percent=util,
                    uuid=_try(lambda h=handle: _as_str(pynvml.nvmlDeviceGetUUID(h))) or None,
                )
            )
    except Exception as exc:
        return rows, f"nvml: query failed ({_err(exc)})"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    sentence = f"nvml: {_plural(len(rows), 'GPU')}"
    if rows:
        sentence += f" ({_names_summary(rows)})"
    if driver:
        sentence += f", driver {driver}"
    if problems:
        sentence += "; could not open " + "; ".join(problems)
    return rows, sentence


def nvml_memory() -> list[dict[str, Any]] | None:
    """Used and total memory of every GPU as the NVIDIA driver sees it (all processes), or None.

    Cheap enough to call once per training step (the memory panel does). Returns None when NVML is
    unavailable (no NVIDIA driver). Rows are numbered as CUDA numbers them in this process: under
    ``CUDA_VISIBLE_DEVICES`` only the visible GPUs, renumbered from 0 and matched by UUID (the same rule
    as :func:`~mgpu_helpers.hardware.describe_node`), so ``index`` can be compared with ``cuda:<index>``.
    """
    from .visible import _filter_rows, _parse_visible_devices

    rows, _ = _query_nvml()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if rows and visible is not None:
        rows, _ = _filter_rows(rows, visible, _parse_visible_devices(visible), "NVML")
    if not rows:
        return None
    return [
        {"index": r.index, "name": r.name, "used": r.memory_used_bytes, "total": r.memory_total_bytes}
        for r in rows
        if r.memory_used_bytes is not None and r.memory_total_bytes is not None
    ]


def _gputil_import_failure(exc: BaseException) -> str:
    """Explain why ``import GPUtil`` failed, with the fix."""
    text = _err(exc)
    if "distutils" in str(exc) or getattr(exc, "name", None) == "distutils":
        return (
            f"gputil: import failed ({text}) — on Python >= 3.12 install setuptools: pip install setuptools"
        )
    if isinstance(exc, ImportError):
        return f"gputil: import failed ({text}) — pip install gputil"
    return f"gputil: import failed ({text})"


def _query_gputil() -> tuple[list[_Row], str]:
    """Ask GPUtil, i.e. ``nvidia-smi``, for the GPUs (driver numbering)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GPUtil imports the deprecated distutils
            import GPUtil
    except Exception as exc:
        return [], _gputil_import_failure(exc)
    try:
        gpus = list(GPUtil.getGPUs())
    except Exception as exc:
        return [], (
            f"gputil: GPUtil.getGPUs() failed ({_err(exc)}) — nvidia-smi probably printed an "
            "error instead of a GPU table; run nvidia-smi to see it"
        )
    if not gpus:
        if shutil.which("nvidia-smi") is None:
            return [], "gputil: nvidia-smi not found on PATH, so GPUtil sees no GPU"
        return [], "gputil: nvidia-smi ran but reported no GPU"
    rows: list[_Row] = []
    for position, gpu in enumerate(gpus):
        total = _finite(getattr(gpu, "memoryTotal", None))
        used = _finite(getattr(gpu, "memoryUsed", None))
        load = _finite(getattr(gpu, "load", None))
        index = _try(lambda g=gpu: int(g.id))
        name = getattr(gpu, "name", None)
        uuid = getattr(gpu, "uuid", None)
        rows.append(
            _Row(
                index=position if index is None else index,
                name=_as_str(name) if name else None,
                memory_total_bytes=None if total is None else int(total * MIB),
                memory_used_bytes=None if used is None else int(used * MIB),
                utilization_percent=None if load is None else load * 100.0,
                uuid=_as_str(uuid) if uuid else None,
            )
        )
    return rows, f"gputil: {_plural(len(rows), 'GPU')} via nvidia-smi ({_names_summary(rows)})"


# --------------------------------------------------------------------------------------
# torch.cuda (CUDA numbering), fork-safe by default
# --------------------------------------------------------------------------------------


@dataclass
class _TorchAnswer:
    """What torch.cuda said."""

    rows: list[_Row]
    sentence: str
    cuda_available: bool
    cuda_runtime: str | None
    torch_version: str
    count: int | None


def _cuda_usable(allow_cuda_init: bool) -> bool:
    """Whether torch can use CUDA, without poisoning fork unless allowed or already done.

    Without permission this is ``device_count() > 0`` (NVML based, the same check as
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1``); it can be True while CUDA itself would fail
    (e.g. a driver too old for this torch build).
    """
    import torch

    if not torch.backends.cuda.is_built():
        return False
    if allow_cuda_init or torch.cuda.is_initialized():
        return bool(torch.cuda.is_available())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Can't initialize NVML" when the driver is absent
        return torch.cuda.device_count() > 0


def _query_torch(allow_cuda_init: bool, used_known: set[int]) -> _TorchAnswer:
    """Ask torch.cuda, touching the CUDA context only when allowed (or already initialised).

    ``used_known`` holds the CUDA indices whose used memory NVML already gave, so that
    ``mem_get_info`` (which creates a context on each device it is asked about) is skipped.
    """
    try:
        import torch
    except Exception as exc:
        sentence = f"torch.cuda: import torch failed ({_err(exc)})"
        return _TorchAnswer([], sentence, False, None, "not installed", None)
    version = str(torch.__version__)
    runtime = torch.version.cuda
    hip = getattr(torch.version, "hip", None)
    if not torch.backends.cuda.is_built():
        sentence = f"torch.cuda: 0 devices visible (this torch build has no CUDA: {version})"
        return _TorchAnswer([], sentence, False, None, version, 0)
    build = f"CUDA {runtime}" if runtime else f"ROCm/HIP {hip}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            count = int(torch.cuda.device_count())
        available = _cuda_usable(allow_cuda_init)
    except Exception as exc:
        sentence = f"torch.cuda: device_count() failed ({_err(exc)})"
        return _TorchAnswer([], sentence, False, runtime, version, None)
    if count == 0:
        hidden = ", or CUDA_VISIBLE_DEVICES hides it" if "CUDA_VISIBLE_DEVICES" in os.environ else ""
        sentence = f"torch.cuda: 0 devices visible ({build} build, but no usable GPU or driver{hidden})"
        return _TorchAnswer([], sentence, available, runtime, version, 0)
    may_init = allow_cuda_init or torch.cuda.is_initialized()
    if not may_init:
        # get_device_properties/get_device_name would run _lazy_init() and create the CUDA
        # context; a notebook could then no longer start fork-based workers. NVML or GPUtil
        # supply the names; without them the devices stay "unknown".
        rows = [_Row(i) for i in range(count)]
        sentence = (
            f"torch.cuda: {_plural(count, 'device')} visible ({build}); names and memory were not "
            "asked from torch because that initialises CUDA in this process "
            "(describe_node(allow_cuda_init=True) does it)"
        )
        return _TorchAnswer(rows, sentence, available, runtime, version, count)
    rows = []
    problems: list[str] = []
    for i in range(count):
        row = _Row(i)
        try:
            props = torch.cuda.get_device_properties(i)
            row.name = _as_str(props.name) or None
            row.memory_total_bytes = int(props.total_memory)
        except Exception as exc:
            problems.append(f"device {i}: {_err(exc)}")
        if allow_cuda_init and i not in used_known:
            # mem_get_info creates a context on device i (costs GPU memory): only when needed.
            try:
                free, total = torch.cuda.mem_get_info(i)
                row.memory_used_bytes = int(total) - int(free)
            except Exception as exc:
                problems.append(f"mem_get_info({i}): {_err(exc)}")
        rows.append(row)
    sentence = f"torch.cuda: {_plural(count, 'device')} visible ({_names_summary(rows)}; {build})"
    if problems:
        sentence += "; failed: " + "; ".join(problems)
    return _TorchAnswer(rows, sentence, available, runtime, version, count)
