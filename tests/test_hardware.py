"""Tests for mgpu_helpers.hardware.

Most tests replace torch.cuda, NVML and GPUtil with fakes so that they give the same result on
a CPU-only machine and on a GPU machine. A few tests look at the real machine and are skipped
where they do not apply (CPU-only vs. GPU).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
import torch
import torch.distributed

import mgpu_helpers.hardware as hw
from mgpu_helpers.hardware import (
    GPUInfo,
    NodeInfo,
    describe_node,
    format_node_table,
    hardware_label,
    recommended_backend,
    recommended_device,
)

GIB = 1024**3
MIB = 1024**2
HARDWARE_PY = Path(hw.__file__)


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


# --------------------------------------------------------------------------------------
# fakes
# --------------------------------------------------------------------------------------


class Calls:
    """Records which faked functions were called."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def count(self, name: str) -> int:
        return self.names.count(name)


@pytest.fixture(autouse=True)
def _no_visible_devices_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set CUDA_VISIBLE_DEVICES themselves when they need it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def calls() -> Calls:
    return Calls()


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


# --------------------------------------------------------------------------------------
# the real machine
# --------------------------------------------------------------------------------------


def test_import_is_cheap() -> None:
    """Loading hardware.py must not import torch, GPUtil, pynvml or psutil."""
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("hw_under_test", {str(HARDWARE_PY)!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules["hw_under_test"] = module
        spec.loader.exec_module(module)
        print(sorted(m for m in ("torch", "GPUtil", "pynvml", "psutil") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(REAL_GPUS > 0, reason="this machine has an NVIDIA GPU")
def test_describe_node_on_machine_without_gpu() -> None:
    start = time.perf_counter()
    info = describe_node()
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0
    assert info.gpu_count == 0
    assert not info.is_multi_gpu
    assert info.cuda_available is False
    assert info.hostname
    assert info.cpu_model
    assert info.cpu_cores_logical is not None and info.cpu_cores_logical >= 1
    assert info.ram_total_bytes is not None and info.ram_total_bytes > info.ram_available_bytes > 0
    assert info.torch_version == torch.__version__
    assert {"torch.cuda", "nvml", "gputil"} <= set(info.sources)
    assert info.sources["torch.cuda"].startswith("torch.cuda: 0 devices visible")
    assert info.sources["nvml"].startswith("nvml: ")
    assert "NVMLError" in info.sources["nvml"] or "import pynvml failed" in info.sources["nvml"]
    assert info.sources["gputil"].startswith("gputil: ")
    assert "GPU" in info.sources["gputil"] or "failed" in info.sources["gputil"]

    table = format_node_table(info)
    assert info.hostname in table
    assert "No GPU visible: " in table
    assert info.sources["nvml"] in table
    assert recommended_backend() == "gloo"
    assert recommended_backend(info) == "gloo"
    assert recommended_device() == torch.device("cpu")
    assert hardware_label(info).startswith("CPU: ")
    assert hardware_label().startswith("CPU: ")


@pytest.mark.skipif(REAL_GPUS == 0, reason="NVML sees no NVIDIA GPU here")
def test_describe_node_on_gpu_machine() -> None:
    info = describe_node()
    assert info.gpu_count == REAL_GPUS
    for i, gpu in enumerate(info.gpus):
        assert gpu.index == i
        assert gpu.name and gpu.name != "unknown CUDA device"
        assert gpu.memory_total_bytes is not None and gpu.memory_total_bytes > GIB
        assert "nvml" in gpu.source
    table = format_node_table(info)
    assert all(gpu.name in table for gpu in info.gpus)
    assert "×" in hardware_label(info) or not info.cuda_available


@pytest.mark.skipif(
    not (torch.backends.cuda.is_built() and REAL_GPUS > 0), reason="needs a CUDA build of torch and a GPU"
)
def test_describe_node_keeps_fork_usable() -> None:
    """After describe_node() and the recommend_* helpers, a forked child can still use CUDA."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        import torch
        from mgpu_helpers.hardware import describe_node, recommended_backend, recommended_device

        describe_node()
        recommended_backend()
        recommended_device()
        assert not torch.cuda.is_initialized()

        def child(queue):
            try:
                torch.zeros(1, device="cuda")
                queue.put("ok")
            except Exception as exc:
                queue.put(repr(exc))

        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        print(queue.get(timeout=120))
        proc.join(30)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok"


# --------------------------------------------------------------------------------------
# fallbacks with fakes
# --------------------------------------------------------------------------------------


def test_nvml_library_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    nvml_missing(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])
    info = describe_node()
    assert info.gpu_count == 0
    assert info.sources["nvml"] == (
        "nvml: NVIDIA driver library not found (NVMLError_LibraryNotFound) "
        "— normal on a machine without an NVIDIA GPU"
    )
    assert info.sources["torch.cuda"] == (
        f"torch.cuda: 0 devices visible (this torch build has no CUDA: {torch.__version__})"
    )


def test_nvml_other_init_error(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])

    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    info = describe_node()
    assert "NVMLError_LibRmVersionMismatch" in info.sources["nvml"]
    assert "reboot" in info.sources["nvml"]


def test_pynvml_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])
    monkeypatch.setitem(sys.modules, "pynvml", None)
    info = describe_node()
    assert info.sources["nvml"].startswith("nvml: import pynvml failed (")
    assert "pip install nvidia-ml-py" in info.sources["nvml"]


def test_gputil_missing_distutils_says_install_setuptools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-import GPUtil with distutils unavailable, as on Python >= 3.12 without setuptools."""
    torch_without_cuda(monkeypatch)
    nvml_missing(monkeypatch)
    for name in [m for m in sys.modules if m == "GPUtil" or m.startswith("GPUtil.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "distutils", None)
    info = describe_node()
    sentence = info.sources["gputil"]
    assert sentence.startswith("gputil: import failed (ModuleNotFoundError")
    assert "distutils" in sentence
    assert sentence.endswith("on Python >= 3.12 install setuptools: pip install setuptools")


def test_gputil_distutils_message_from_python_312() -> None:
    exc = ModuleNotFoundError("No module named 'distutils'", name="distutils")
    assert hw._gputil_import_failure(exc) == (
        "gputil: import failed (ModuleNotFoundError: No module named 'distutils') "
        "— on Python >= 3.12 install setuptools: pip install setuptools"
    )


def test_gputil_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    nvml_missing(monkeypatch)
    monkeypatch.setitem(sys.modules, "GPUtil", None)
    info = describe_node()
    assert info.sources["gputil"].startswith("gputil: import failed (")
    assert info.sources["gputil"].endswith("pip install gputil")


def test_gputil_getgpus_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    nvml_missing(monkeypatch)
    fake_gputil(
        monkeypatch, exc=ValueError("invalid literal for int() with base 10: 'NVIDIA-SMI has failed'")
    )
    info = describe_node()
    assert info.gpu_count == 0
    assert "GPUtil.getGPUs() failed (ValueError: invalid literal" in info.sources["gputil"]


def test_gputil_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    nvml_missing(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])
    monkeypatch.setattr(hw.shutil, "which", lambda name: None)
    info = describe_node()
    assert info.sources["gputil"].startswith("gputil: nvidia-smi not found on PATH")


def test_fake_nvml_two_gpus(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    """NVML wins over GPUtil for every field; GPUtil's answer is still reported in sources."""
    torch_without_cuda(monkeypatch)
    fake_nvml(monkeypatch, calls, TWO_DEVICES)
    fake_gputil(monkeypatch, gpus=[gputil_gpu(i, f"smi {i}", 1.0, 1.0, 0.99) for i in range(2)])
    info = describe_node()
    assert info.gpu_count == 2
    assert info.is_multi_gpu
    assert info.gpus == [
        GPUInfo(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, 1 * GIB, 37.0, "nvml"),
        GPUInfo(1, "NVIDIA A100-SXM4-80GB", 80 * GIB, 2 * GIB, 5.0, "nvml"),
    ]
    assert info.sources["gputil"] == "gputil: 2 GPUs via nvidia-smi (1× smi 0, 1× smi 1)"
    assert calls.count("nvmlInit") == 1
    assert calls.count("nvmlShutdown") == 1
    assert info.sources["nvml"] == (
        "nvml: 2 GPUs (1× NVIDIA A100-SXM4-40GB, 1× NVIDIA A100-SXM4-80GB), driver 550.54.15"
    )
    # torch is a CPU build here: GPUs are listed, but torch cannot use them
    assert info.cuda_available is False
    assert recommended_backend(info) == "gloo"
    assert hardware_label(info).startswith("CPU: ")
    assert "not usable by torch" in hardware_label(info)


def test_nvml_shutdown_even_when_count_fails(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_without_cuda(monkeypatch)
    fake_nvml(monkeypatch, calls, TWO_DEVICES)
    fake_gputil(monkeypatch, gpus=[])

    def broken_count() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", broken_count)
    info = describe_node()
    assert info.gpu_count == 0
    assert info.sources["nvml"].startswith("nvml: nvmlDeviceGetCount failed (NVMLError_Unknown")
    assert calls.count("nvmlShutdown") == 1


def test_gputil_used_when_nvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    nvml_missing(monkeypatch)
    fake_gputil(
        monkeypatch,
        gpus=[
            gputil_gpu(0, "Tesla T4", 15360.0, 512.0, 0.25),
            gputil_gpu(1, "Tesla T4", 15360.0, float("nan"), 0.5),
        ],
    )
    info = describe_node()
    assert info.gpus == [
        GPUInfo(0, "Tesla T4", 15360 * MIB, 512 * MIB, 25.0, "gputil"),
        GPUInfo(1, "Tesla T4", 15360 * MIB, None, 50.0, "gputil"),
    ]
    assert info.sources["gputil"] == "gputil: 2 GPUs via nvidia-smi (2× Tesla T4)"


def test_utilisation_from_gputil_when_nvml_lacks_it(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_without_cuda(monkeypatch)
    device = dict(TWO_DEVICES[0], util=None)  # NVML says NotSupported
    fake_nvml(monkeypatch, calls, [device])
    fake_gputil(monkeypatch, gpus=[gputil_gpu(0, "A100 as nvidia-smi names it", 40000.0, 999.0, 0.61)])
    info = describe_node()
    assert info.gpus == [GPUInfo(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, 1 * GIB, 61.0, "nvml+gputil")]


def test_default_does_not_initialise_cuda(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    """CUDA build, NVML and GPUtil missing: count from device_count(), no context-creating call."""
    torch_with_cuda(monkeypatch, calls, count=2)
    nvml_missing(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])
    info = describe_node()
    assert calls.names == []
    assert [(g.index, g.name, g.source) for g in info.gpus] == [
        (0, "unknown CUDA device", "torch.cuda"),
        (1, "unknown CUDA device", "torch.cuda"),
    ]
    assert info.cuda_available is True
    assert info.cuda_runtime == "12.4"
    assert "allow_cuda_init=True" in info.sources["torch.cuda"]
    assert recommended_device(info) == torch.device("cuda")


def test_allow_cuda_init_merges_torch_and_nvml(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_with_cuda(monkeypatch, calls, count=2, names=["Torch A", "Torch B"], total=39 * GIB)
    fake_nvml(monkeypatch, calls, TWO_DEVICES)
    fake_gputil(monkeypatch, gpus=[])
    info = describe_node(allow_cuda_init=True)
    assert info.gpus == [
        GPUInfo(0, "Torch A", 39 * GIB, 1 * GIB, 37.0, "torch.cuda+nvml"),
        GPUInfo(1, "Torch B", 39 * GIB, 2 * GIB, 5.0, "torch.cuda+nvml"),
    ]
    assert calls.count("get_device_properties") == 2
    assert calls.count("mem_get_info") == 0  # NVML already gave the used memory
    assert calls.count("is_available") == 1


def test_allow_cuda_init_without_nvml_uses_mem_get_info(
    monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    torch_with_cuda(
        monkeypatch, calls, count=1, names=["NVIDIA H100 80GB HBM3"], total=80 * GIB, free=60 * GIB
    )
    nvml_missing(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])
    info = describe_node(allow_cuda_init=True)
    assert info.gpus == [GPUInfo(0, "NVIDIA H100 80GB HBM3", 80 * GIB, 20 * GIB, None, "torch.cuda")]
    assert calls.count("mem_get_info") == 1
    assert info.sources["torch.cuda"] == "torch.cuda: 1 device visible (1× NVIDIA H100 80GB HBM3; CUDA 12.4)"


def test_already_initialised_cuda_is_used_without_new_contexts(
    monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    torch_with_cuda(monkeypatch, calls, count=1, names=["NVIDIA L4"], initialised=True)
    nvml_missing(monkeypatch)
    fake_gputil(monkeypatch, gpus=[])
    info = describe_node()
    assert info.gpus[0].name == "NVIDIA L4"
    assert info.gpus[0].memory_used_bytes is None
    assert calls.count("mem_get_info") == 0


def test_describe_node_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", boom)
    monkeypatch.setattr(torch.backends.cuda, "is_built", boom)
    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    fake_gputil(monkeypatch, exc=OSError("nvidia-smi crashed"))
    monkeypatch.setattr(hw, "_cpu_model", boom)
    info = describe_node()
    assert info.gpu_count == 0
    assert info.cpu_model == "unknown CPU"
    assert info.ram_total_bytes is None
    assert info.sources["host"] == "host: psutil failed (RuntimeError: boom); RAM and physical cores unknown"
    assert info.sources["nvml"] == "nvml: nvmlInit failed (RuntimeError: boom)"
    assert "RuntimeError: boom" in info.sources["torch.cuda"]
    assert "OSError: nvidia-smi crashed" in info.sources["gputil"]
    assert "No GPU visible" in format_node_table(info)


# --------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------------------


THREE_DEVICES = [
    {"name": f"GPU model {i}", "total": (i + 1) * GIB, "used": 0, "util": i, "uuid": f"GPU-{i}{i}{i}-uuid"}
    for i in range(3)
]


def test_visible_devices_keeps_listed_gpu(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_without_cuda(monkeypatch)
    fake_nvml(monkeypatch, calls, TWO_DEVICES)
    fake_gputil(
        monkeypatch, gpus=[gputil_gpu(0, "smi 0", 1.0, 0.0, 0.0), gputil_gpu(1, "smi 1", 1.0, 0.0, 0.0)]
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    info = describe_node()
    assert [(g.index, g.name, g.memory_total_bytes) for g in info.gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 80 * GIB)
    ]
    assert info.sources["CUDA_VISIBLE_DEVICES"].startswith(
        "CUDA_VISIBLE_DEVICES='1': CUDA sees physical GPU(s) 1"
    )


def test_visible_devices_order_and_uuid(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_without_cuda(monkeypatch)
    fake_nvml(monkeypatch, calls, THREE_DEVICES)
    fake_gputil(monkeypatch, gpus=[])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert [(g.index, g.name) for g in describe_node().gpus] == [(0, "GPU model 2"), (1, "GPU model 0")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-111")
    assert [(g.index, g.name) for g in describe_node().gpus] == [(0, "GPU model 1")]


def test_visible_devices_empty_hides_all(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_without_cuda(monkeypatch)
    fake_nvml(monkeypatch, calls, THREE_DEVICES)
    fake_gputil(monkeypatch, gpus=[])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    info = describe_node()
    assert info.gpu_count == 0
    assert "No GPU visible: CUDA_VISIBLE_DEVICES hides every GPU" in format_node_table(info)


def test_visible_devices_mig_is_reported_not_filtered(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_without_cuda(monkeypatch)
    fake_nvml(monkeypatch, calls, THREE_DEVICES)
    fake_gputil(monkeypatch, gpus=[])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4e3b1b0c-1234")
    info = describe_node()
    assert info.gpu_count == 3
    assert "MIG" in info.sources["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0,1", [0, 1]),
        (" 3 , 1", [3, 1]),
        ("", []),
        ("-1", []),
        ("0,-1,2", [0]),
        ("1,1", []),
        ("GPU-ab,GPU-cd", ["GPU-ab", "GPU-cd"]),
        ("MIG-xyz", None),
    ],
)
def test_parse_visible_devices(value: str, expected: list[int] | list[str] | None) -> None:
    assert hw._parse_visible_devices(value) == expected


# --------------------------------------------------------------------------------------
# host details
# --------------------------------------------------------------------------------------


def test_cpu_model_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC  7B13 64-Core Processor\nflags\t: fpu\n")
    assert hw._cpu_model(str(cpuinfo)) == "AMD EPYC 7B13 64-Core Processor"


def test_cpu_model_fallbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")
    monkeypatch.setattr(hw.sys, "platform", "linux")
    monkeypatch.setattr(hw.platform, "processor", lambda: "Intel64 Family 6 Model 85")
    assert hw._cpu_model(str(cpuinfo)) == "Intel64 Family 6 Model 85"
    monkeypatch.setattr(hw.platform, "processor", lambda: "")
    assert hw._cpu_model(str(tmp_path / "missing")) == "unknown CPU"


# --------------------------------------------------------------------------------------
# backend and device
# --------------------------------------------------------------------------------------


def test_recommended_backend_nccl_when_cuda_and_nccl(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_with_cuda(monkeypatch, calls, count=2)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert recommended_backend() == "nccl"
    assert recommended_device() == torch.device("cuda")
    assert calls.names == []  # decided from device_count(), not is_available()

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert recommended_backend() == "nccl"
    assert calls.names == ["is_available"]  # CUDA already initialised: the full check is free

    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert recommended_backend() == "gloo"


def test_recommended_backend_gloo_without_cuda(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_with_cuda(monkeypatch, calls, count=0)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert recommended_backend() == "gloo"
    assert recommended_device() == torch.device("cpu")


def test_recommended_backend_uses_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert recommended_backend(make_info([], cuda_available=True)) == "nccl"
    assert recommended_backend(make_info([], cuda_available=False)) == "gloo"
    assert recommended_device(make_info([], cuda_available=True)) == torch.device("cuda")


# --------------------------------------------------------------------------------------
# formatting and labels on hand-made NodeInfos
# --------------------------------------------------------------------------------------


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


def test_format_node_table_two_gpus() -> None:
    info = make_info(
        [
            GPUInfo(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, GIB + GIB // 10, 37.0, "nvml"),
            GPUInfo(1, "Tesla T4", 15 * GIB, None, None, "torch.cuda+nvml"),
        ]
    )
    text = format_node_table(info)
    assert text == format_node_table(info)  # deterministic
    assert text.splitlines()[:8] == [
        "Host   : node-17",
        "OS     : Linux-6.1-x86_64",
        "Python : 3.11.7",
        "torch  : 2.5.1+cu124",
        "CUDA   : available (CUDA runtime 12.4)",
        "CPU    : AMD EPYC 7B13",
        "Cores  : 2 logical / 1 physical",
        "RAM    : 12.0 GiB total / 10.5 GiB available",
    ]
    assert "GPUs (2):" in text
    table = [line for line in text.splitlines() if "|" in line or "-+-" in line]
    assert table == [
        "  # | Name                  | Memory used / total | Util | Source",
        "  --+-----------------------+---------------------+------+----------------",
        "  0 | NVIDIA A100-SXM4-40GB |      1.1 / 40.0 GiB |  37% | nvml",
        "  1 | Tesla T4              |        ? / 15.0 GiB |  n/a | torch.cuda+nvml",
    ]
    bars = {tuple(m.start() for m in re.finditer(r"\|", line)) for line in table if "|" in line}
    assert len(bars) == 1  # every column separator at the same position
    assert text.endswith("Sources:\n  - nvml: 2 GPUs\n  - gputil: nvidia-smi not found on PATH")
    assert "No GPU visible" not in text


def test_format_node_table_without_gpu() -> None:
    info = make_info([], cuda_available=False)
    info.cuda_runtime = None
    info.torch_version = "2.13.0+cpu"
    info.cpu_cores_physical = None
    text = format_node_table(info)
    assert "Cores  : 2 logical / ? physical" in text
    assert "CUDA   : not available (this torch build has no CUDA)" in text
    assert (
        "No GPU visible: neither torch.cuda, NVML nor GPUtil reported an NVIDIA GPU "
        "(and torch 2.13.0+cpu is built without CUDA); see Sources below"
    ) in text
    assert "GPUs (" not in text


def test_hardware_label_variants() -> None:
    h100 = GPUInfo(0, "NVIDIA H100 80GB HBM3", 80 * GIB, 0, 0.0, "nvml")
    assert hardware_label(make_info([h100])) == "1× NVIDIA H100 80GB HBM3"
    a100s = [GPUInfo(i, "NVIDIA A100-SXM4-40GB", 40 * GIB, 0, 0.0, "nvml") for i in range(4)]
    assert hardware_label(make_info(a100s)) == "4× NVIDIA A100-SXM4-40GB"
    mixed = [*a100s[:2], GPUInfo(2, "Tesla T4", 15 * GIB, 0, 0.0, "nvml")]
    assert hardware_label(make_info(mixed)) == "2× NVIDIA A100-SXM4-40GB + 1× Tesla T4"
    assert hardware_label(make_info([], cuda_available=False)) == "CPU: AMD EPYC 7B13, 2 cores"
    assert hardware_label(make_info([h100], cuda_available=False)) == (
        "CPU: AMD EPYC 7B13, 2 cores (1× NVIDIA H100 80GB HBM3 present but not usable by torch)"
    )


def test_node_info_properties() -> None:
    assert make_info([]).gpu_count == 0
    one = make_info([GPUInfo(0, "x")])
    assert (one.gpu_count, one.is_multi_gpu) == (1, False)
    two = make_info([GPUInfo(0, "x"), GPUInfo(1, "x")])
    assert (two.gpu_count, two.is_multi_gpu) == (2, True)


def test_nvml_memory_is_none_without_a_driver_and_reads_fake_nvml(monkeypatch):
    from mgpu_helpers import hardware

    monkeypatch.setattr(hardware, "_query_nvml", lambda: ([], "nvml: NVIDIA driver library not found"))
    assert hardware.nvml_memory() is None
    rows = [hardware._Row(index=0, name="Fake GPU", memory_total_bytes=80 * 2**30, memory_used_bytes=2**30)]
    monkeypatch.setattr(hardware, "_query_nvml", lambda: (rows, "nvml: 1 GPU"))
    assert hardware.nvml_memory() == [{"index": 0, "name": "Fake GPU", "used": 2**30, "total": 80 * 2**30}]
