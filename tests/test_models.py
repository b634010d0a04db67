"""Tests of mgpu_helpers.models: shapes, causality, sizes, and that each model learns its dataset."""

from collections.abc import Callable

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
    with pytest.raises(ValueError):
        MLP(depth=0)


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
    with pytest.raises(ValueError):
        model(torch.randint(100, (3, 17)))


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


# --- learning -------------------------------------------------------------------------------------


def test_mlp_learns_classification_above_90_percent() -> None:
    torch.manual_seed(0)
    accuracy = train_and_evaluate(MLP(), make_classification(), epochs=5)
    assert accuracy > 0.9


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
