"""Used by every notebook (00 prints it, 01 explains it): :func:`describe_node` gathers what this machine
has into a :class:`NodeInfo` -- host, CPU, RAM, torch/CUDA and one :class:`GPUInfo` per GPU this process
can see, merged from torch.cuda, NVML and GPUtil with ``CUDA_VISIBLE_DEVICES`` applied. Fork-safe by
default (see the package docstring, "Fork safety").
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import sources as _src
from ._rows import UNKNOWN_GPU_NAME, _err, _plural, _Row
from .visible import _filter_rows, _parse_visible_devices, _visible_devices_sentence

__all__ = ["GPUInfo", "NodeInfo", "describe_node"]


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

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"index must be the CUDA index, an int >= 0 (cuda:<index>), not {self.index!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be the GPU's model name as a str, not {type(self.name).__name__}")
        for attr in ("memory_total_bytes", "memory_used_bytes"):
            value = getattr(self, attr)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{attr} must be a byte count (int >= 0) or None if unknown, not {value!r}")


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

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, list) or not all(isinstance(g, GPUInfo) for g in self.gpus):
            raise TypeError("gpus must be a list of GPUInfo (empty when there is no GPU)")
        if not isinstance(self.sources, dict):
            raise TypeError(f"sources must be a dict of sentences, not {type(self.sources).__name__}")

    @property
    def gpu_count(self) -> int:
        """Number of GPUs listed in ``gpus``."""
        return len(self.gpus)

    @property
    def is_multi_gpu(self) -> bool:
        """True when more than one GPU is listed."""
        return self.gpu_count > 1


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
        gpus.append(GPUInfo(index, name or UNKNOWN_GPU_NAME, total, mem_used, util, "+".join(used)))
    return gpus


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
    if not isinstance(allow_cuda_init, bool):
        raise TypeError(
            f"allow_cuda_init must be True or False (True lets torch create a CUDA context), "
            f"not {allow_cuda_init!r}"
        )
    host_problem: str | None = None
    try:
        logical, physical, ram_total, ram_available, host_problem = _src._host_memory_and_cores()
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
    cpu_model = safe(_src._cpu_model, "unknown CPU")

    def guarded(fn: Callable[[], tuple[list[_Row], str]], label: str) -> tuple[list[_Row], str]:
        try:
            return fn()
        except Exception as exc:  # the query functions catch everything; this is a last resort
            return [], f"{label}: unexpected failure ({_err(exc)})"

    nvml_rows, nvml_sentence = guarded(_src._query_nvml, "nvml")
    gputil_rows, gputil_sentence = guarded(_src._query_gputil, "gputil")

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    parsed = _parse_visible_devices(visible) if visible is not None else None
    notes: list[str] = []
    nvml_rows, note = _filter_rows(nvml_rows, visible, parsed, "NVML")
    notes += [note] if note else []
    gputil_rows, note = _filter_rows(gputil_rows, visible, parsed, "GPUtil")
    notes += [note] if note else []

    used_known = {row.index for row in nvml_rows if row.memory_used_bytes is not None}
    try:
        torch_answer = _src._query_torch(allow_cuda_init, used_known)
    except Exception as exc:
        sentence = f"torch.cuda: unexpected failure ({_err(exc)})"
        torch_answer = _src._TorchAnswer([], sentence, False, None, "unknown", None)

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
