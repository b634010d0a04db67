"""Fakes for the hardware tests: torch.cuda, NVML (pynvml) and GPUtil made to report chosen devices,
and hand-made NodeInfos, so that the tests give the same result on any machine."""

from __future__ import annotations

import sys
import types
from typing import Any

import pynvml
import pytest
import torch
import torch.distributed

from mgpu_helpers.hardware import GPUInfo, NodeInfo

GIB = 1024**3
MIB = 1024**2


def _real_nvml_gpu_count() -> int:
    """GPU count according to NVML, 0 when NVML is unusable (independent of the module under test)."""
    try:
        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        pynvml.nvmlShutdown()


REAL_GPUS = _real_nvml_gpu_count()


class Calls:
    """Records which faked functions were called."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def count(self, name: str) -> int:
        return self.names.count(name)


def torch_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch look like a CPU-only build (whatever the real build is)."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)


def torch_with_cuda(
    monkeypatch: pytest.MonkeyPatch,
    calls: Calls,
    count: int,
    names: list[str] | None = None,
    total: int = 80 * GIB,
    free: int = 70 * GIB,
    initialised: bool = False,
) -> None:
    """Make torch look like a CUDA build seeing ``count`` devices; record context-creating calls."""
    names = names or [f"Torch GPU {i}" for i in range(count)]

    def is_available() -> bool:
        calls.names.append("is_available")
        return count > 0

    def get_device_properties(i: int) -> Any:
        calls.names.append("get_device_properties")
        return types.SimpleNamespace(name=names[i], total_memory=total)

    def get_device_name(i: int | None = None) -> str:
        calls.names.append("get_device_name")
        return names[i or 0]

    def mem_get_info(i: int | None = None) -> tuple[int, int]:
        calls.names.append("mem_get_info")
        return free, total

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised)
    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)


def fake_nvml(monkeypatch: pytest.MonkeyPatch, calls: Calls, devices: list[dict[str, Any]]) -> None:
    """Patch the real pynvml module so that it reports ``devices``.

    Each device: name (str or bytes), total, used (bytes), util (percent, or None for
    NotSupported), uuid.
    """

    def init() -> None:
        calls.names.append("nvmlInit")

    def shutdown() -> None:
        calls.names.append("nvmlShutdown")

    def util(handle: int) -> Any:
        value = devices[handle].get("util")
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=value, memory=0)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    monkeypatch.setattr(pynvml, "nvmlShutdown", shutdown)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "550.54.15")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(devices))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: devices[h]["name"])
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda h: types.SimpleNamespace(
            total=devices[h]["total"], used=devices[h]["used"], free=devices[h]["total"] - devices[h]["used"]
        ),
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", util)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: devices[h]["uuid"])


def nvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML as on a machine without the NVIDIA driver."""

    def init() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", init)


def fake_gputil(
    monkeypatch: pytest.MonkeyPatch, gpus: list[Any] | None = None, exc: Exception | None = None
) -> None:
    """Replace the GPUtil module by one whose getGPUs returns ``gpus`` or raises ``exc``."""
    module = types.ModuleType("GPUtil")

    def get_gpus() -> list[Any]:
        if exc is not None:
            raise exc
        return list(gpus or [])

    module.getGPUs = get_gpus  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "GPUtil", module)


def gputil_gpu(i: int, name: str, total_mib: float, used_mib: float, load: float) -> Any:
    """A GPUtil.GPU look-alike (memory in MiB, load 0..1)."""
    return types.SimpleNamespace(
        id=i, name=name, memoryTotal=total_mib, memoryUsed=used_mib, load=load, uuid=f"GPU-gputil-{i}"
    )


TWO_DEVICES = [
    {
        "name": "NVIDIA A100-SXM4-40GB",
        "total": 40 * GIB,
        "used": 1 * GIB,
        "util": 37,
        "uuid": "GPU-aaaa-0000",
    },
    {
        "name": b"NVIDIA A100-SXM4-80GB",
        "total": 80 * GIB,
        "used": 2 * GIB,
        "util": 5,
        "uuid": "GPU-bbbb-1111",
    },
]


THREE_DEVICES = [
    {"name": f"GPU model {i}", "total": (i + 1) * GIB, "used": 0, "util": i, "uuid": f"GPU-{i}{i}{i}-uuid"}
    for i in range(3)
]


def nccl_built(monkeypatch: pytest.MonkeyPatch, available: bool = True) -> None:
    """Make torch.distributed look like a build with (or without) NCCL."""
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: available)


def make_info(gpus: list[GPUInfo], cuda_available: bool = True, **sources: str) -> NodeInfo:
    return NodeInfo(
        hostname="node-17",
        os="Linux-6.1-x86_64",
        python_version="3.11.7",
        torch_version="2.5.1+cu124",
        cpu_model="AMD EPYC 7B13",
        cpu_cores_logical=2,
        cpu_cores_physical=1,
        ram_total_bytes=12 * GIB,
        ram_available_bytes=10 * GIB + GIB // 2,
        gpus=gpus,
        cuda_available=cuda_available,
        cuda_runtime="12.4",
        sources=dict(sources) or {"nvml": "nvml: 2 GPUs", "gputil": "gputil: nvidia-smi not found on PATH"},
    )
