"""Used by notebooks 01, 02b, 05b and 07a (and the troubleshooting helpers): the course's one analytic
memory estimator — parameters, gradients, optimizer state and (optionally) activations — with one set of
byte rules and one result type, :class:`MemoryPrediction`.

Two entry points share the rules:

* :func:`estimate_training_memory` ``(model, optimizer)`` — from a real model and a real
  ``torch.optim`` optimizer: exact bytes for their dtypes and settings (Adam's step counters included),
  e.g. ``Linear(1000, 1000)`` + Adam in fp32: 4,004,000 + 4,004,000 + 8,008,008 B;
* :func:`predict_memory` ``(n_params, precision=, optimizer=, zero_stage=, dp_size=)`` — per GPU, before
  any model exists. The formulas follow Hugging Face's *Ultra-Scale Playbook* (memory chapter), with Ψ
  the number of parameters and N the data-parallel size:

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

Every number here is *estimated*; the notebooks check it against :class:`~mgpu_helpers.memory.MemoryTracker`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._checks import whole
from ..models import count_parameters, parameter_bytes

__all__ = [
    "MemoryPrediction",
    "TransformerShape",
    "estimate_training_memory",
    "predict_memory",
    "transformer_activation_bytes",
]

Precision = Literal["fp32", "autocast", "mixed"]
OptimizerName = Literal["adam", "sgd_momentum", "sgd"]
_PRECISIONS = ("fp32", "autocast", "mixed")


@dataclass(frozen=True)
class _Rule:
    """What an optimizer keeps per parameter tensor once it has stepped."""

    states: int  # buffers the size of the parameter (exp_avg, momentum_buffer, …)
    scalars: int  # 0-d float tensors (step counters), one each per parameter tensor
    note: str  # what the buffers are
    eager: bool = False  # state made at construction for every parameter, frozen ones too (Adagrad)


# The byte rules. predict_memory takes the names; estimate_training_memory maps a torch optimizer onto
# them (or onto the few extra rules in _torch_rule).
_RULES: dict[str, _Rule] = {
    "adam": _Rule(2, 1, "Adam-type: two moment buffers (2 × parameters)"),
    "sgd_momentum": _Rule(1, 0, "SGD with momentum: one momentum buffer (1 × parameters)"),
    "sgd": _Rule(0, 0, "plain SGD (momentum 0): no optimizer state"),
}
_KNOWN_TORCH = "Adam, AdamW, NAdam, RAdam, Adamax, SGD, RMSprop, Adagrad, Adadelta, Rprop, ASGD"


def _torch_rule(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> _Rule:
    name = type(optimizer).__name__
    if name in ("Adam", "AdamW") and group.get("amsgrad"):
        return _Rule(3, 1, "Adam with amsgrad: two moment buffers + max_exp_avg_sq (3 × parameters)")
    if name in ("Adam", "AdamW", "RAdam", "Adamax"):
        return _RULES["adam"]
    if name == "NAdam":
        return _Rule(2, 2, "NAdam: two moment buffers (2 × parameters)")
    if name == "SGD":
        return _RULES["sgd_momentum" if group.get("momentum", 0) else "sgd"]
    if name == "RMSprop":
        n = 1 + bool(group.get("momentum", 0)) + bool(group.get("centered"))
        return _Rule(n, 1, "RMSprop: square_avg (+ momentum_buffer if momentum, + grad_avg if centered)")
    if name == "Adagrad":
        return _Rule(
            1, 1, "Adagrad: one buffer (1 × parameters), made up front for frozen ones too", eager=True
        )
    if name == "ASGD":
        return _Rule(1, 3, "ASGD: one buffer (1 × parameters)")
    if name in ("Adadelta", "Rprop"):
        return _Rule(2, 1, f"{name}: two buffers (2 × parameters)")
    hint = " (for ZeroRedundancyOptimizer pass its local optimizer, zero.optim)" if "Zero" in name else ""
    raise ValueError(
        f"No memory rule for optimizer {name}{hint}. Known: {_KNOWN_TORCH}. "
        "Count its state after one step with MemoryTracker instead."
    )


def _scalars_note(n: int) -> str:
    if n == 0:
        return ""
    what = f"a {_scalar_bytes()}-byte step" if n == 1 else f"{n} scalars of {_scalar_bytes()} bytes (step, …)"
    return f" + {what} per parameter tensor"


def _scalar_bytes() -> int:
    """Bytes of an optimizer's 0-d step tensor: float32, or float64 when that is torch's default dtype."""
    return 8 if torch.get_default_dtype() == torch.float64 else 4


def _check_model(model: Any, *, optional: bool = False) -> None:
    if model is None and optional:
        return
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (e.g. MLP() or nn.Linear(10, 2)), not {type(model).__name__}"
        )


def _check_optimizer(optimizer: Any) -> None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer must be a torch.optim.Optimizer such as torch.optim.Adam(model.parameters()) or None, "
            f"not {type(optimizer).__name__}"
        )


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a transformer for the activation formula; every field a whole number >= 1."""

    layers: int
    seq_len: int
    batch: int
    hidden: int
    heads: int

    def __post_init__(self) -> None:
        for name in ("layers", "seq_len", "batch", "hidden", "heads"):
            whole(f"TransformerShape.{name}", getattr(self, name), 1, "12")


