"""Used by notebooks 05a (the MFU of its measured training step), 05h (rooflines: peaks, memory
bandwidths, links) and 08 (the MFU of its DDP run).

The **dense peak FLOP/s** of known NVIDIA GPUs per number format, from the vendors' datasheets, and
:func:`peak_flops`, which returns the peak of a device for a dtype, or ``None`` with the reason. For the
GPUs notebook 05h compares, an entry also has its dense FP8 peak, its memory size and bandwidth and
its GPU-to-GPU link, from the same datasheets.

Model FLOPs utilisation (MFU) divides the FLOP/s a training step achieves by this peak. The peak is a
datasheet figure, not a measurement: the boost clock, every tensor core busy, no memory traffic.

Dense, not sparse: since Hopper, NVIDIA's datasheets print tensor-core figures *with 2:4 structured
sparsity* (marked "*"); a dense matrix product gets half of that, and the table holds the dense half.
Each entry is in TFLOP/s per GPU:

* ``fp32``: plain fp32 on the CUDA cores (``torch.get_float32_matmul_precision() == "highest"``, the
  default);
* ``tf32``: fp32 matrix products on tensor cores (TF32, Ampere and later, when allowed with
  ``torch.set_float32_matmul_precision("high")``);
* ``bf16`` / ``fp16``: 16-bit tensor-core products (fp16 without tensor cores on the P100).

``None`` means the GPU has no fast path for that format (bf16 before Ampere is emulated), and
:func:`peak_flops` then says so instead of inventing a number. CPUs get no peak: nobody publishes one for
an arbitrary CPU (it depends on the model, its cores, clocks and vector units), so the notebooks print
the achieved FLOP/s there.

PyTorch keeps a similar, private table for its compiler (``torch._inductor.analysis.device_info``); it
is not a public API, and some of its Ampere/Ada entries mix sparse and dense figures, so the course keeps
its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .node import NodeInfo, describe_node
from .report import _device_kind

if TYPE_CHECKING:  # importing this package stays cheap: torch is imported where it is used
    import torch

__all__ = ["PEAKS", "Peak", "format_key", "known_names", "peak_flops", "peak_for_name"]

T = 1e12


@dataclass(frozen=True)
class _Entry:
    """One GPU model: how its names look, its dense peaks in TFLOP/s per format, and the source."""

    model: str
    pattern: str  # a regular expression searched in the upper-cased device name
    tflops: dict[str, float | None]
    source: str
    fp8: float | None = None  # dense FP8 (e4m3) tensor-core TFLOP/s; None: no FP8 tensor cores, or not listed
    memory_gb: float | None = None  # GB of GPU memory (10⁹ B)
    memory_tbps: float | None = None  # memory bandwidth, TB/s (10¹² B/s)
    link: str = ""  # GPU-to-GPU link as the datasheet names it
    link_gbs: float | None = None  # its GB/s, both directions added, as datasheets print it


#: Known GPUs, most specific pattern first. Names are as ``torch.cuda.get_device_name()`` / NVML print them.
PEAKS: tuple[_Entry, ...] = (
    # H100 whitepaper and datasheet: SXM5 67 fp32, 989* tf32, 1979* bf16/fp16 (* = with sparsity).
    # PCIe: 51 fp32, 756* tf32, 1513* bf16/fp16. The NVL variant is left out (see peak_for_name).
    _Entry(
        "H100 PCIe",
        r"H100.*PCIE",
        {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
        "https://www.nvidia.com/en-us/data-center/h100/",
    ),
    # H100 SXM: FP8 3,958*; 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s.
    _Entry(
        "H100 SXM",
        r"H100",
        {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
        "https://www.nvidia.com/en-us/data-center/h100/",
        fp8=1978.9,
        memory_gb=80,
        memory_tbps=3.35,
        link="NVLink 4, 900 GB/s",
        link_gbs=900,
    ),
    # H200 SXM: the H100 SXM's tensor cores with more, faster memory: 67, 989*, 1979*, 1979*, FP8 3,958*;
    # 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s.
    _Entry(
        "H200 SXM",
        r"H200",
        {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
        "https://www.nvidia.com/en-us/data-center/h200/",
        fp8=1978.9,
        memory_gb=141,
        memory_tbps=4.8,
        link="NVLink 4, 900 GB/s",
        link_gbs=900,
    ),
    # B200, one GPU of an HGX B200 (1,000 W): 75 fp32, 2.2 P* tf32, 4.5 P* bf16/fp16, 9 P* FP8
    # (footnote: "Specification in sparse. Dense is one-half sparse spec shown"); 180 GB HBM3E at
    # 7.7 TB/s; NVLink 5, 1.8 TB/s. (DGX B200's page rounds its bandwidth to 8 TB/s a GPU.)
    _Entry(
        "B200",
        r"\bB200\b",
        {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0},
        "https://www.nvidia.com/en-us/data-center/hgx/",
        fp8=4500.0,
        memory_gb=180,
        memory_tbps=7.7,
        link="NVLink 5, 1,800 GB/s",
        link_gbs=1800,
    ),
    # A100 (SXM4 and PCIe, 40 and 80 GB): 19.5 fp32, 156 tf32, 312 bf16/fp16, dense; no FP8. Memory and
    # link: the SXM4 80 GB model, 2,039 GB/s HBM2e, NVLink 600 GB/s.
    _Entry(
        "A100",
        r"A100",
        {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        memory_gb=80,
        memory_tbps=2.039,
        link="NVLink 3, 600 GB/s (SXM4)",
        link_gbs=600,
    ),
    # L4 (Colab): 30.3 fp32, 120* tf32, 242* bf16/fp16, 485* FP8 (Ada); 24 GB GDDR6 at 300 GB/s; no NVLink.
    _Entry(
        "L4",
        r"\bL4\b",
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
        "https://www.nvidia.com/en-us/data-center/l4/",
        fp8=242.5,
        memory_gb=24,
        memory_tbps=0.3,
        link="PCIe Gen4 x16, 64 GB/s",
        link_gbs=64,
    ),
    # T4 (Colab, Kaggle), Turing: 8.1 fp32, 65 fp16 tensor cores; no TF32, bf16 only emulated, no FP8.
    # 16 GB GDDR6: "320+ GB/s" on the product page (the datasheet PDF prints 300 GB/s); no NVLink.
    _Entry(
        "T4",
        r"\bT4\b",
        {"fp32": 8.1, "tf32": None, "bf16": None, "fp16": 65.0},
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
        "t4-tensor-core-datasheet-951643.pdf",
        memory_gb=16,
        memory_tbps=0.32,
        link="PCIe Gen3 x16, 32 GB/s",
        link_gbs=32,
    ),
    # V100, Volta: SXM2 15.7 fp32 / 125 fp16 tensor; PCIe 14 / 112; V100S PCIe 16.4 / 130.
    _Entry(
        "V100S PCIe",
        r"V100S",
        {"fp32": 16.4, "tf32": None, "bf16": None, "fp16": 130.0},
        "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    ),
    _Entry(
        "V100 SXM2",
        r"V100.*SXM",
        {"fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125.0},
        "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    ),
    _Entry(
        "V100 PCIe",
        r"V100.*PCIE",
        {"fp32": 14.0, "tf32": None, "bf16": None, "fp16": 112.0},
        "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    ),
    # P100 PCIe (Kaggle), Pascal: 9.3 fp32, 18.7 fp16 (no tensor cores).
    _Entry(
        "P100 PCIe",
        r"P100.*PCIE",
        {"fp32": 9.3, "tf32": None, "bf16": None, "fp16": 18.7},
        "https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-PCIe-datasheet.pdf",
    ),
)

_FORMATS = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
_LEFT_OUT = re.compile(r"NVL")  # H100 NVL, H200 NVL: other clocks and power; not in the table


@dataclass(frozen=True)
class Peak:
    """A device's dense peak for one format: ``flops`` in FLOP/s, or None; ``why`` says which or why not,
    ``source`` is the datasheet's address (empty without a peak)."""

    flops: float | None
    why: str
    source: str = ""

    def __str__(self) -> str:
        return f"{self.flops / T:,.1f} TFLOP/s ({self.why})" if self.flops else f"no peak: {self.why}"


