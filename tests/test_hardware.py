"""Tests for mgpu_helpers.hardware: the real machine, CUDA_VISIBLE_DEVICES, choose_backend,
recommended_device, the node table, hardware labels and bad inputs.

Most tests fake torch.cuda, NVML and GPUtil (``_hardware_fakes.py``) so that they give the same result
on any machine; the tests that look at the real machine derive what they expect from it (NVML's GPU
count, torch's answers), so they hold with 0, 1 or N GPUs. The per-source fallbacks are tested in
``test_hardware_sources.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from _hardware_fakes import (
    GIB,
    REAL_GPUS,
    THREE_DEVICES,
    TWO_DEVICES,
    Calls,
    fake_gputil,
    fake_nvml,
    gputil_gpu,
    make_info,
    nccl_built,
    torch_with_cuda,
    torch_without_cuda,
)

import mgpu_helpers.hardware.visible as hw_visible
from mgpu_helpers.hardware import (
    BACKENDS,
    GPUInfo,
    choose_backend,
    describe_node,
    format_node_table,
    hardware_label,
    recommended_device,
)

# Fixtures `calls` and `no_visible_devices_env` come from tests/conftest.py.
pytestmark = pytest.mark.usefixtures("no_visible_devices_env")


# --------------------------------------------------------------------------------------
# the real machine
# --------------------------------------------------------------------------------------


def test_import_is_cheap() -> None:
    """Importing mgpu_helpers.hardware must not import torch, GPUtil, pynvml or psutil."""
    code = textwrap.dedent(
        """
        import sys
        import mgpu_helpers.hardware
        print(sorted(m for m in ("torch", "GPUtil", "pynvml", "psutil") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_describe_node_on_this_machine() -> None:
    """Whatever this machine has: the report is consistent with NVML, torch and itself."""
    info = describe_node()
    assert info.gpu_count >= REAL_GPUS  # NVML's GPUs are all listed (torch may add unnamed ones)
    assert info.is_multi_gpu == (info.gpu_count > 1)
    assert info.hostname
    assert info.cpu_model
    assert info.cpu_cores_logical is not None and info.cpu_cores_logical >= 1
    assert info.ram_total_bytes is not None and info.ram_total_bytes > info.ram_available_bytes > 0
    assert info.torch_version == torch.__version__
    assert info.cuda_runtime == torch.version.cuda
    assert {"torch.cuda", "nvml", "gputil"} <= set(info.sources)
    assert info.sources["torch.cuda"].startswith("torch.cuda: ")
    assert info.sources["nvml"].startswith("nvml: ")
    assert info.sources["gputil"].startswith("gputil: ")
    if REAL_GPUS == 0:
        assert "NVMLError" in info.sources["nvml"] or "import pynvml failed" in info.sources["nvml"]

    table = format_node_table(info)
    assert info.hostname in table
    assert info.sources["nvml"] in table
    assert ("No GPU visible: " in table) == (info.gpu_count == 0)
    assert (f"GPUs ({info.gpu_count}):" in table) == (info.gpu_count > 0)

    assert choose_backend(1, info) in BACKENDS
    assert choose_backend() in BACKENDS
    assert choose_backend(info.gpu_count + 1, info) == "gloo"  # more processes than GPUs: never NCCL
    assert recommended_device(info).type == ("cuda" if info.cuda_available else "cpu")
    usable = bool(info.gpus and info.cuda_available)
    assert hardware_label(info).startswith("CPU: ") != usable
    assert hardware_label().startswith("CPU: ") == hardware_label(info).startswith("CPU: ")


@pytest.mark.gpu
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU usable by torch")
def test_describe_node_keeps_fork_usable() -> None:
    """After describe_node(), choose_backend() and recommended_device(), a forked child can still use CUDA."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        import torch
        from mgpu_helpers.hardware import choose_backend, describe_node, recommended_device

        describe_node()
        choose_backend()
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
# CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------------------


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
    assert hw_visible._parse_visible_devices(value) == expected


# --------------------------------------------------------------------------------------
# backend and device
# --------------------------------------------------------------------------------------


def test_choose_backend_needs_a_gpu_per_process(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_with_cuda(monkeypatch, calls, count=2)
    nccl_built(monkeypatch)
    assert choose_backend() == "nccl"
    assert choose_backend(2) == "nccl"
    assert choose_backend(3) == "gloo"  # more processes than GPUs
    assert recommended_device() == torch.device("cuda")
    assert calls.names == []  # decided from device_count(), without creating a CUDA context

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert choose_backend(2) == "nccl"
    assert calls.names == ["is_available"]  # CUDA already initialised: the full check is free


def test_choose_backend_gloo_without_nccl_in_the_build(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    torch_with_cuda(monkeypatch, calls, count=4)
    nccl_built(monkeypatch, available=False)
    assert [choose_backend(n) for n in (1, 2, 4)] == ["gloo"] * 3
    assert recommended_device() == torch.device("cuda")  # the GPU is still the device to train on


@pytest.mark.parametrize("count", [0, 1])
def test_choose_backend_gloo_without_enough_gpus(
    monkeypatch: pytest.MonkeyPatch, calls: Calls, count: int
) -> None:
    torch_with_cuda(monkeypatch, calls, count=count)
    nccl_built(monkeypatch)
    assert choose_backend(count + 1) == "gloo"
    assert choose_backend(1) == ("nccl" if count else "gloo")
    assert recommended_device() == torch.device("cuda" if count else "cpu")


def test_choose_backend_gloo_on_a_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_without_cuda(monkeypatch)
    nccl_built(monkeypatch)
    assert choose_backend() == "gloo"
    assert recommended_device() == torch.device("cpu")


def test_choose_backend_counts_the_gpus_in_info(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a NodeInfo, its usable GPUs decide (the live machine is not asked)."""
    nccl_built(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # ignored when info is given
    two = [GPUInfo(0, "x"), GPUInfo(1, "x")]
    assert choose_backend(1, make_info(two)) == "nccl"
    assert choose_backend(2, info=make_info(two)) == "nccl"
    assert choose_backend(3, make_info(two)) == "gloo"
    assert choose_backend(1, make_info(two, cuda_available=False)) == "gloo"  # GPUs torch cannot use
    assert choose_backend(1, make_info([], cuda_available=True)) == "gloo"
    assert recommended_device(make_info(two)) == torch.device("cuda")
    assert recommended_device(make_info(two, cuda_available=False)) == torch.device("cpu")
    nccl_built(monkeypatch, available=False)
    assert choose_backend(1, make_info(two)) == "gloo"


# --------------------------------------------------------------------------------------
# formatting and labels on hand-made NodeInfos
# --------------------------------------------------------------------------------------


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


def test_hardware_label_names_the_device_that_did_the_work() -> None:
    """gloo processes and CPU matmuls on a GPU machine ran on the CPU: labelled so, not as the GPU."""
    h100 = GPUInfo(0, "NVIDIA H100 80GB HBM3", 80 * GIB, 0, 0.0, "nvml")
    t4s = [GPUInfo(i, "Tesla T4", 15 * GIB, 0, 0.0, "nvml") for i in range(2)]
    for device in ("cpu", "gloo", torch.device("cpu")):
        assert hardware_label(make_info([h100]), device) == "CPU: AMD EPYC 7B13, 2 cores"
    assert hardware_label(make_info([h100]), "cuda:0") == "1× NVIDIA H100 80GB HBM3"
    assert hardware_label(make_info(t4s), torch.device("cuda", 1)) == "1× Tesla T4"
    assert hardware_label(make_info(t4s), "nccl") == "2× Tesla T4"
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda'"):
        hardware_label(make_info(t4s), "tpu")


def test_node_info_properties() -> None:
    assert make_info([]).gpu_count == 0
    one = make_info([GPUInfo(0, "x")])
    assert (one.gpu_count, one.is_multi_gpu) == (1, False)
    two = make_info([GPUInfo(0, "x"), GPUInfo(1, "x")])
    assert (two.gpu_count, two.is_multi_gpu) == (2, True)


# --------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "exc", "message"),
    [
        (choose_backend, (0,), {}, ValueError, r"nprocs must be >= 1"),
        (choose_backend, (-2,), {}, ValueError, r"nprocs must be >= 1"),
        (choose_backend, ("2",), {}, TypeError, r"nprocs must be a whole number of processes such as 2"),
        (choose_backend, (2.0,), {}, TypeError, r"whole number"),
        (choose_backend, (True,), {}, TypeError, r"whole number"),
        (choose_backend, (make_info([]),), {}, TypeError, r"by keyword: choose_backend\(nprocs, info=info\)"),
        (
            choose_backend,
            (1,),
            {"info": "node"},
            TypeError,
            r"info must be a NodeInfo from describe_node\(\)",
        ),
        (recommended_device, ({"gpus": 1},), {}, TypeError, r"info must be a NodeInfo from describe_node"),
        (describe_node, ("yes",), {}, TypeError, r"allow_cuda_init must be True or False"),
        (describe_node, (), {"allow_cuda_init": 1}, TypeError, r"allow_cuda_init must be True or False"),
        (format_node_table, ("not info",), {}, TypeError, r"needs a NodeInfo from describe_node\(\).*str"),
        (format_node_table, (None,), {}, TypeError, r"format_node_table\(describe_node\(\)\)"),
        (hardware_label, (123,), {}, TypeError, r"NodeInfo from describe_node\(\) or None"),
        (GPUInfo, (-1, "x"), {}, ValueError, r"index must be the CUDA index, an int >= 0"),
        (GPUInfo, (0, None), {}, TypeError, r"name must be the GPU's model name"),
        (GPUInfo, (0, "x", -5), {}, ValueError, r"memory_total_bytes must be a byte count"),
    ],
)
def test_bad_inputs_are_refused_with_what_to_pass(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], message: str
) -> None:
    with pytest.raises(exc, match=message):
        func(*args, **kwargs)


def test_node_info_refuses_gpus_that_are_not_gpu_infos() -> None:
    with pytest.raises(TypeError, match="gpus must be a list of GPUInfo"):
        make_info([{"index": 0, "name": "x"}])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("value", "physical", "seen"),
    [
        (None, 0, 0),
        (None, 1, 1),
        (None, 4, 4),
        ("", 2, 0),
        ("-1", 2, 0),
        ("0", 0, 0),
        ("0", 1, 1),
        ("0", 2, 1),
        ("1,0", 0, 0),
        ("1,0", 1, 0),
        ("1,0", 2, 2),
        ("1,0", 8, 2),  # 1 GPU: index 1 ends the list at once
        ("0,2", 2, 1),
        ("0,0", 4, 0),
        ("3,2,1,0", 4, 4),
    ],
)
def test_visible_gpu_count_follows_cudas_rule_for_0_1_2_and_n_gpus(value, physical, seen):
    from mgpu_helpers.hardware import visible_gpu_count

    assert visible_gpu_count(value, physical) == seen


def test_visible_gpu_count_refuses_what_it_cannot_count():
    from mgpu_helpers.hardware import visible_gpu_count

    with pytest.raises(ValueError, match="UUID or MIG"):
        visible_gpu_count("GPU-1234", 2)
    with pytest.raises(ValueError, match="GPU count >= 0"):
        visible_gpu_count("0", -1)
    with pytest.raises(TypeError, match="or None when unset"):
        visible_gpu_count(0, 2)
