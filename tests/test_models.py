"""Tests of mgpu_helpers.models: shapes, causality, sizes, and that each model learns its dataset."""

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mgpu_helpers.data import (
    collate_seq_batch_second,
    make_classification,
    make_images,
    make_sequences,
    make_tokens,
    train_val_split,
)
from mgpu_helpers.models import (
    MLP,
    LargeOutputModel,
    SmallCNN,
    TinyRNN,
    TinyTransformer,
    count_parameters,
    parameter_bytes,
)

Collate = Callable[[list[tuple[Tensor, Tensor]]], tuple[Tensor, Tensor]] | None


def train_and_evaluate(
    model: nn.Module, dataset: Dataset, epochs: int, lr: float = 1e-3, collate: Collate = None
) -> float:
    """Train on 80 % of ``dataset`` with Adam, return the accuracy on the other 20 %."""
    torch.manual_seed(0)
    train, val = train_val_split(dataset, val_fraction=0.2, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for x, y in DataLoader(train, batch_size=64, shuffle=True, collate_fn=collate):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        x, y = next(iter(DataLoader(val, batch_size=len(val), collate_fn=collate)))
        return (model(x).argmax(-1) == y).float().mean().item()


# --- shapes and structure -------------------------------------------------------------------------


def test_mlp_shape_and_depth() -> None:
    model = MLP(in_features=20, hidden=64, out_features=4, depth=3)
    assert model(torch.randn(5, 20)).shape == (5, 4)
    assert sum(isinstance(m, nn.Linear) for m in model) == 4  # 3 hidden + output
    assert sum(isinstance(m, nn.ReLU) for m in model) == 3


@pytest.mark.parametrize("size", [16, 32])
def test_small_cnn_accepts_16_and_32_pixel_images(size: int) -> None:
    model = SmallCNN(in_channels=3, n_classes=4, width=8)
    assert model(torch.randn(2, 3, size, size)).shape == (2, 4)


def test_tiny_rnn_default_layout_is_seq_batch_features() -> None:
    torch.manual_seed(0)
    model = TinyRNN(n_features=8, hidden=16, n_classes=3)
    x = torch.randn(12, 5, 8)  # (seq_len, batch, features)
    assert model(x).shape == (5, 3)


def test_tiny_rnn_batch_first_gives_the_same_answer_on_transposed_input() -> None:
    torch.manual_seed(0)
    seq_second = TinyRNN(n_features=8, hidden=16, n_classes=3)
    seq_first = TinyRNN(n_features=8, hidden=16, n_classes=3, batch_first=True)
    seq_first.load_state_dict(seq_second.state_dict())
    x = torch.randn(12, 5, 8)
    torch.testing.assert_close(seq_first(x.transpose(0, 1)), seq_second(x))


def test_tiny_rnn_reads_the_last_time_step() -> None:
    torch.manual_seed(0)
    model = TinyRNN(n_features=8, hidden=16, n_classes=3)
    x = torch.randn(12, 5, 8)
    out, _ = model.rnn(x)
    torch.testing.assert_close(model(x), model.head(out[-1]))


def test_tiny_transformer_output_shape() -> None:
    model = TinyTransformer(vocab_size=100, d_model=32, n_heads=4, n_layers=2, max_len=16)
    tokens = torch.randint(100, (3, 10))
    assert model(tokens).shape == (3, 10, 100)
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_len 16"):
        model(torch.randint(100, (3, 17)))
    with pytest.raises(ValueError, match=r"integer tensor of token ids, shape \(batch, seq_len\)"):
        model(torch.randn(3, 10))


def test_tiny_transformer_is_causal() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=100, d_model=32, n_heads=4, n_layers=2, max_len=16).eval()
    tokens = torch.randint(100, (2, 12))
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 100
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :8], after[:, :8])  # earlier positions: unchanged
    assert not torch.allclose(before[:, 8:], after[:, 8:])  # the changed one and later: changed


def test_large_output_model_output_shape_and_bytes() -> None:
    model = LargeOutputModel(in_features=64, hidden=16, vocab_size=32_000)
    out = model(torch.randn(3, 64))
    assert out.shape == (3, 32_000)
    assert out[0].numel() * out.element_size() == 32_000 * 4
    assert model.output_bytes_per_sample() == 32_000 * 4
    assert model.output_bytes_per_sample(torch.float16) == 32_000 * 2


