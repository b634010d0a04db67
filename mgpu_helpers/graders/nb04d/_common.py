"""Used by notebook 04d's graders (:mod:`~mgpu_helpers.graders.nb04d`): what both exercises compare with."""

from __future__ import annotations

from typing import Any

import torch

_SAMPLES = 64  # samples of the graders' data set (each of 2 ranks sees half per epoch)


def _flat(tensors: Any) -> list[float]:
    return torch.cat([torch.as_tensor(t, dtype=torch.float64).reshape(-1) for t in tensors]).tolist()


def _differs(a: Any, b: Any) -> float | None:
    """Largest absolute difference between two lists of numbers, None when equal up to float64 rounding."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        return float("inf")
    return None if torch.allclose(a, b, rtol=1e-9, atol=1e-12) else float((a - b).abs().max())
