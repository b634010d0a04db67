"""Tests for mgpu_helpers.hardware.sources and describe_node's merge, with faked torch.cuda, NVML and
GPUtil: every failure becomes a sentence in NodeInfo.sources, and nothing creates a CUDA context
unless allowed. The results are the same on any machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
import torch
from _hardware_fakes import (
    GIB,
    MIB,
    TWO_DEVICES,
    Calls,
    fake_gputil,
    fake_nvml,
    gputil_gpu,
    nvml_missing,
    torch_with_cuda,
    torch_without_cuda,
)

import mgpu_helpers.hardware.sources as hw_sources
from mgpu_helpers.hardware import (
    GPUInfo,
    choose_backend,
    describe_node,
    format_node_table,
    hardware_label,
    nvml_memory,
    recommended_device,
)
from mgpu_helpers.hardware._rows import _Row

# Fixtures `calls` and `no_visible_devices_env` come from tests/conftest.py.
pytestmark = pytest.mark.usefixtures("no_visible_devices_env")


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
    assert hw_sources._gputil_import_failure(exc) == (
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
    monkeypatch.setattr(hw_sources.shutil, "which", lambda name: None)
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
    assert choose_backend(1, info) == "gloo"
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
    monkeypatch.setattr(hw_sources, "_cpu_model", boom)
    info = describe_node()
    assert info.gpu_count == 0
    assert info.cpu_model == "unknown CPU"
    assert info.ram_total_bytes is None
    assert info.sources["host"] == "host: psutil failed (RuntimeError: boom); RAM and physical cores unknown"
    assert info.sources["nvml"] == "nvml: nvmlInit failed (RuntimeError: boom)"
    assert "RuntimeError: boom" in info.sources["torch.cuda"]
    assert "OSError: nvidia-smi crashed" in info.sources["gputil"]
    assert "No GPU visible" in format_node_table(info)


def test_nvml_memory_is_none_without_a_driver_and_reads_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw_sources, "_query_nvml", lambda: ([], "nvml: NVIDIA driver library not found"))
    assert nvml_memory() is None
    rows = [_Row(index=0, name="Fake GPU", memory_total_bytes=80 * 2**30, memory_used_bytes=2**30)]
    monkeypatch.setattr(hw_sources, "_query_nvml", lambda: (rows, "nvml: 1 GPU"))
    assert nvml_memory() == [{"index": 0, "name": "Fake GPU", "used": 2**30, "total": 80 * 2**30}]


def test_nvml_memory_reads_the_fake_driver(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    fake_nvml(monkeypatch, calls, TWO_DEVICES)
    assert nvml_memory() == [
        {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "used": 1 * GIB, "total": 40 * GIB},
        {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "used": 2 * GIB, "total": 80 * GIB},
    ]
    assert calls.count("nvmlShutdown") == 1


def test_nvml_memory_is_numbered_like_cuda_under_cuda_visible_devices(monkeypatch, calls: Calls) -> None:
    """With CUDA_VISIBLE_DEVICES=1, cuda:0 is the driver's GPU 1: its row must say index 0."""
    fake_nvml(monkeypatch, calls, TWO_DEVICES)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert nvml_memory() == [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "used": 2 * GIB, "total": 80 * GIB}
    ]


# --------------------------------------------------------------------------------------
# host details
# --------------------------------------------------------------------------------------


def test_cpu_model_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC  7B13 64-Core Processor\nflags\t: fpu\n")
    assert hw_sources._cpu_model(str(cpuinfo)) == "AMD EPYC 7B13 64-Core Processor"


def test_cpu_model_fallbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")
    monkeypatch.setattr(hw_sources.sys, "platform", "linux")
    monkeypatch.setattr(hw_sources.platform, "processor", lambda: "Intel64 Family 6 Model 85")
    assert hw_sources._cpu_model(str(cpuinfo)) == "Intel64 Family 6 Model 85"
    monkeypatch.setattr(hw_sources.platform, "processor", lambda: "")
    assert hw_sources._cpu_model(str(tmp_path / "missing")) == "unknown CPU"
