"""Tests for mgpu_helpers.hardware.peaks: the datasheet peak FLOP/s looked up by GPU name and format,
and the reasons given when there is none. Machines are hand-made NodeInfos or faked NVML/torch.cuda
(``_hardware_fakes.py``), so the results are the same on any machine."""

from __future__ import annotations

import pytest
import torch
from _hardware_fakes import TWO_DEVICES, Calls, fake_gputil, fake_nvml, make_info, torch_with_cuda

from mgpu_helpers.hardware import GPUInfo, Peak, peak_flops, peak_for_name
from mgpu_helpers.hardware.peaks import PEAKS, format_key

T = 1e12


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, False, 989.4),  # SXM: 1979 with sparsity, halved
        ("NVIDIA H100 80GB HBM3", torch.float32, False, 67.0),
        ("NVIDIA H100 80GB HBM3", torch.float32, True, 494.7),
        ("NVIDIA H100 PCIe", torch.float16, False, 756.0),
        ("NVIDIA H200", torch.bfloat16, False, 989.4),
        ("NVIDIA B200", torch.bfloat16, False, 2250.0),  # HGX B200: 4.5 PFLOPS with sparsity, halved
        ("NVIDIA A100-SXM4-40GB", torch.bfloat16, False, 312.0),
        ("NVIDIA A100 80GB PCIe", torch.float32, True, 156.0),
        ("NVIDIA L4", torch.bfloat16, False, 121.0),
        ("Tesla T4", torch.float16, False, 65.0),
        ("Tesla V100-SXM2-16GB", torch.float16, False, 125.0),
        ("Tesla V100-PCIE-32GB", torch.float16, False, 112.0),
        ("Tesla V100S-PCIE-32GB", torch.float16, False, 130.0),
        ("Tesla P100-PCIE-16GB", torch.float32, False, 9.3),
    ],
)
def test_known_gpus_give_their_dense_datasheet_peak(name, dtype, tf32, tflops):
    peak = peak_for_name(name, dtype, tf32=tf32)
    assert peak.flops == pytest.approx(tflops * T)
    assert peak.source.startswith("https://") and "dense" in peak.why
    assert f"{tflops:,.1f} TFLOP/s" in str(peak)


def test_every_entry_has_a_source_and_the_four_formats():
    for entry in PEAKS:
        assert entry.source.startswith("https://"), entry.model
        assert set(entry.tflops) == {"fp32", "tf32", "bf16", "fp16"}, entry.model
        fast = [v for v in entry.tflops.values() if v is not None]
        assert fast and all(0 < v < 5000 for v in fast), entry.model


def test_the_rooflines_gpus_have_memory_links_and_fp8_where_they_have_it():
    """Notebook 05h's table: every GPU it shows has its memory and link; FP8 only from Ada on."""
    shown = {e.model: e for e in PEAKS if e.model in ("T4", "L4", "A100", "H100 SXM", "H200 SXM", "B200")}
    assert len(shown) == 6
    for e in shown.values():
        assert e.memory_gb and e.memory_tbps and e.link_gbs and f"{e.link_gbs:,.0f} GB/s" in e.link
    assert {m for m, e in shown.items() if e.fp8 is None} == {"T4", "A100"}
    for m in ("L4", "H100 SXM", "H200 SXM", "B200"):  # FP8 tensor cores: twice the 16-bit dense peak
        assert shown[m].fp8 == pytest.approx(2 * shown[m].tflops["bf16"], rel=0.01)
    assert (
        peak_for_name("NVIDIA GB200", torch.bfloat16).flops is None
    )  # another power budget: not the HGX B200


@pytest.mark.parametrize("name", ["Tesla T4", "Tesla V100-SXM2-32GB", "Tesla P100-PCIE-16GB"])
def test_pre_ampere_gpus_have_no_bf16_or_tf32_peak(name):
    bf16 = peak_for_name(name, torch.bfloat16)
    assert bf16.flops is None and "emulated" in bf16.why and "fp16" in bf16.why
    tf32 = peak_for_name(name, torch.float32, tf32=True)
    assert tf32.flops is None and "TF32" in tf32.why
    assert str(bf16).startswith("no peak: ")


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA GeForce RTX 4090", "NVIDIA H100 NVL", "GPU model 0"])
def test_unknown_gpus_get_no_peak_and_the_known_names(name):
    peak = peak_for_name(name, torch.bfloat16)
    assert peak.flops is None
    assert repr(name) in peak.why and "H100 SXM" in peak.why and "T4" in peak.why and "peaks.py" in peak.why


def test_l4_is_not_matched_inside_other_names():
    assert peak_for_name("NVIDIA L40", torch.float16).flops is None


def test_cpu_and_gloo_get_no_peak_with_the_reason():
    for device in ("cpu", torch.device("cpu"), "gloo"):
        peak = peak_flops(torch.bfloat16, device)
        assert peak.flops is None and "CPU" in peak.why and "achieved FLOP/s" in peak.why


def test_peak_flops_reads_the_gpu_name_from_the_node():
    info = make_info([GPUInfo(0, "Tesla T4"), GPUInfo(1, "NVIDIA A100-SXM4-80GB")])
    assert peak_flops(torch.float16, "cuda:0", info).flops == 65 * T
    assert peak_flops(torch.bfloat16, torch.device("cuda", 1), info).flops == 312 * T
    assert peak_flops(torch.bfloat16, "nccl", info).flops is None  # nccl: cuda:0, a T4
    assert peak_flops(torch.float32, "cuda:1", info, tf32=True).flops == 156 * T
    missing = peak_flops(torch.bfloat16, "cuda:2", info)
    assert missing.flops is None and "cuda:2" in missing.why


def test_tf32_follows_the_matmul_precision_when_not_given(monkeypatch):
    info = make_info([GPUInfo(0, "NVIDIA A100-SXM4-40GB")])
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert peak_flops(torch.float32, "cuda", info).flops == 156 * T
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert peak_flops(torch.float32, "cuda", info).flops == 19.5 * T


def test_peak_flops_names_gpus_through_nvml_without_a_cuda_context(monkeypatch):
    calls = Calls()
    torch_with_cuda(monkeypatch, calls, count=2, names=["Torch GPU 0", "Torch GPU 1"])
    fake_nvml(monkeypatch, calls, TWO_DEVICES)  # two A100s
    fake_gputil(monkeypatch, exc=RuntimeError("no nvidia-smi"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    peak = peak_flops(torch.bfloat16, "cuda:1")
    assert peak.flops == 312 * T
    assert calls.count("get_device_properties") == 0 and calls.count("mem_get_info") == 0


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="formats matmuls run in"):
        format_key(torch.int8)
    with pytest.raises(ValueError, match="formats matmuls run in"):
        peak_flops(torch.float64, "cpu")
    with pytest.raises(ValueError, match="device must be"):
        peak_flops(torch.bfloat16, "tpu")
    with pytest.raises(TypeError, match="GPU name"):
        peak_for_name(None, torch.bfloat16)  # type: ignore[arg-type]
    assert isinstance(peak_for_name("Tesla T4", torch.float16), Peak)
