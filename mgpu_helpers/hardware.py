"""Describe the machine a notebook runs on: CPU, RAM and the NVIDIA GPUs, if any.

Three libraries can tell us about GPUs and each fails in its own way, so all three are asked
and every answer (or failure) is kept as a sentence in ``NodeInfo.sources``:

* ``torch.cuda`` -- what *this* PyTorch build can use.
* ``nvml`` -- the NVIDIA driver library, through ``pynvml`` (package ``nvidia-ml-py``).
* ``gputil`` -- the ``GPUtil`` package, which parses the output of ``nvidia-smi``.

Fork safety
-----------
Notebooks that start workers with ``start_method="fork"`` break as soon as the parent process
has touched CUDA ("Cannot re-initialize CUDA in forked subprocess"). In PyTorch:

* ``torch.cuda.get_device_properties`` and ``torch.cuda.get_device_name`` (which calls it) run
  ``torch.cuda._lazy_init()`` and create the CUDA context.
* ``torch.cuda.mem_get_info(i)`` creates a context *on device i* (hundreds of MiB per GPU).
* ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount`` unless
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set; that does not create a context but does mark
  the process so that forked children may no longer use CUDA.
* ``torch.cuda.device_count()`` asks NVML first and stays fork-safe while NVML works.

So by default this module only calls ``torch.cuda.device_count()`` and reads names, memory
and utilisation from NVML (or GPUtil). Pass ``allow_cuda_init=True`` to
:func:`describe_node` to also ask torch (when NVML is missing, for example).

Importing this module is cheap: torch, psutil, pynvml and GPUtil are imported inside the
functions that need them.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPUInfo",
    "NodeInfo",
    "describe_node",
    "format_node_table",
    "hardware_label",
    "nvml_memory",
    "recommended_backend",
    "recommended_device",
]

_MIB = 1024**2
_GIB = 1024**3
_UNKNOWN_GPU_NAME = "unknown CUDA device"
_T = TypeVar("_T")


@dataclass
class GPUInfo:
    """One GPU as this process sees it.

    ``index`` is the CUDA index (``cuda:<index>``), i.e. after ``CUDA_VISIBLE_DEVICES`` has
    been applied. ``source`` names the libraries whose values were used, joined with ``+``
    (``"torch.cuda"``, ``"nvml"``, ``"gputil"``, ``"torch.cuda+nvml"``, ...).
    """

    index: int
    name: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: float | None = None
    source: str = ""


@dataclass
class NodeInfo:
    """Hardware and software of one machine (node), as returned by :func:`describe_node`.

    ``sources`` maps ``"torch.cuda"``, ``"nvml"`` and ``"gputil"`` to a sentence saying what
    that library answered or why it could not. It may also hold ``"CUDA_VISIBLE_DEVICES"``
    (how that variable was applied) and ``"host"`` (a failure while reading CPU/RAM data).
    """

    hostname: str
    os: str
    python_version: str
    torch_version: str
    cpu_model: str
    cpu_cores_logical: int | None
    cpu_cores_physical: int | None
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    gpus: list[GPUInfo] = field(default_factory=list)
    cuda_available: bool = False
    cuda_runtime: str | None = None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        """Number of GPUs listed in ``gpus``."""
        return len(self.gpus)

    @property
    def is_multi_gpu(self) -> bool:
        """True when more than one GPU is listed."""
        return self.gpu_count > 1


@dataclass
class _Row:
    """One device as a single library reported it (index in that library's numbering)."""

    index: int
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: float | None = None
    uuid: str | None = None


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def _err(exc: BaseException) -> str:
    """``"TypeName: message"`` for an exception, without a trailing colon when empty."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _as_str(value: Any) -> str:
    """Decode bytes (old pynvml versions return bytes) and strip."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return str(value).strip()


def _finite(value: Any) -> float | None:
    """``float(value)`` or None when it is missing, not a number, or NaN (GPUtil's "[N/A]")."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _try(fn: Callable[[], _T]) -> _T | None:
    """Call ``fn`` and return None on any exception (for optional per-device fields)."""
    try:
        return fn()
    except Exception:
        return None


def _plural(n: int, word: str) -> str:
    """``"1 GPU"``, ``"2 GPUs"``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def _names_summary(rows: list[_Row]) -> str:
    """``"2x NVIDIA A100, 1x Tesla T4"`` style summary of the names in ``rows``."""
    groups: dict[str, int] = {}
    for row in rows:
        name = row.name or _UNKNOWN_GPU_NAME
        groups[name] = groups.get(name, 0) + 1
    return ", ".join(f"{count}× {name}" for name, count in groups.items())


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
# CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------------------


def _parse_visible_devices(value: str) -> list[int] | list[str] | None:
    """Parse ``CUDA_VISIBLE_DEVICES`` the way CUDA (and torch) does.

    Returns physical indices, or ``"GPU-..."`` UUID prefixes, or None when the entries cannot
    be mapped to NVML/GPUtil rows (MIG instances). An invalid entry ends the list, a repeated
    entry makes the list empty, and ``""`` or ``"-1"`` hide every GPU.
    """
    tokens = [token.strip() for token in value.split(",")]
    if tokens[0].startswith("MIG-"):
        return None
    if tokens[0].startswith("GPU-"):
        uuids: list[str] = []
        for token in tokens:
            if not token.startswith("GPU-"):
                break
            if token in uuids:
                return []
            uuids.append(token)
        return uuids
    indices: list[int] = []
    for token in tokens:
        match = re.match(r"\+?(\d+)", token)
        if match is None:
            break
        number = int(match.group(1))
        if number in indices:
            return []
        indices.append(number)
    return indices


def _apply_visible_devices(rows: list[_Row], wanted: list[int] | list[str]) -> list[_Row] | None:
    """Keep the rows CUDA can see, in CUDA order, re-indexed from 0; None if UUIDs are missing.

    Like CUDA, the first entry that matches no device ends the list.
    """
    picked: list[_Row] = []
    for entry in wanted:
        if isinstance(entry, int):
            matches = [row for row in rows if row.index == entry]
        else:
            if any(row.uuid is None for row in rows):
                return None
            matches = [row for row in rows if row.uuid is not None and row.uuid.startswith(entry)]
        if len(matches) != 1:
            break
        picked.append(matches[0])
    return [
        _Row(i, row.name, row.memory_total_bytes, row.memory_used_bytes, row.utilization_percent, row.uuid)
        for i, row in enumerate(picked)
    ]


def _filter_rows(
    rows: list[_Row], value: str | None, parsed: list[int] | list[str] | None, label: str
) -> tuple[list[_Row], str | None]:
    """Apply ``CUDA_VISIBLE_DEVICES`` to one library's rows; returns (rows, note or None)."""
    if value is None or not rows:
        return rows, None
    if parsed is None:
        return rows, f"{label} rows are not filtered (MIG entries cannot be matched), indices may differ"
    filtered = _apply_visible_devices(rows, parsed)
    if filtered is None:
        return rows, f"{label} gave no UUIDs to match, so its rows are not filtered"
    return filtered, None


def _visible_devices_sentence(value: str, parsed: list[int] | list[str] | None, notes: list[str]) -> str:
    """Sentence for ``sources["CUDA_VISIBLE_DEVICES"]``."""
    head = f"CUDA_VISIBLE_DEVICES={value!r}: "
    if parsed is None:
        body = (
            "MIG instances cannot be mapped to NVML/GPUtil rows; those are listed as the driver numbers them"
        )
    elif not parsed:
        body = "hides every GPU from CUDA"
    else:
        shown = ",".join(str(entry) for entry in parsed)
        body = (
            f"CUDA sees physical GPU(s) {shown}; NVML/GPUtil rows were limited to them "
            "and re-indexed from 0 as torch numbers them"
        )
    return head + body + "".join(f"; {note}" for note in notes)


# --------------------------------------------------------------------------------------
# the three GPU sources
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
    unavailable (no NVIDIA driver); rows are in the driver's numbering, not ``CUDA_VISIBLE_DEVICES``'.
    """
    rows, _ = _query_nvml()
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
                memory_total_bytes=None if total is None else int(total * _MIB),
                memory_used_bytes=None if used is None else int(used * _MIB),
                utilization_percent=None if load is None else load * 100.0,
                uuid=_as_str(uuid) if uuid else None,
            )
        )
    return rows, f"gputil: {_plural(len(rows), 'GPU')} via nvidia-smi ({_names_summary(rows)})"


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


def _merge(per_source: dict[str, list[_Row]]) -> list[GPUInfo]:
    """Merge rows by CUDA index: name/memory from torch, NVML, GPUtil; utilisation from NVML, GPUtil."""
    order = ("torch.cuda", "nvml", "gputil")
    by_index: dict[int, dict[str, _Row]] = {}
    for source in order:
        for row in per_source.get(source, []):
            by_index.setdefault(row.index, {})[source] = row

    gpus: list[GPUInfo] = []
    for index in sorted(by_index):
        rows = by_index[index]
        used: list[str] = []

        def pick(
            attr: str, sources: tuple[str, ...], rows: dict[str, _Row] = rows, used: list[str] = used
        ) -> Any:
            for source in sources:
                row = rows.get(source)
                value = None if row is None else getattr(row, attr)
                if value is not None:
                    if source not in used:
                        used.append(source)
                    return value
            return None

        name = pick("name", order)
        total = pick("memory_total_bytes", order)
        mem_used = pick("memory_used_bytes", order)
        util = pick("utilization_percent", ("nvml", "gputil"))
        if not used:
            used.append(next(s for s in order if s in rows))
        used.sort(key=order.index)
        gpus.append(GPUInfo(index, name or _UNKNOWN_GPU_NAME, total, mem_used, util, "+".join(used)))
    return gpus


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def describe_node(allow_cuda_init: bool = False) -> NodeInfo:
    """Describe this machine: host, CPU, RAM, torch/CUDA and every GPU this process can see.

    Never raises: whatever fails is explained in ``NodeInfo.sources``.

    GPUs are read from NVML (names, memory, utilisation), GPUtil/``nvidia-smi`` and
    ``torch.cuda.device_count()``, none of which creates a CUDA context, so fork-based
    multiprocessing still works afterwards. With ``allow_cuda_init=True`` (or when CUDA is
    already initialised in this process) ``torch.cuda.get_device_properties`` is asked too,
    and with ``allow_cuda_init=True`` ``torch.cuda.mem_get_info`` fills in used memory NVML
    could not give; both create a CUDA context (``mem_get_info`` one per GPU).

    ``CUDA_VISIBLE_DEVICES`` renumbers devices for CUDA/torch but not for NVML or
    ``nvidia-smi``. When it is set to integers or ``GPU-<uuid>`` prefixes, only the NVML/GPUtil
    rows of the visible GPUs are kept, re-indexed from 0 in the order listed (``"2,0"`` shows
    physical GPU 2 as index 0), so ``GPUInfo.index`` is the index for ``cuda:<index>``. MIG
    entries cannot be matched and are reported in ``sources`` instead. NVML numbers GPUs in
    PCI bus order, CUDA by default fastest first: on a machine with mixed GPU models set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for the indices to agree.

    Args:
        allow_cuda_init: allow torch calls that initialise CUDA in this process.

    Returns:
        A :class:`NodeInfo`.
    """
    host_problem: str | None = None
    try:
        logical, physical, ram_total, ram_available, host_problem = _host_memory_and_cores()
    except Exception as exc:  # pragma: no cover - _host_memory_and_cores already catches
        logical, physical, ram_total, ram_available = os.cpu_count(), None, None, None
        host_problem = f"host: {_err(exc)}"

    def safe(fn: Callable[[], str], fallback: str) -> str:
        try:
            return fn()
        except Exception:
            return fallback

    hostname = safe(socket.gethostname, "unknown host")
    os_name = safe(platform.platform, sys.platform)
    python_version = safe(platform.python_version, sys.version.split()[0])
    cpu_model = safe(_cpu_model, "unknown CPU")

    def guarded(fn: Callable[[], tuple[list[_Row], str]], label: str) -> tuple[list[_Row], str]:
        try:
            return fn()
        except Exception as exc:  # the query functions catch everything; this is a last resort
            return [], f"{label}: unexpected failure ({_err(exc)})"

    nvml_rows, nvml_sentence = guarded(_query_nvml, "nvml")
    gputil_rows, gputil_sentence = guarded(_query_gputil, "gputil")

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    parsed = _parse_visible_devices(visible) if visible is not None else None
    notes: list[str] = []
    nvml_rows, note = _filter_rows(nvml_rows, visible, parsed, "NVML")
    notes += [note] if note else []
    gputil_rows, note = _filter_rows(gputil_rows, visible, parsed, "GPUtil")
    notes += [note] if note else []

    used_known = {row.index for row in nvml_rows if row.memory_used_bytes is not None}
    try:
        torch_answer = _query_torch(allow_cuda_init, used_known)
    except Exception as exc:
        sentence = f"torch.cuda: unexpected failure ({_err(exc)})"
        torch_answer = _TorchAnswer([], sentence, False, None, "unknown", None)

    torch_sentence = torch_answer.sentence
    if torch_answer.count and nvml_rows and len(nvml_rows) != torch_answer.count:
        torch_sentence += (
            f"; NVML lists {_plural(len(nvml_rows), 'GPU')} for this process, so indices may not line up"
        )

    sources = {"torch.cuda": torch_sentence, "nvml": nvml_sentence, "gputil": gputil_sentence}
    if visible is not None:
        sources["CUDA_VISIBLE_DEVICES"] = _visible_devices_sentence(visible, parsed, notes)
    if host_problem:
        sources["host"] = host_problem

    try:
        gpus = _merge({"torch.cuda": torch_answer.rows, "nvml": nvml_rows, "gputil": gputil_rows})
    except Exception as exc:  # pragma: no cover - defensive
        gpus = []
        sources["merge"] = f"merge: failed ({_err(exc)})"

    return NodeInfo(
        hostname=hostname,
        os=os_name,
        python_version=python_version,
        torch_version=torch_answer.torch_version,
        cpu_model=cpu_model,
        cpu_cores_logical=logical,
        cpu_cores_physical=physical,
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_available,
        gpus=gpus,
        cuda_available=torch_answer.cuda_available,
        cuda_runtime=torch_answer.cuda_runtime,
        sources=sources,
    )


def _nccl_available() -> bool:
    """Whether this torch build has torch.distributed with NCCL."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_nccl_available())
    except Exception:
        return False


def recommended_backend(info: NodeInfo | None = None) -> str:
    """``"nccl"`` when torch can use CUDA and has NCCL, else ``"gloo"``.

    With ``info`` its ``cuda_available`` is used; otherwise CUDA is checked without
    poisoning fork (see :func:`describe_node`), i.e. ``torch.cuda.device_count() > 0``
    unless CUDA is already initialised, in which case ``torch.cuda.is_available()`` is used.
    """
    try:
        cuda = info.cuda_available if info is not None else _cuda_usable(allow_cuda_init=False)
    except Exception:
        cuda = False
    return "nccl" if cuda and _nccl_available() else "gloo"


def recommended_device(info: NodeInfo | None = None) -> torch.device:
    """``torch.device("cuda")`` when torch can use CUDA, else ``torch.device("cpu")``.

    The check is the same fork-safe one as in :func:`recommended_backend`.
    """
    import torch

    try:
        cuda = info.cuda_available if info is not None else _cuda_usable(allow_cuda_init=False)
    except Exception:
        cuda = False
    return torch.device("cuda" if cuda else "cpu")


def _gib(value: int | None) -> str:
    """Bytes as GiB with one decimal, ``"?"`` when unknown."""
    return "?" if value is None else f"{value / _GIB:.1f}"


def _no_gpu_reason(info: NodeInfo) -> str:
    """Why ``info`` lists no GPU, from its own fields only."""
    if "CUDA_VISIBLE_DEVICES" in info.sources and "hides every GPU" in info.sources["CUDA_VISIBLE_DEVICES"]:
        return "CUDA_VISIBLE_DEVICES hides every GPU"
    reason = "neither torch.cuda, NVML nor GPUtil reported an NVIDIA GPU"
    if not info.cuda_runtime:
        reason += f" (and torch {info.torch_version} is built without CUDA)"
    return reason + "; see Sources below"


def _cuda_line(info: NodeInfo) -> str:
    """The CUDA line of the header."""
    if info.cuda_available:
        return f"available (CUDA runtime {info.cuda_runtime})" if info.cuda_runtime else "available"
    if not info.cuda_runtime:
        return "not available (this torch build has no CUDA)"
    return f"not available (CUDA {info.cuda_runtime} build, but no usable GPU)"


def _gpu_table(gpus: list[GPUInfo]) -> list[str]:
    """Aligned GPU table lines (header, rule, one line per GPU)."""
    header = ["#", "Name", "Memory used / total", "Util", "Source"]
    right = [True, False, True, True, False]
    body = [
        [
            str(gpu.index),
            gpu.name,
            f"{_gib(gpu.memory_used_bytes)} / {_gib(gpu.memory_total_bytes)} GiB",
            "n/a" if gpu.utilization_percent is None else f"{gpu.utilization_percent:.0f}%",
            gpu.source or "?",
        ]
        for gpu in gpus
    ]
    widths = [max(len(row[col]) for row in [header, *body]) for col in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [
            cell.rjust(width) if is_right else cell.ljust(width)
            for cell, width, is_right in zip(cells, widths, right, strict=True)
        ]
        return ("  " + " | ".join(padded)).rstrip()

    rule = "  " + "-+-".join("-" * width for width in widths)
    return [line(header), rule, *(line(row) for row in body)]


def format_node_table(info: NodeInfo) -> str:
    """Plain-text (monospace) report of ``info``: header block, GPU table, sources.

    The output depends only on ``info``, so it is the same every time for the same data.
    """
    logical = "?" if info.cpu_cores_logical is None else str(info.cpu_cores_logical)
    physical = "?" if info.cpu_cores_physical is None else str(info.cpu_cores_physical)
    header = [
        ("Host", info.hostname),
        ("OS", info.os),
        ("Python", info.python_version),
        ("torch", info.torch_version),
        ("CUDA", _cuda_line(info)),
        ("CPU", info.cpu_model),
        ("Cores", f"{logical} logical / {physical} physical"),
        ("RAM", f"{_gib(info.ram_total_bytes)} GiB total / {_gib(info.ram_available_bytes)} GiB available"),
    ]
    width = max(len(label) for label, _ in header)
    lines = [f"{label.ljust(width)} : {value}" for label, value in header]
    lines.append("")
    if info.gpus:
        lines.append(f"GPUs ({info.gpu_count}):")
        lines += _gpu_table(info.gpus)
    else:
        lines.append(f"No GPU visible: {_no_gpu_reason(info)}")
    if info.sources:
        lines += ["", "Sources:"]
        lines += [f"  - {sentence}" for sentence in info.sources.values()]
    return "\n".join(lines)


def hardware_label(info: NodeInfo | None = None) -> str:
    """Short label for measured numbers: ``"4× NVIDIA A100-SXM4-40GB"`` or ``"CPU: <model>, 8 cores"``.

    GPUs are named when torch can use them (``info.cuda_available``); different models are
    joined with ``" + "`` in index order of first appearance. Otherwise the CPU is named, with
    its logical core count, and GPUs torch cannot use are mentioned in parentheses.
    Calls :func:`describe_node` when ``info`` is None.
    """
    if info is None:
        info = describe_node()
    groups: dict[str, int] = {}
    for gpu in info.gpus:
        groups[gpu.name] = groups.get(gpu.name, 0) + 1
    gpu_text = " + ".join(f"{count}× {name}" for name, count in groups.items())
    if info.gpus and info.cuda_available:
        return gpu_text
    cores = "?" if info.cpu_cores_logical is None else str(info.cpu_cores_logical)
    label = f"CPU: {info.cpu_model}, {cores} cores"
    if info.gpus:
        label += f" ({gpu_text} present but not usable by torch)"
    return label
