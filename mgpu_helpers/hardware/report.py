"""Used by every notebook: the hardware table notebooks 00 and 01 print (:func:`format_node_table`) and
the short hardware name every measured number carries (:func:`hardware_label`, through
:mod:`mgpu_helpers.labels`). Both read only the :class:`NodeInfo` they are given.
"""

from __future__ import annotations

from ._rows import GIB
from .node import GPUInfo, NodeInfo, describe_node

__all__ = ["format_node_table", "hardware_label"]


def _require_info(info: object, caller: str, allow_none: bool) -> None:
    """Refuse anything but a NodeInfo (or None where that means "this machine")."""
    if info is None and allow_none:
        return
    if not isinstance(info, NodeInfo):
        also = " or None (this machine)" if allow_none else ""
        raise TypeError(
            f"{caller}() needs a NodeInfo from describe_node(){also}, not {type(info).__name__}; "
            f"e.g. {caller}(describe_node())"
        )


def _gib(value: int | None) -> str:
    """Bytes as GiB with one decimal, ``"?"`` when unknown."""
    return "?" if value is None else f"{value / GIB:.1f}"


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
    _require_info(info, "format_node_table", allow_none=False)
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


def hardware_label(info: NodeInfo | None = None, device: object = None) -> str:
    """Short label for measured numbers: ``"4× NVIDIA A100-SXM4-40GB"`` or ``"CPU: <model>, 8 cores"``.

    Name the hardware that *did the work*: pass ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a
    ``torch.device``, or the backend name ``"gloo"`` / ``"nccl"``) — gloo processes and CPU matmuls on
    a GPU machine ran on the CPU, and are labelled so. Without ``device``, GPUs are named when torch can
    use them (``info.cuda_available``); different models are joined with ``" + "`` in index order of
    first appearance. Otherwise the CPU is named, with its logical core count, and GPUs torch cannot use
    are mentioned in parentheses. Calls :func:`describe_node` when ``info`` is None.
    """
    _require_info(info, "hardware_label", allow_none=True)
    kind, index = _device_kind(device)
    if info is None:
        info = describe_node()
    cores = "?" if info.cpu_cores_logical is None else str(info.cpu_cores_logical)
    cpu = f"CPU: {info.cpu_model}, {cores} cores"
    if kind == "cpu":
        return cpu
    gpus = info.gpus if index is None else [g for g in info.gpus if g.index == index]
    groups: dict[str, int] = {}
    for gpu in gpus:
        groups[gpu.name] = groups.get(gpu.name, 0) + 1
    gpu_text = " + ".join(f"{count}× {name}" for name, count in groups.items())
    if gpus and (info.cuda_available or kind == "cuda"):
        return gpu_text
    if kind == "cuda":
        return f"cuda:{index if index is not None else 0} (not described)"
    return cpu + (f" ({gpu_text} present but not usable by torch)" if gpu_text else "")


def _device_kind(device: object) -> tuple[str | None, int | None]:
    """``("cpu" | "cuda" | None, GPU index or None)`` for hardware_label's ``device``."""
    if device is None:
        return None, None
    text = str(device)
    kind, _, index = text.partition(":")
    kind = {"gloo": "cpu", "nccl": "cuda"}.get(kind, kind)
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ValueError(
            "device must be 'cpu', 'cuda', 'cuda:N', a torch.device or a backend ('gloo', 'nccl'), "
            f"not {device!r}"
        )
    return kind, int(index) if index else None
