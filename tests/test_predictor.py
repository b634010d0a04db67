"""The memory predictor reproduces the Ultra-Scale Playbook's figures and matches the tracker."""

import pytest
import torch

from mgpu_helpers.memory import MemoryTracker
from mgpu_helpers.models import MLP, count_parameters
from mgpu_helpers.predictor import (
    TransformerShape,
    predict_memory,
    predictor_form,
    transformer_activation_bytes,
)


@pytest.mark.parametrize(("billions", "gb"), [(1, 16), (7, 112), (70, 1120)])
def test_playbook_mixed_precision_adam_is_16_bytes_per_parameter(billions, gb):
    pred = predict_memory(billions * 10**9, precision="mixed")
    assert pred.total == gb * 10**9
    assert (pred.parameters, pred.gradients, pred.optimizer) == (
        2e9 * billions,
        2e9 * billions,
        12e9 * billions,
    )


def test_fp32_grad_accumulation_is_20_bytes_per_parameter():
    assert predict_memory(10**9, precision="mixed", fp32_grad_accumulation=True).bytes_per_parameter == 20


@pytest.mark.parametrize(
    ("stage", "expected"),
    [(0, 2 + 2 + 12), (1, 2 + 2 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)],
)
def test_zero_stages_follow_the_playbook(stage, expected):
    pred = predict_memory(10**9, precision="mixed", zero_stage=stage, dp_size=8)
    assert pred.bytes_per_parameter == pytest.approx(expected)


def test_fp32_and_autocast_and_sgd():
    assert predict_memory(1000, precision="fp32").bytes_per_parameter == 16
    autocast = predict_memory(1000, precision="autocast")  # torch.autocast keeps fp32 weights and grads
    assert (autocast.parameters, autocast.gradients, autocast.optimizer) == (4000, 4000, 8000)
    assert predict_memory(1000, precision="fp32", optimizer="sgd").bytes_per_parameter == 8
    assert predict_memory(1000, precision="mixed", optimizer="sgd_momentum").bytes_per_parameter == 12


def test_activation_formula():
    shape = TransformerShape(layers=2, seq_len=128, batch=4, hidden=64, heads=4)
    assert transformer_activation_bytes(shape) == 2 * 128 * 4 * 64 * (34 + 5 * 4 * 128 / 64)
    assert predict_memory(100, activations=shape).activations == transformer_activation_bytes(shape)


def test_bad_arguments():
    for kwargs in ({"zero_stage": 4}, {"dp_size": 0}, {"precision": "fp8"}, {"optimizer": "lion"}):
        with pytest.raises(ValueError):
            predict_memory(100, **kwargs)
    with pytest.raises(ValueError, match="only applies"):
        predict_memory(100, precision="fp32", fp32_grad_accumulation=True)


@pytest.mark.parametrize(
    ("name", "make_opt", "kind"),
    [
        ("adam", lambda p: torch.optim.Adam(p), "adam"),
        ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "sgd_momentum"),
    ],
)
def test_prediction_matches_tracker_within_5_percent(name, make_opt, kind):
    torch.manual_seed(0)
    model = MLP(20, 256, 4, depth=3)
    opt = make_opt(model.parameters())
    tracker = MemoryTracker(model, opt)
    with tracker:
        model(torch.randn(32, 20)).sum().backward()
        opt.step()
        measured = tracker.mark("after step").bytes
    tracker.close()
    pred = predict_memory(count_parameters(model), precision="fp32", optimizer=kind)
    for cat in ("parameters", "gradients", "optimizer"):
        assert measured[cat] == pytest.approx(pred.as_dict()[cat], rel=0.05), cat


def test_form_recomputes_on_change():
    form = predictor_form(1000.0)
    out = form.children[-1]
    assert "16,000,000,000 B" in out.value  # 1B params, mixed precision Adam
    zero = form.children[1].children[0]
    dp = form.children[1].children[1]
    dp.value = 4
    zero.value = 3
    assert "4,000,000,000 B" in out.value  # 16 B/param sharded over 4