def transformer_activation_bytes(shape: TransformerShape) -> int:
    """Activation bytes of a transformer in 16-bit precision, no recomputation: L·s·b·h·(34 + 5·a·s/h)."""
    if not isinstance(shape, TransformerShape):
        raise TypeError(
            f"shape must be a TransformerShape(layers=, seq_len=, batch=, hidden=, heads=), not {shape!r}"
        )
    s = shape
    return round(s.layers * s.seq_len * s.batch * s.hidden * (34 + 5 * s.heads * s.seq_len / s.hidden))


@dataclass(frozen=True)
class MemoryPrediction:
    """Estimated bytes (on one GPU, for :func:`predict_memory`), by the tracker's categories.

    ``activations`` is None when they were not estimated (then :meth:`as_dict` has no ``"other"``).
    ``notes`` say which rule gave each number.
    """

    parameters: int
    gradients: int
    optimizer: int
    activations: int | None
    n_params: int
    setup: str
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Sum of all categories (activations count as 0 when not estimated), bytes."""
        return self.parameters + self.gradients + self.optimizer + (self.activations or 0)

    @property
    def bytes_per_parameter(self) -> float:
        """Parameters + gradients + optimizer state per model parameter (activations excluded)."""
        return (self.parameters + self.gradients + self.optimizer) / self.n_params

    def as_dict(self) -> dict[str, int]:
        """Keyed like :data:`mgpu_helpers.memory.CATEGORIES`: activations, if estimated, under ``other``."""
        out = {"parameters": self.parameters, "gradients": self.gradients, "optimizer": self.optimizer}
        if self.activations is not None:
            out["other"] = self.activations
        return out

    def table(self) -> str:
        """Plain-text breakdown in GB (10⁹ bytes, as the Playbook counts) and bytes, then the notes."""
        rows = [
            ("weights", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer),
        ]
        if self.activations is not None:
            rows.append(("activations", self.activations))
        rows.append(("total", self.total))
        lines = [f"{self.setup} — {self.n_params:,} parameters (estimated)"]
        lines += [f"  {name:<20}{b / 1e9:>10.2f} GB  {b:>20,} B" for name, b in rows]
        lines += [f"  · {note}" for note in self.notes]
        return "\n".join(lines)


def predict_memory(
    n_params: int,
    *,
    precision: Precision = "mixed",
    optimizer: OptimizerName = "adam",
    zero_stage: int = 0,
    dp_size: int = 1,
    fp32_grad_accumulation: bool = False,
    activations: TransformerShape | int | None = None,
) -> MemoryPrediction:
    """Predict per-GPU training memory from a parameter count.

    Args:
        n_params: number of model parameters Ψ, a whole number >= 1 (e.g. ``7 * 10**9``).
        precision: ``"fp32"``; ``"autocast"`` (torch.autocast: fp32 weights and gradients, 16-bit
            compute — same persistent state as fp32); ``"mixed"`` (16-bit weights and gradients plus
            fp32 master weights, as in Apex O2, DeepSpeed and Megatron).
        optimizer: ``"adam"`` (two fp32 states), ``"sgd_momentum"`` (one), ``"sgd"`` (none). Scalar step
            counters (a few bytes per tensor) are left out: a parameter count has no tensors.
        zero_stage: 0 (plain data parallel), 1 (shard optimizer state), 2 (+ gradients), 3 (+ weights).
        dp_size: number of data-parallel ranks N that ZeRO shards over, >= 1.
        fp32_grad_accumulation: keep an extra fp32 gradient buffer (mixed precision only: +4Ψ).
        activations: a :class:`TransformerShape` for the formula, a byte count, or None (not estimated).
    """
    if isinstance(n_params, float) and n_params.is_integer():
        n_params = int(n_params)  # 7e9 is a whole number of parameters
    psi = whole("n_params", n_params, 1, "7 * 10**9")
    if not isinstance(precision, str) or precision not in _PRECISIONS:
        raise ValueError(f"precision must be 'fp32', 'autocast' or 'mixed', not {precision!r}")
    if not isinstance(optimizer, str) or optimizer not in _RULES:
        raise ValueError(f"optimizer must be one of {sorted(_RULES)}, not {optimizer!r}")
    if isinstance(zero_stage, bool) or not isinstance(zero_stage, int) or zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, not {zero_stage!r}")
    n = whole("dp_size", dp_size, 1, "8 data-parallel ranks")
    if not isinstance(fp32_grad_accumulation, bool):
        raise TypeError(f"fp32_grad_accumulation must be True or False, not {fp32_grad_accumulation!r}")
    if fp32_grad_accumulation and precision != "mixed":
        raise ValueError(
            "fp32_grad_accumulation only applies to precision='mixed' (fp32 gradients already are)"
        )
    if isinstance(activations, TransformerShape):
        act: int | None = transformer_activation_bytes(activations)
    elif activations is None:
        act = None
    elif isinstance(activations, bool) or not isinstance(activations, numbers.Integral):
        raise TypeError(
            f"activations must be a TransformerShape, a byte count (int) or None, not {activations!r}"
        )
    elif activations < 0:
        raise ValueError(
            f"activations must be a byte count >= 0 (or a TransformerShape, or None), not {activations}"
        )
    else:
        act = int(activations)

    rule = _RULES[optimizer]
    notes = [rule.note + (", scalar step counters not counted" if rule.scalars else "")]
    if precision == "mixed":
        weights, grads, opt = 2 * psi, 2 * psi, (4 + 4 * rule.states) * psi
        grads += 4 * psi if fp32_grad_accumulation else 0
        notes.append(
            "mixed: 16-bit weights and gradients; the optimizer keeps fp32 master weights (4Ψ) + fp32 states"
        )
    else:
        weights, grads, opt = 4 * psi, 4 * psi, 4 * rule.states * psi
        notes.append(f"{precision}: fp32 weights, gradients and states (4 bytes each)")
    if zero_stage >= 1:
        opt = opt / n
    if zero_stage >= 2:
        grads = grads / n
    if zero_stage >= 3:
        weights = weights / n
    if zero_stage:
        sharded = ("optimizer state", "gradients", "weights")[:zero_stage]
        notes.append(f"ZeRO-{zero_stage}: {', '.join(sharded)} divided by N = {n}")
    if act is not None:
        notes.append(
            "activations: 16-bit transformer, no recomputation"
            if isinstance(activations, TransformerShape)
            else "activations: the byte count given"
        )
    setup = f"{precision}, {optimizer}, ZeRO-{zero_stage}, N={n}" + (
        ", fp32 grad accum" if fp32_grad_accumulation else ""
    )
    return MemoryPrediction(round(weights), round(grads), round(opt), act, psi, setup, tuple(notes))


def _param_bytes(params: list[torch.nn.Parameter]) -> int:
    """Bytes of some of a model's parameters, by the course's one count (models.parameter_bytes)."""
    return parameter_bytes(torch.nn.ParameterList(params)) if params else 0


def estimate_training_memory(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> MemoryPrediction:
    """Analytic bytes for parameters + gradients + optimizer state of a real model (activations excluded).

    Parameters in their own dtype (:func:`mgpu_helpers.models.parameter_bytes`), one gradient of the same
    size per trainable parameter, and the optimizer's state by its type and settings: for fp32 Adam the
    classic 4 + 4 + 8 = 16 bytes per parameter, plus a 4-byte step counter per parameter tensor. Works on
    ``torch.device("meta")`` models (nothing allocated).

    Args:
        model: the module to train (at least one parameter).
        optimizer: a ``torch.optim`` optimizer over (some of) ``model``'s parameters, or None (no state).
    """
    _check_model(model)
    _check_optimizer(optimizer)
    params = list(model.parameters())
    if not params:
        raise ValueError(f"model ({type(model).__name__}) has no parameters: pass the module you will train")
    trainable = [p for p in params if p.requires_grad]
    o_bytes, notes = (
        0,
        [
            "parameters: models.parameter_bytes (numel × element size)",
            "gradients: one per trainable parameter, same dtype",
        ],
    )
    if optimizer is not None:
        mine = {id(p) for p in params}
        for group in optimizer.param_groups:
            if any(id(p) not in mine for p in group["params"]):
                raise ValueError(
                    "optimizer holds parameters that are not this model's: pass the optimizer built from "
                    "model.parameters()"
                )
            rule = _torch_rule(optimizer, group)
            stepped = [p for p in group["params"] if p.requires_grad or rule.eager]
            o_bytes += rule.states * _param_bytes(stepped) + rule.scalars * _scalar_bytes() * len(stepped)
            note = rule.note + _scalars_note(rule.scalars)
            if note not in notes:
                notes.append(note)
    dtypes = "/".join(sorted({str(p.dtype).removeprefix("torch.") for p in params}))
    setup = f"{type(model).__name__}, {type(optimizer).__name__ if optimizer else 'no optimizer'}, {dtypes}"
    return MemoryPrediction(
        parameter_bytes(model),
        _param_bytes(trainable),
        o_bytes,
        None,
        count_parameters(model),
        setup,
        tuple(notes),
    )
