"""Tests of mgpu_helpers.data: shapes, dtypes, determinism and the rules each dataset holds."""

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from mgpu_helpers.data import (
    RandomDataset,
    collate_seq_batch_second,
    make_classification,
    make_images,
    make_sequences,
    make_tokens,
    train_val_split,
)

FACTORIES: dict[str, Callable[..., TensorDataset]] = {
    "classification": make_classification,
    "images": make_images,
    "sequences": make_sequences,
    "tokens": make_tokens,
}


def test_random_dataset_items_and_length() -> None:
    ds = RandomDataset(size=5, length=100)
    assert len(ds) == 100
    assert ds[0].shape == (5,)
    assert ds[0].dtype == torch.float32
    assert abs(ds.data.mean().item()) < 0.2 and abs(ds.data.std().item() - 1) < 0.2


def test_random_dataset_batches_like_the_dataparallel_tutorial() -> None:
    loader = DataLoader(RandomDataset(size=5, length=100), batch_size=30, shuffle=True)
    assert [batch.shape for batch in loader] == [(30, 5), (30, 5), (30, 5), (10, 5)]


def test_random_dataset_is_deterministic_by_seed() -> None:
    assert torch.equal(RandomDataset(5, 10, seed=1).data, RandomDataset(5, 10, seed=1).data)
    assert not torch.equal(RandomDataset(5, 10, seed=1).data, RandomDataset(5, 10, seed=2).data)


@pytest.mark.parametrize("name", FACTORIES)
def test_same_seed_same_data_other_seed_other_data(name: str) -> None:
    make = FACTORIES[name]
    a, b, c = make(seed=3).tensors, make(seed=3).tensors, make(seed=4).tensors
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("name", ["classification", "images", "sequences"])
def test_labels_are_int64_and_balanced(name: str) -> None:
    _, labels = FACTORIES[name](n_samples=400, n_classes=4, seed=0).tensors
    assert labels.dtype == torch.int64
    assert labels.shape == (400,)
    assert torch.bincount(labels, minlength=4).tolist() == [100, 100, 100, 100]


def test_make_classification_shapes() -> None:
    ds = make_classification(n_samples=100, n_features=7, n_classes=3)
    x, y = ds.tensors
    assert len(ds) == 100
    assert x.shape == (100, 7) and x.dtype == torch.float32
    assert y.min() >= 0 and y.max() < 3


def test_make_classification_noise_spreads_the_classes() -> None:
    def within_class_std(noise: float) -> float:
        x, y = make_classification(noise=noise).tensors
        return (x[y == 0] - x[y == 0].mean(0)).std().item()

    assert within_class_std(1.0) == pytest.approx(1.0, rel=0.1)
    assert within_class_std(3.0) == pytest.approx(3.0, rel=0.1)


def test_train_val_split_partitions_the_dataset() -> None:
    ds = make_classification(n_samples=100)
    train, val = train_val_split(ds, val_fraction=0.2, seed=0)
    assert (len(train), len(val)) == (80, 20)
    assert sorted(train.indices + val.indices) == list(range(100))


def test_train_val_split_is_deterministic_by_seed() -> None:
    ds = make_classification(n_samples=100)
    assert train_val_split(ds, seed=0)[1].indices == train_val_split(ds, seed=0)[1].indices
    assert train_val_split(ds, seed=0)[1].indices != train_val_split(ds, seed=1)[1].indices


@pytest.mark.parametrize("size", [16, 32])
def test_make_images_shapes(size: int) -> None:
    x, y = make_images(n_samples=8, image_size=size, channels=3, n_classes=4).tensors
    assert x.shape == (8, 3, size, size) and x.dtype == torch.float32
    assert y.shape == (8,) and y.dtype == torch.int64


def test_make_images_classes_differ_by_stripe_orientation() -> None:
    # Horizontal stripes (class 2 of 4, 90 degrees) vary along rows, not along columns.
    x, y = make_images(n_samples=400, n_classes=4).tensors
    img = x[y == 2].mean(1)  # average the channels: (n, H, W)
    var_along_rows = img.mean(2).var(1).mean()  # row means differ from row to row
    var_along_cols = img.mean(1).var(1).mean()
    assert var_along_rows > 5 * var_along_cols


def test_make_sequences_shapes() -> None:
    x, y = make_sequences(n_samples=10, seq_len=12, n_features=8).tensors
    assert x.shape == (10, 12, 8) and x.dtype == torch.float32
    assert y.shape == (10,) and y.dtype == torch.int64


def test_make_sequences_pulse_lies_in_the_class_segment() -> None:
    x, y = make_sequences(n_samples=600, seq_len=12, n_classes=3).tensors
    for c in range(3):
        mean_pulse = x[y == c, :, 0].mean(0)  # (seq_len,)
        segment = mean_pulse.reshape(3, 4).sum(1)  # total signal per 4-step segment
        assert segment.argmax().item() == c


def test_collate_seq_batch_second_puts_batch_on_dim_1() -> None:
    ds = make_sequences(n_samples=10, seq_len=12, n_features=8)
    loader = DataLoader(ds, batch_size=4, collate_fn=collate_seq_batch_second)
    x, y = next(iter(loader))
    assert x.shape == (12, 4, 8)
    assert y.shape == (4,)
    assert torch.equal(x[:, 1], ds[1][0])
    assert torch.equal(y, ds.tensors[1][:4])