def format_key(dtype: torch.dtype, tf32: bool = False) -> str:
    """The table's key for ``dtype``: ``"fp32"`` (``"tf32"`` with ``tf32=True``), ``"bf16"``, ``"fp16"``."""
    if str(dtype) not in _FORMATS:
        raise ValueError(f"dtype must be one of {list(_FORMATS)} (the formats matmuls run in), not {dtype!r}")
    return "tf32" if str(dtype) == "torch.float32" and tf32 else _FORMATS[str(dtype)]


def known_names() -> str:
    """The GPU models the table knows, for messages."""
    return ", ".join(e.model for e in PEAKS)


def peak_for_name(name: str, dtype: torch.dtype, tf32: bool = False) -> Peak:
    """The dense peak of the GPU called ``name`` (as ``torch.cuda.get_device_name()`` gives it), ``dtype``.

    ``tf32=True`` asks for fp32 matrix products on tensor cores. Returns ``Peak(None, reason)`` for a GPU
    the table does not know (the reason lists the known ones) or a format it runs without a fast path.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a GPU name such as 'NVIDIA A100-SXM4-40GB', not {name!r}")
    key = format_key(dtype, tf32)
    upper = name.upper()
    entry = None if _LEFT_OUT.search(upper) else next((e for e in PEAKS if re.search(e.pattern, upper)), None)
    if entry is None:
        return Peak(
            None,
            f"{name!r} is not in the table of datasheet peaks (known: {known_names()}); add "
            "its dense figure from the vendor's datasheet to mgpu_helpers/hardware/peaks.py",
        )
    tflops = entry.tflops[key]
    if tflops is None:
        why = "no TF32 before Ampere" if key == "tf32" else "bf16 is only emulated before Ampere: use fp16"
        return Peak(None, f"{entry.model} has no fast {key} ({why})")
    return Peak(tflops * T, f"{entry.model}, {key}, dense, datasheet", entry.source)


def peak_flops(
    dtype: torch.dtype, device: object = "cuda:0", info: NodeInfo | None = None, tf32: bool | None = None
) -> Peak:
    """The dense peak FLOP/s of ``device`` for matrix products in ``dtype``, or ``Peak(None, reason)``.

    Args:
        dtype: the format the matmuls run in: ``torch.float32``, or the autocast dtype
            (``torch.bfloat16``, ``torch.float16``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device``, or a backend (``"gloo"`` ran on
            CPUs, ``"nccl"`` on GPUs).
        info: the machine, from :func:`describe_node` (called when None; it names GPUs through NVML,
            without creating a CUDA context).
        tf32: whether fp32 matmuls may use TF32; None reads ``torch.get_float32_matmul_precision()``.
    """
    kind, index = _device_kind(device)
    format_key(dtype)  # refuse other dtypes before looking at the machine
    if kind != "cuda":
        return Peak(
            None,
            "no published peak for an arbitrary CPU (it depends on the model, its cores, "
            "clocks and vector units): compare achieved FLOP/s instead",
        )
    info = describe_node() if info is None else info
    index = 0 if index is None else index
    gpu = next((g for g in info.gpus if g.index == index), None)
    if gpu is None:
        return Peak(None, f"cuda:{index} is not visible on this machine, so its model is unknown")
    if tf32 is None:
        import torch

        tf32 = torch.get_float32_matmul_precision() != "highest"
    return peak_for_name(gpu.name, dtype, tf32)