def test_parameter_counts_and_bytes() -> None:
    layer = nn.Linear(1000, 1000)
    assert count_parameters(layer) == 1_001_000
    assert parameter_bytes(layer) == 4_004_000
    assert parameter_bytes(layer.half()) == 2_002_000
    assert count_parameters(MLP(20, 64, 4, depth=2)) == (20 * 64 + 64) + (64 * 64 + 64) + (64 * 4 + 4)


# --- bad inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "exc", "message"),
    [
        (MLP, (), {"depth": 0}, ValueError, r"depth \(hidden layers\) must be >= 1, not 0"),
        (MLP, (), {"hidden": 0}, ValueError, r"hidden must be >= 1, not 0"),
        (MLP, (), {"in_features": -3}, ValueError, r"in_features must be >= 1, not -3"),
        (MLP, (), {"out_features": 0}, ValueError, r"out_features must be >= 1"),
        (MLP, (), {"hidden": []}, TypeError, r"hidden must be a whole number >= 1, not \[\]"),
        (MLP, (), {"hidden": 64.0}, TypeError, r"hidden must be a whole number"),
        (SmallCNN, (), {"width": 0}, ValueError, r"width \(channels of the first conv block\) must be >= 1"),
        (SmallCNN, (), {"in_channels": 0}, ValueError, r"in_channels must be >= 1"),
        (SmallCNN, (), {"n_classes": "4"}, TypeError, r"n_classes must be a whole number"),
        (TinyRNN, (), {"hidden": 0}, ValueError, r"hidden must be >= 1"),
        (TinyRNN, (), {"n_features": -1}, ValueError, r"n_features must be >= 1"),
        (TinyRNN, (), {"batch_first": "yes"}, TypeError, r"batch_first must be True or False"),
        (
            TinyTransformer,
            (),
            {"d_model": 30, "n_heads": 4},
            ValueError,
            r"n_heads \(4\) must divide d_model",
        ),
        (TinyTransformer, (), {"n_heads": 0}, ValueError, r"n_heads must be >= 1"),
        (TinyTransformer, (), {"n_layers": 0}, ValueError, r"n_layers must be >= 1"),
        (TinyTransformer, (), {"vocab_size": 0}, ValueError, r"vocab_size must be >= 1"),
        (TinyTransformer, (), {"max_len": 0}, ValueError, r"max_len must be >= 1"),
        (LargeOutputModel, (), {"vocab_size": 0}, ValueError, r"vocab_size must be >= 1"),
        (LargeOutputModel(hidden=2).output_bytes_per_sample, ("fp16",), {}, TypeError, r"torch.dtype"),
        (count_parameters, ("model",), {}, TypeError, r"model must be a torch.nn.Module"),
        (parameter_bytes, ([nn.Linear(2, 2)],), {}, TypeError, r"model must be a torch.nn.Module .*not list"),
    ],
)
def test_bad_inputs_are_refused_with_what_to_pass(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: type[Exception],
    message: str,
) -> None:
    with pytest.raises(exc, match=message):
        func(*args, **kwargs)


# --- learning -------------------------------------------------------------------------------------


def test_mlp_learns_classification_above_90_percent() -> None:
    torch.manual_seed(0)
    accuracy = train_and_evaluate(MLP(), make_classification(n_samples=1024), epochs=3, lr=3e-3)
    assert accuracy > 0.9  # 0.94-0.98 over seeds; chance is 0.25


def test_small_cnn_learns_images() -> None:
    torch.manual_seed(0)
    accuracy = train_and_evaluate(SmallCNN(width=8), make_images(n_samples=512), epochs=3, lr=1e-2)
    assert accuracy > 0.6  # chance is 0.25


def test_tiny_rnn_learns_sequences() -> None:
    torch.manual_seed(0)
    dataset = make_sequences()
    accuracy = train_and_evaluate(TinyRNN(), dataset, epochs=5, lr=1e-2, collate=collate_seq_batch_second)
    assert accuracy > 0.75  # chance is 0.5


def test_tiny_transformer_learns_next_tokens() -> None:
    torch.manual_seed(0)
    vocab = 50
    model = TinyTransformer(vocab_size=vocab, d_model=32, n_heads=4, n_layers=1, max_len=16)
    inputs, targets = make_tokens(n_samples=256, seq_len=16, vocab_size=vocab).tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5  # a model that knows nothing scores ln(50) = 3.9
