"""Predict training memory per GPU before running out of it: parameters, gradients, optimizer state,
activations — for a precision, an optimizer, a ZeRO stage and a data-parallel size.

The formulas follow Hugging Face's *Ultra-Scale Playbook* (memory chapter), with Ψ the number of
parameters and N the data-parallel size:

=====================  ==============  ===============  =====================================
setup                  weights         gradients        optimizer (+ fp32 master weights)
=====================  ==============  ===============  =====================================
fp32, Adam             4Ψ              4Ψ               8Ψ                 → 16 bytes/param
mixed precision, Adam  2Ψ (bf16)       2Ψ (bf16)        4Ψ master + 8Ψ     → 16 bytes/param
 + fp32 grad accum.    2Ψ              2Ψ + 4Ψ          12Ψ                → 20 bytes/param
=====================  ==============  ===============  =====================================

ZeRO shards across the N data-parallel ranks: stage 1 the optimizer state (and master weights),
stage 2 also the gradients, stage 3 also the weights — e.g. mixed precision ZeRO-1: 2Ψ + 2Ψ + 12Ψ/N,
ZeRO-2: 2Ψ + 14Ψ/N, ZeRO-3: 16Ψ/N. PyTorch's ``torch.autocast`` keeps fp32 weights and gradients
(it casts per operation), so for it the persistent state is the fp32 row. Activations of a
transformer without recomputation: L·s·b·h·(34 + 5·a·s/h) bytes (L layers, sequence s, batch b,
hidden h, a heads), from Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022), as quoted by the Playbook.

Every number here is *estimated*; notebook 05 checks the predictor against the memory tracker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "MemoryPrediction",
    "TransformerShape",
    "predict_memory",
    "predictor_form",
    "transformer_activation_bytes",
]

Precision = Literal["fp32", "autocast", "mixed"]
Optimizer = Literal["adam", "sgd_momentum", "sgd"]

_OPTIMIZER_BYTES = {"adam": 8, "sgd_momentum": 4, "sgd": 0}  # fp32 state bytes per parameter


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a transformer for the activation formula."""

    layers: int
    seq_len: int
    batch: int
    hidden: int
    heads: int


def transformer_activation_bytes(shape: TransformerShape) -> int:
    """Activation bytes of a transformer in 16-bit precision, no recomputation: L·s·b·h·(34 + 5·a·s/h)."""
    s = shape
    return round(s.layers * s.seq_len * s.batch * s.hidden * (34 + 5 * s.heads * s.seq_len / s.hidden))


