"""Used by notebooks 05a (number-format drawings, the check for native bf16 instructions on the CPU) and
05b (a snapshot of the parameter/gradient/optimizer bytes a process really holds, sharded FSDP tensors
included), and by ``benchmarks/amp.py`` (interleaved step timing) and notebook 05b's graders.

The concepts themselves (loss scaling, autocast, master weights, ZeRO, checkpointing) stay in the
notebook; this module only draws, counts and times.

:func:`local_state_bytes` is a *measurement*, not an estimate: it adds up the storages that exist right
now, each once, with no tracker running (e.g. inside each rank after a step). FSDP2's parameters,
gradients and optimizer states are ``DTensor`` wrappers whose own ``untyped_storage()`` reports the
*global* size; what a rank really holds is its local shard (``DTensor.to_local()``), padded by FSDP so
that every rank's shard has the same length, and that is what is counted (as
:class:`~mgpu_helpers.memory.MemoryTracker` does). Formulas live in one place only:
:mod:`mgpu_helpers.memory.estimate` (``estimate_training_memory``, ``predict_memory``).
"""

from __future__ import annotations

import math
import numbers
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "FORMATS",
    "FloatFormat",
    "bit_string",
    "compare_step_times",
    "cpu_has_native_bf16",
    "draw_number_formats",
    "local_state_bytes",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exponent_bits``, ``mantissa_bits`` (stored)."""

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int

    @property
    def bits(self) -> int:
        """Total width: sign + exponent + mantissa."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def max(self) -> float:
        """Largest finite value."""
        return float(torch.finfo(self.dtype).max)

    @property
    def smallest_normal(self) -> float:
        """Smallest positive normal value (full precision down to here)."""
        return float(torch.finfo(self.dtype).smallest_normal)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value at all (subnormal, one significant bit); half of it rounds to 0."""
        return self.smallest_normal * 2.0**-self.mantissa_bits

    @property
    def eps(self) -> float:
        """Gap between 1 and the next value: relative precision, 2^-mantissa_bits."""
        return float(torch.finfo(self.dtype).eps)


#: The three formats of mixed-precision training, by short name.
FORMATS: dict[str, FloatFormat] = {
    "fp32": FloatFormat("fp32", torch.float32, 8, 23),
    "fp16": FloatFormat("fp16", torch.float16, 5, 10),
    "bf16": FloatFormat("bf16", torch.bfloat16, 8, 7),
}

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number such as 3.14, not {value!r}")
    return float(value)


def bit_string(value: float, dtype: torch.dtype) -> str:
    """The bits of ``value`` rounded to ``dtype``, as ``"sign exponent mantissa"``.

    >>> bit_string(1.0, torch.bfloat16)
    '0 01111111 0000000'
    """
    _check_number("value", value)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"dtype must be a torch.dtype such as torch.bfloat16 (or FORMATS['bf16'].dtype), not {dtype!r}"
        )
    fmt = next((f for f in FORMATS.values() if f.dtype == dtype), None)
    if fmt is None:
        raise ValueError(f"dtype must be one of {[str(f.dtype) for f in FORMATS.values()]}, not {dtype}")
    raw = int(torch.tensor([value], dtype=torch.float32).to(dtype).view(_INT_VIEW[dtype]).item())
    bits = format(raw & ((1 << fmt.bits) - 1), f"0{fmt.bits}b")
    e = 1 + fmt.exponent_bits
    return f"{bits[0]} {bits[1:e]} {bits[e:]}"


def draw_number_formats(
    value: float = math.pi, marks: Mapping[str, float] | None = None, axes: Any = None
) -> Any:
    """Draw fp32, fp16 and bf16: their bit layouts (holding ``value``) and their range vs precision.

    Left: one row of boxes per format, coloured by field (sign, exponent, mantissa), each box showing
    the bit that stores ``value``. Right: on a log scale, the span each format covers from its smallest
    subnormal to its largest value (normal range solid, subnormal range hatched), labelled with its
    relative precision; ``marks`` (label -> positive value) adds dashed lines, e.g. a typical gradient.
    ``axes``: two matplotlib axes to draw on (default: a new figure). Returns the figure.
    """
    _check_number("value", value)
    if marks is not None and not isinstance(marks, Mapping):
        raise TypeError(
            f"marks must map a label to a positive value, e.g. {{'gradient': 1e-6}}, not {marks!r}"
        )
    for label, mark in (marks or {}).items():
        if _check_number(f"marks[{label!r}]", mark) <= 0 or not math.isfinite(mark):
            raise ValueError(f"marks must be positive finite values (log scale), got {label}={mark}")
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes

    if axes is not None and (
        not hasattr(axes, "__len__") or len(axes) != 2 or not all(isinstance(a, Axes) for a in axes)
    ):
        raise TypeError(f"axes must be two matplotlib axes (plt.subplots(1, 2)[1]) or None, not {axes!r}")

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(12, 2.8), gridspec_kw={"width_ratios": [1.5, 1]})
    else:
        fig = axes[0].figure
    left, right = axes
    colours = {"sign": "#C44E52", "exponent": "#4C72B0", "mantissa": "#55A868"}
    names = list(FORMATS)
    for row, name in enumerate(names):
        fmt = FORMATS[name]
        y = len(names) - 1 - row
        sign, exponent, mantissa = bit_string(value, fmt.dtype).split()
        fields = [("sign", sign), ("exponent", exponent), ("mantissa", mantissa)]
        x = 0
        for field, bits in fields:
            for bit in bits:
                left.add_patch(
                    plt.Rectangle((x, y), 1, 0.8, facecolor=colours[field], edgecolor="white", alpha=0.85)
                )
                left.text(x + 0.5, y + 0.4, bit, ha="center", va="center", fontsize=7, color="white")
                x += 1
        stored = float(torch.tensor([value]).to(fmt.dtype).float().item())
        left.text(-0.5, y + 0.4, f"{name} ({fmt.bits} bits)", ha="right", va="center", fontsize=9)
        left.text(x + 0.5, y + 0.4, f"= {stored:.8g}", ha="left", va="center", fontsize=8)
    for field, colour in colours.items():
        left.bar(0, 0, color=colour, label=field)
    left.set_xlim(-9, 41)
    left.set_ylim(-0.3, len(names))
    left.axis("off")
    left.legend(loc="upper center", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(0.55, 1.12))
    left.set_title(f"bit layouts, each holding {value:.6g}", fontsize=10, pad=18)

    for row, name in enumerate(names):
        fmt = FORMATS[name]
        y = len(names) - 1 - row
        lo, mid, hi = map(math.log10, (fmt.smallest_subnormal, fmt.smallest_normal, fmt.max))
        right.barh(y, hi - mid, left=mid, color="#4C72B0", alpha=0.85)
        right.barh(y, mid - lo, left=lo, color="#4C72B0", alpha=0.3, hatch="//")
        right.text(hi + 1, y, f"step ≈ {fmt.eps:.1e} × value", va="center", fontsize=8)
    for label, mark in (marks or {}).items():
        right.axvline(math.log10(mark), color="#C44E52", ls="--", lw=1)
        x, below_one = math.log10(mark), mark < 1
        right.text(
            x - 1 if below_one else x + 1,
            len(names) - 0.45,
            label,
            color="#C44E52",
            fontsize=8,
            ha="right" if below_one else "left",
        )
    right.set_yticks(range(len(names)), list(reversed(names)))
    right.axvline(0, color="grey", lw=0.5)
    right.set_xlim(-48, 62)
    right.set_ylim(-0.6, len(names) - 0.1)
    right.set_xlabel("log10 |value|  (hatched: subnormal, losing precision)")
    right.set_title("range (bar) and precision (label)", fontsize=10)
    fig.tight_layout()
    return fig


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns memory in this process: a DTensor's local shard, else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _storage_bytes(tensors: Iterable[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        storage = _local(t).untyped_storage()
        if storage.nbytes() and storage.data_ptr():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def local_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """Bytes this process holds for the model's parameters, their gradients and the optimizer state.

    Counts real storages, each once (tied weights, views and flat buffers are not double-counted); a
    ``DTensor`` (FSDP2) counts as its local shard's storage, padding included. Keyed like the tracker's
    categories (without ``other``). A snapshot, not a timeline: call it where you want to know.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (e.g. MLP()), not {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer must be a torch.optim.Optimizer such as torch.optim.Adam(model.parameters()) or None, "
            f"not {type(optimizer).__name__}"
        )
    params = list(model.parameters())
    state: list[Any] = []
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state.extend(per_param.values())
    return {
        "parameters": _storage_bytes(params),
        "gradients": _storage_bytes(p.grad for p in params),
        "optimizer": _storage_bytes(state),
    }


