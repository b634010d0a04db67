"""The memory predictor reproduces the Ultra-Scale Playbook's figures, shares its byte rules with the
estimate from a real model, matches the tracker, and refuses bad arguments with a message that says what
to pass."""

import pytest
import torch

from mgpu_helpers.memory import (
    MemoryTracker,
    TransformerShape,
    estimate_training_memory,
    predict_memory,
    predictor_form,
    transformer_activation_bytes,
)
from mgpu_helpers.models import MLP, count_parameters


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


def test_activations_are_optional_and_counted_under_other():
    without = predict_memory(1000, precision="fp32")
    assert without.activations is None and "other" not in without.as_dict() and without.total == 16_000
    given = predict_memory(1000, precision="fp32", activations=500)
    assert given.as_dict()["other"] == 500 and given.total == 16_500
    assert "activations" in given.table() and "activations" not in without.table()
    assert predict_memory(7e9).n_params == 7 * 10**9  # a float that is a whole number is fine


@pytest.mark.parametrize(
    ("kind", "make_opt"),
    [
        ("adam", lambda p: torch.optim.Adam(p)),
        ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        ("sgd", lambda p: torch.optim.SGD(p, lr=0.1)),
    ],
)
def test_predictor_and_real_model_estimate_share_the_rules(kind, make_opt):
    """fp32: the same bytes, except that a real Adam also keeps one 4-byte step per parameter tensor."""
    model = MLP(20, 64, 4, depth=2)
    real = estimate_training_memory(model, make_opt(model.parameters()))
    pred = predict_memory(count_parameters(model), precision="fp32", optimizer=kind)
    steps = 4 * len(list(model.parameters())) if kind == "adam" else 0
    assert (real.parameters, real.gradients) == (pred.parameters, pred.gradients)
    assert real.optimizer == pred.optimizer + steps
    assert real.n_params == pred.n_params


_SHAPE = {"layers": 2, "seq_len": 128, "batch": 4, "hidden": 64, "heads": 4}


@pytest.mark.parametrize(
    ("call", "args", "kwargs", "exc", "match"),
    [
        (
            predict_memory,
            ("7B",),
            {},
            TypeError,
            r"n_params must be a whole number >= 1 such as 7 \* 10\*\*9, not '7B'",
        ),
        (predict_memory, (0,), {}, ValueError, r"n_params must be >= 1"),
        (predict_memory, (True,), {}, TypeError, r"n_params must be a whole number"),
        (predict_memory, (1.5,), {}, TypeError, r"n_params must be a whole number"),
        (
            predict_memory,
            (100,),
            {"precision": "fp8"},
            ValueError,
            r"precision must be 'fp32', 'autocast' or 'mixed'",
        ),
        (predict_memory, (100,), {"optimizer": "lion"}, ValueError, r"optimizer must be one of \['adam'"),
        (predict_memory, (100,), {"optimizer": ["adam"]}, ValueError, r"optimizer must be one of"),
        (predict_memory, (100,), {"zero_stage": 4}, ValueError, r"zero_stage must be 0, 1, 2 or 3"),
        (
            predict_memory,
            (100,),
            {"zero_stage": 1.0},
            ValueError,
            r"zero_stage must be 0, 1, 2 or 3, not 1.0",
        ),
        (predict_memory, (100,), {"dp_size": 0}, ValueError, r"dp_size must be >= 1"),
        (predict_memory, (100,), {"dp_size": "8"}, TypeError, r"dp_size must be a whole number"),
        (predict_memory, (100,), {"fp32_grad_accumulation": "yes"}, TypeError, r"True or False"),
        (
            predict_memory,
            (100,),
            {"precision": "fp32", "fp32_grad_accumulation": True},
            ValueError,
            r"only applies to precision='mixed'",
        ),
        (predict_memory, (100,), {"activations": -1}, ValueError, r"byte count >= 0"),
        (
            predict_memory,
            (100,),
            {"activations": "big"},
            TypeError,
            r"a TransformerShape, a byte count \(int\) or None",
        ),
        (TransformerShape, (), {**_SHAPE, "layers": 0}, ValueError, r"TransformerShape.layers must be >= 1"),
        (TransformerShape, (), {**_SHAPE, "heads": -2}, ValueError, r"TransformerShape.heads must be >= 1"),
        (
            TransformerShape,
            (),
            {**_SHAPE, "hidden": 64.0},
            TypeError,
            r"TransformerShape.hidden must be a whole number",
        ),
        (
            transformer_activation_bytes,
            ((2, 128, 4, 64, 4),),
            {},
            TypeError,
            r"TransformerShape\(layers=, seq_len=",
        ),
        (predictor_form, (0,), {}, ValueError, r"default_params_millions must be > 0 \(e.g. 7000.0 for 7B\)"),
        (predictor_form, ("7B",), {}, TypeError, r"default_params_millions must be a number such as 7000.0"),
    ],
)
def test_bad_arguments_are_refused_with_a_fix(call, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(*args, **kwargs)


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
    dp.value = 0  # the predictor's own message replaces the table
    assert "dp_size must be >= 1" in out.value and "GB" not in out.value