def test_make_tokens_shapes_and_range() -> None:
    inputs, targets = make_tokens(n_samples=20, seq_len=16, vocab_size=50).tensors
    assert inputs.shape == targets.shape == (20, 16)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.min() >= 0 and inputs.max() < 50


def test_make_tokens_targets_are_next_tokens_of_a_fixed_map() -> None:
    inputs, targets = make_tokens(n_samples=200, seq_len=16, vocab_size=50).tensors
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    # The next token depends only on the current one: each token has exactly one successor.
    successors = {tok: set() for tok in range(50)}
    for tok, nxt in zip(inputs.flatten().tolist(), targets.flatten().tolist(), strict=True):
        successors[tok].add(nxt)
    assert all(len(s) == 1 for s in successors.values())
    assert len({s.pop() for s in successors.values()}) == 50  # a permutation


SMALL = make_classification(n_samples=10)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "exc", "message"),
    [
        (RandomDataset, (0, 10), {}, ValueError, r"size \(values per item\) must be >= 1, not 0"),
        (RandomDataset, (5, -1), {}, ValueError, r"length \(number of items\) must be >= 1"),
        (RandomDataset, (5, "10"), {}, TypeError, r"length .* must be a whole number >= 1, not '10'"),
        (RandomDataset, (5, 10), {"seed": -1}, ValueError, r"seed must be >= 0"),
        (RandomDataset, (5, 10), {"seed": "0"}, TypeError, r"seed must be an int >= 0 such as 0"),
        (make_classification, (), {"n_classes": 0}, ValueError, r"n_classes must be >= 1, not 0"),
        (make_classification, (), {"n_samples": 0}, ValueError, r"n_samples must be >= 1, not 0"),
        (make_classification, (), {"n_features": 0}, ValueError, r"n_features must be >= 1"),
        (make_classification, (), {"n_features": 2.5}, TypeError, r"n_features must be a whole number"),
        (
            make_classification,
            (),
            {"noise": -1.0},
            ValueError,
            r"noise must be a finite standard deviation >= 0",
        ),
        (make_classification, (), {"noise": float("nan")}, ValueError, r"noise must be a finite"),
        (make_classification, (), {"noise": "high"}, TypeError, r"noise must be a number"),
        (make_images, (), {"n_samples": 0}, ValueError, r"n_samples must be >= 1"),
        (make_images, (), {"image_size": 2}, ValueError, r"image_size .*period of 4.* must be >= 4, not 2"),
        (make_images, (), {"channels": 0}, ValueError, r"channels must be >= 1"),
        (make_images, (), {"n_classes": 0}, ValueError, r"n_classes must be >= 1"),
        (make_sequences, (), {"seq_len": 3, "n_classes": 4}, ValueError, r"seq_len \(3\) must be at least"),
        (make_sequences, (), {"n_features": 0}, ValueError, r"n_features must be >= 1"),
        (make_sequences, (), {"seq_len": 0}, ValueError, r"seq_len must be >= 1"),
        (make_tokens, (), {"vocab_size": 1}, ValueError, r"vocab_size must be >= 2"),
        (make_tokens, (), {"seq_len": 0}, ValueError, r"seq_len must be >= 1"),
        (make_tokens, (), {"n_samples": None}, TypeError, r"n_samples must be a whole number"),
        (
            train_val_split,
            (SMALL,),
            {"val_fraction": 0.0},
            ValueError,
            r"strictly between 0 and 1 such as 0.2",
        ),
        (train_val_split, (SMALL,), {"val_fraction": 1.0}, ValueError, r"strictly between 0 and 1"),
        (train_val_split, (SMALL,), {"val_fraction": -0.1}, ValueError, r"strictly between 0 and 1"),
        (train_val_split, (SMALL,), {"val_fraction": "0.2"}, TypeError, r"val_fraction must be a number"),
        (train_val_split, (SMALL,), {"val_fraction": 0.01}, ValueError, r"leaves the validation set empty"),
        (train_val_split, (SMALL,), {"val_fraction": 0.99}, ValueError, r"leaves the training set empty"),
        (train_val_split, (42,), {}, TypeError, r"dataset must be a Dataset with a length, not int"),
        (collate_seq_batch_second, ([],), {}, ValueError, r"non-empty list of \(sequence, label\) pairs"),
        (collate_seq_batch_second, ([1, 2],), {}, TypeError, r"\(sequence, label\) pair"),
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


def test_smallest_valid_sizes_work() -> None:
    assert len(RandomDataset(1, 1)) == 1
    assert make_classification(n_samples=1, n_features=1, n_classes=1, noise=0.0).tensors[0].shape == (1, 1)
    assert make_images(n_samples=1, image_size=4, channels=1, n_classes=1).tensors[0].shape == (1, 1, 4, 4)
    assert make_sequences(n_samples=1, seq_len=1, n_features=1, n_classes=1).tensors[0].shape == (1, 1, 1)
    assert make_tokens(n_samples=1, seq_len=1, vocab_size=2).tensors[0].shape == (1, 1)
    train, val = train_val_split(make_classification(n_samples=2), val_fraction=0.5)
    assert (len(train), len(val)) == (1, 1)