@dataclass(frozen=True)
class MemoryPrediction:
    """Predicted bytes on one GPU, by category (the memory tracker's categories)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    n_params: int
    setup: str

    @property
    def total(self) -> int:
        """Sum of all categories, bytes."""
        return self.parameters + self.gradients + self.optimizer + self.activations

    @property
    def bytes_per_parameter(self) -> float:
        """Parameters + gradients + optimizer state per model parameter (activations excluded)."""
        return (self.parameters + self.gradients + self.optimizer) / self.n_params

    def as_dict(self) -> dict[str, int]:
        """Keyed like :data:`mgpu_helpers.memory.CATEGORIES` (activations under ``other``)."""
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "other": self.activations,
        }

    def table(self) -> str:
        """Plain-text breakdown in GB (10⁹ bytes, as the Playbook counts) and bytes."""
        rows = [
            ("weights", self.parameters),
            ("gradients", self.gradients),
            ("optimizer + master", self.optimizer),
        ]
        if self.activations:
            rows.append(("activations", self.activations))
        rows.append(("total per GPU", self.total))
        lines = [f"{self.setup} — {self.n_params:,} parameters (estimated)"]
        lines += [f"  {name:<20}{b / 1e9:>10.2f} GB  {b:>20,} B" for name, b in rows]
        return "\n".join(lines)


def predict_memory(
    n_params: int,
    *,
    precision: Precision = "mixed",
    optimizer: Optimizer = "adam",
    zero_stage: int = 0,
    dp_size: int = 1,
    fp32_grad_accumulation: bool = False,
    activations: TransformerShape | int | None = None,
) -> MemoryPrediction:
    """Predict per-GPU training memory.

    Args:
        n_params: number of model parameters (Ψ).
        precision: ``"fp32"``; ``"autocast"`` (torch.autocast: fp32 weights and gradients, 16-bit
            compute — same persistent state as fp32); ``"mixed"`` (16-bit weights and gradients plus
            fp32 master weights, as in Apex O2, DeepSpeed and Megatron).
        optimizer: ``"adam"`` (two fp32 states), ``"sgd_momentum"`` (one), ``"sgd"`` (none).
        zero_stage: 0 (plain data parallel), 1 (shard optimizer state), 2 (+ gradients), 3 (+ weights).
        dp_size: number of data-parallel ranks N that ZeRO shards over.
        fp32_grad_accumulation: keep an extra fp32 gradient buffer (mixed precision only: +4Ψ).
        activations: a :class:`TransformerShape` for the formula, or a byte count, or None (0).
    """
    if n_params <= 0:
        raise ValueError(f"n_params must be positive, got {n_params}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if precision not in ("fp32", "autocast", "mixed"):
        raise ValueError(f"precision must be 'fp32', 'autocast' or 'mixed', got {precision!r}")
    if optimizer not in _OPTIMIZER_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZER_BYTES)}, got {optimizer!r}")
    if fp32_grad_accumulation and precision != "mixed":
        raise ValueError(
            "fp32_grad_accumulation only applies to precision='mixed' (fp32 gradients already are)"
        )

    psi = n_params
    if precision == "mixed":
        weights, grads, opt = 2 * psi, 2 * psi, (4 + _OPTIMIZER_BYTES[optimizer]) * psi
        grads += 4 * psi if fp32_grad_accumulation else 0
    else:
        weights, grads, opt = 4 * psi, 4 * psi, _OPTIMIZER_BYTES[optimizer] * psi
    n = dp_size
    if zero_stage >= 1:
        opt = opt / n
    if zero_stage >= 2:
        grads = grads / n
    if zero_stage >= 3:
        weights = weights / n
    if isinstance(activations, TransformerShape):
        act = transformer_activation_bytes(activations)
    else:
        act = int(activations or 0)
    setup = f"{precision}, {optimizer}, ZeRO-{zero_stage}, N={n}" + (
        ", fp32 grad accum" if fp32_grad_accumulation else ""
    )
    return MemoryPrediction(round(weights), round(grads), round(opt), act, psi, setup)


def predictor_form(default_params_millions: float = 7000.0) -> Any:
    """An ipywidgets form (core widgets only; works on ipywidgets 7.7 and 8) around :func:`predict_memory`.

    Returns the form (display it); changing any field recomputes the table below it.
    """
    import ipywidgets as w

    params = w.FloatText(value=default_params_millions, description="params (M)")
    precision = w.Dropdown(options=["mixed", "autocast", "fp32"], value="mixed", description="precision")
    optimizer = w.Dropdown(options=["adam", "sgd_momentum", "sgd"], value="adam", description="optimizer")
    zero = w.Dropdown(options=[0, 1, 2, 3], value=0, description="ZeRO stage")
    dp = w.IntText(value=1, description="DP size N")
    accum = w.Checkbox(value=False, description="fp32 grad accumulation")
    out = w.HTML()

    def refresh(*_: Any) -> None:
        try:
            pred = predict_memory(
                max(1, int(params.value * 1e6)),
                precision=precision.value,
                optimizer=optimizer.value,
                zero_stage=zero.value,
                dp_size=max(1, dp.value),
                fp32_grad_accumulation=accum.value and precision.value == "mixed",
            )
            out.value = f"<pre>{pred.table()}\n  bytes per parameter: {pred.bytes_per_parameter:.2f}</pre>"
        except ValueError as exc:
            out.value = f"<pre>{exc}</pre>"

    for field in (params, precision, optimizer, zero, dp, accum):
        field.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HBox([params, precision, optimizer]), w.HBox([zero, dp, accum]), out])
