"""Used by notebook 08's graders (:mod:`~mgpu_helpers.graders.nb08`): the digits data both exercises use,
and a model's accuracy on all of the validation set."""

from __future__ import annotations

from typing import Any

_N_TRAIN, _N_VAL = 800, 301  # 400 items per rank; 301 is odd, so a padded evaluation shows


def _digits() -> tuple[Any, Any, Any, Any]:
    """A fixed, shuffled subset of scikit-learn's digits: (x_train, y_train, x_val, y_val), pixels 0..1."""
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(8))
    tr, va = order[:_N_TRAIN], order[_N_TRAIN : _N_TRAIN + _N_VAL]
    return x[tr], y[tr], x[va], y[va]


def _full_accuracies(model: Any, x: Any, y: Any) -> list[float]:
    """The validation accuracy of ``model`` on all of (x, y), in fp32 and under bf16 autocast."""
    import torch

    out = []
    with torch.no_grad():
        for enabled in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                out.append((model(x).argmax(1) == y).double().mean().item())
    return out