def compare_step_times(
    steps: Mapping[str, Callable[[], Any]], *, repeats: int = 3, warmup: int = 1
) -> dict[str, float]:
    """Median seconds per call of each function, timed side by side.

    Calls run in rounds (``a, b, c, a, b, c, …``) so that a change in machine load hits every variant
    alike; the first ``warmup`` rounds are not timed. CUDA work is synchronised before each clock read.
    """
    if not isinstance(steps, Mapping):
        raise TypeError(
            f"steps must map a name to a function, e.g. {{'fp32': step}}, not {type(steps).__name__}"
        )
    if not steps:
        raise ValueError("steps is empty: pass a name -> function mapping, e.g. {'fp32': step}")
    for name, fn in steps.items():
        if not callable(fn):
            raise TypeError(
                f"steps[{name!r}] must be a function taking no arguments, not {type(fn).__name__}"
            )
    for name, value, minimum in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be a whole number >= {minimum}, not {value!r}")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum} rounds, not {value}")
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(warmup + repeats):
        for name, fn in steps.items():
            if sync:
                sync()
            start = time.perf_counter()
            fn()
            if sync:
                sync()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def cpu_has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU has bf16 arithmetic instructions (AVX512_BF16 or AMX-BF16); None if unknown.

    Without them PyTorch still runs bf16 on the CPU, but converts to fp32 and back around each
    operation, so bf16 autocast saves memory without being faster. Reads Linux's ``/proc/cpuinfo``.
    """
    if not isinstance(cpuinfo_path, str | os.PathLike):
        raise TypeError(f"cpuinfo_path must be a file path such as '/proc/cpuinfo', not {cpuinfo_path!r}")
    try:
        with open(cpuinfo_path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})
