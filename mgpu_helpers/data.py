"""Used by notebooks 01, 03a, 04b, 04c and 05a (and by :mod:`mgpu_helpers.tuning` for notebooks 06a and 06b):
small
synthetic datasets for the course, generated locally and deterministically.

Nothing here downloads anything: every dataset is built from a seeded
``torch.Generator``, so the same arguments always give the same tensors, on
any machine. The sets are tiny on purpose, so that the notebooks run on a CPU,
yet each one holds a rule that its matching model in :mod:`mgpu_helpers.models`
can learn, so a falling loss means something.

=======================  ======================  ==========================
function                 one item (x, y)         model that learns it
=======================  ======================  ==========================
``RandomDataset``        x: (size,)              any (no labels; timing)
``make_classification``  x: (n_features,)        ``MLP``
``make_images``          x: (C, H, W)            ``SmallCNN``
``make_sequences``       x: (seq_len, features)  ``TinyRNN``
``make_tokens``          x, y: (seq_len,) int64  ``TinyTransformer``
=======================  ======================  ==========================
"""

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset, random_split

from ._checks import whole

__all__ = [
    "RandomDataset",
    "collate_seq_batch_second",
    "make_classification",
    "make_images",
    "make_sequences",
    "make_tokens",
    "train_val_split",
]


def _seed(seed: Any) -> int:
    """Return ``seed`` if it is an int >= 0, else raise saying what to pass."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int >= 0 such as 0, not {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, not {seed}")
    return int(seed)


def _generator(seed: int) -> torch.Generator:
    """Return a CPU generator seeded with ``seed`` (the global RNG is left alone)."""
    return torch.Generator().manual_seed(_seed(seed))


def _balanced_labels(n_samples: int, n_classes: int, gen: torch.Generator) -> Tensor:
    """Labels 0..n_classes-1 in equal shares (up to one), shuffled; int64, shape (n_samples,)."""
    labels = torch.arange(n_samples) % n_classes
    return labels[torch.randperm(n_samples, generator=gen)]


class RandomDataset(Dataset):
    """``length`` vectors of ``size`` standard-normal float32 values, with no labels.

    This mirrors the dataset of the classic PyTorch DataParallel tutorial: with
    ``size=5, length=100`` and a ``DataLoader`` of ``batch_size=30`` the batches
    hold 30, 30, 30 and 10 items. All the data are drawn once, at construction,
    from a generator seeded with ``seed``.

    Args:
        size: number of values in each item.
        length: number of items.
        seed: seed of the generator that draws the data.
    """

    def __init__(self, size: int, length: int, seed: int = 0) -> None:
        size, length = whole("size (values per item)", size), whole("length (number of items)", length)
        self.len = length
        self.data = torch.randn(length, size, generator=_generator(seed))

    def __getitem__(self, index: int) -> Tensor:
        """Return item ``index``: a float32 tensor of shape ``(size,)``."""
        return self.data[index]

    def __len__(self) -> int:
        """Return the number of items, ``length``."""
        return self.len


def make_classification(
    n_samples: int = 2048,
    n_features: int = 20,
    n_classes: int = 4,
    *,
    noise: float = 1.0,
    seed: int = 0,
) -> TensorDataset:
    """Gaussian blobs: one cloud of points around a random centre per class.

    Each class centre is a random direction scaled to length 3.5, so centres
    sit about 5 apart; each point is its class centre plus Gaussian noise of
    standard deviation ``noise``. At ``noise=1.0`` the clouds overlap a little:
    a small MLP reaches well over 90 % accuracy but not 100 %. Raise ``noise``
    to make the task harder.

    Args:
        n_samples: number of points.
        n_features: length of each feature vector.
        n_classes: number of classes; the classes are balanced.
        noise: standard deviation of the noise around each centre.
        seed: seed of the generator; same seed, same dataset.

    Returns:
        A ``TensorDataset`` of features, float32 ``(n_samples, n_features)``,
        and labels, int64 ``(n_samples,)`` in ``[0, n_classes)``.
    """
    n_samples, n_features = whole("n_samples", n_samples), whole("n_features", n_features)
    n_classes = whole("n_classes", n_classes)
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real):
        raise TypeError(f"noise must be a number (a standard deviation >= 0 such as 1.0), not {noise!r}")
    if not 0 <= noise < math.inf:
        raise ValueError(f"noise must be a finite standard deviation >= 0 such as 1.0, not {noise}")
    gen = _generator(seed)
    centres = torch.randn(n_classes, n_features, generator=gen)
    centres = 3.5 * centres / centres.norm(dim=1, keepdim=True)
    labels = _balanced_labels(n_samples, n_classes, gen)
    features = centres[labels] + noise * torch.randn(n_samples, n_features, generator=gen)
    return TensorDataset(features, labels)


def train_val_split(dataset: Dataset, val_fraction: float = 0.2, seed: int = 0) -> tuple[Subset, Subset]:
    """Split ``dataset`` at random into a training and a validation subset.

    The split depends only on ``seed`` and the dataset's length, so it is the
    same in every process of a multi-GPU job.

    Args:
        dataset: any dataset with a length.
        val_fraction: share of the items that go to validation, in (0, 1); both parts must be
            non-empty.
        seed: seed of the shuffle.

    Returns:
        ``(train, val)``, with ``len(val) == round(len(dataset) * val_fraction)``.
    """
    if isinstance(dataset, str | bytes) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise TypeError(f"dataset must be a Dataset with a length, not {type(dataset).__name__}")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise TypeError(f"val_fraction must be a number between 0 and 1 such as 0.2, not {val_fraction!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be strictly between 0 and 1 such as 0.2, not {val_fraction}")
    n_val = round(len(dataset) * val_fraction)
    if not 0 < n_val < len(dataset):
        raise ValueError(
            f"val_fraction={val_fraction} of {len(dataset)} items leaves "
            f"{'the validation' if n_val == 0 else 'the training'} set empty; "
            "use a larger dataset or a fraction nearer 0.5"
        )
    train, val = random_split(dataset, [len(dataset) - n_val, n_val], generator=_generator(seed))
    return train, val


def make_images(
    n_samples: int = 1024,
    image_size: int = 16,
    channels: int = 3,
    n_classes: int = 4,
    *,
    seed: int = 0,
) -> TensorDataset:
    """Noisy images of stripes; the class is the stripes' orientation.

    Class ``c`` has stripes at angle ``180° * c / n_classes`` (with 4 classes:
    0°, 45°, 90°, 135°) with a period of 4 pixels, a random phase (so the class
    cannot be read off one pixel) and Gaussian noise of standard deviation 1,
    as strong as the stripes, on every pixel. All channels show the same
    stripes with their own noise. A tiny CNN learns this in an epoch or two.

    Args:
        n_samples: number of images.
        image_size: height and width in pixels.
        channels: number of channels.
        n_classes: number of orientations (classes); the classes are balanced.
        seed: seed of the generator; same seed, same dataset.

    Returns:
        A ``TensorDataset`` of images, float32 ``(n_samples, channels,
        image_size, image_size)``, and labels, int64 ``(n_samples,)``.
    """
    n_samples, channels = whole("n_samples", n_samples), whole("channels", channels)
    n_classes = whole("n_classes", n_classes)
    image_size = whole("image_size (pixels; the stripes have a period of 4)", image_size, minimum=4)
    gen = _generator(seed)
    labels = _balanced_labels(n_samples, n_classes, gen)
    angle = math.pi * labels.float() / n_classes  # (N,)
    phase = 2 * math.pi * torch.rand(n_samples, generator=gen)  # (N,)
    coords = torch.arange(image_size, dtype=torch.float32)
    y, x = torch.meshgrid(coords, coords, indexing="ij")  # (H, W) each
    along = x * angle.cos().view(-1, 1, 1) + y * angle.sin().view(-1, 1, 1)  # (N, H, W)
    stripes = torch.sin(2 * math.pi * along / 4.0 + phase.view(-1, 1, 1))
    noise = torch.randn(n_samples, channels, image_size, image_size, generator=gen)
    images = stripes.unsqueeze(1) + noise
    return TensorDataset(images, labels)


def make_sequences(
    n_samples: int = 1024,
    seq_len: int = 12,
    n_features: int = 8,
    n_classes: int = 2,
    *,
    seed: int = 0,
) -> TensorDataset:
    """Noisy sequences holding one pulse; the class is where in time the pulse is.

    The time axis is cut into ``n_classes`` equal segments. A sequence of
    class ``c`` has a pulse of height 3 on feature 0 at a random step inside
    segment ``c`` (with 2 classes: in the first or the second half), on top of
    standard-normal noise on every feature. A model must look along the time
    axis to tell the classes apart.

    Items are ``(seq_len, n_features)``, time first. A ``DataLoader``'s default
    collate stacks them as ``(batch, seq_len, n_features)``;
    :func:`collate_seq_batch_second` stacks them as ``(seq_len, batch,
    n_features)``, the layout PyTorch's RNNs expect by default.

    Args:
        n_samples: number of sequences.
        seq_len: number of time steps; at least ``n_classes``.
        n_features: number of features at each step.
        n_classes: number of time segments (classes); the classes are balanced.
        seed: seed of the generator; same seed, same dataset.

    Returns:
        A ``TensorDataset`` of sequences, float32 ``(n_samples, seq_len,
        n_features)``, and labels, int64 ``(n_samples,)``.
    """
    n_samples, seq_len = whole("n_samples", n_samples), whole("seq_len", seq_len)
    n_features, n_classes = whole("n_features", n_features), whole("n_classes", n_classes)
    if seq_len < n_classes:
        raise ValueError(
            f"seq_len ({seq_len}) must be at least n_classes ({n_classes}): one time segment per class"
        )
    gen = _generator(seed)
    labels = _balanced_labels(n_samples, n_classes, gen)
    # Segment c covers steps [starts[c], starts[c + 1]).
    starts = torch.div(torch.arange(n_classes + 1) * seq_len, n_classes, rounding_mode="floor")
    seg_start, seg_len = starts[labels], starts[labels + 1] - starts[labels]
    step = seg_start + (torch.rand(n_samples, generator=gen) * seg_len).long()
    sequences = torch.randn(n_samples, seq_len, n_features, generator=gen)
    sequences[torch.arange(n_samples), step, 0] += 3.0
    return TensorDataset(sequences, labels)


def collate_seq_batch_second(batch: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Collate ``(sequence, label)`` items with the batch on dimension 1.

    Pass this as a ``DataLoader``'s ``collate_fn``. The sequences, each
    ``(seq_len, n_features)``, are stacked into ``(seq_len, batch,
    n_features)``: batch second, the default layout of ``nn.RNN``, ``nn.GRU``
    and ``nn.LSTM`` (``batch_first=False``). The labels become ``(batch,)``.

    This matters for ``nn.DataParallel``: it splits its inputs along ``dim=0``
    unless told otherwise, which here would hand each GPU a slice of *time
    steps* instead of a slice of the batch. Wrap such a model as
    ``nn.DataParallel(model, dim=1)``.

    Args:
        batch: a list of ``(sequence, label)`` pairs, as a dataset yields them.

    Returns:
        ``(sequences, labels)``: ``(seq_len, batch, n_features)`` and ``(batch,)``.
    """
    if not isinstance(batch, Sequence) or not batch:
        raise ValueError("batch must be a non-empty list of (sequence, label) pairs, as a DataLoader passes")
    if not all(isinstance(item, tuple | list) and len(item) == 2 for item in batch):
        raise TypeError("each item of batch must be a (sequence, label) pair, as make_sequences yields")
    sequences, labels = zip(*batch, strict=True)
    return torch.stack(sequences, dim=1), torch.stack(labels)


def make_tokens(
    n_samples: int = 512,
    seq_len: int = 16,
    vocab_size: int = 1000,
    *,
    seed: int = 0,
) -> TensorDataset:
    """Token sequences for next-token prediction, following a hidden permutation.

    A random permutation ``perm`` of the vocabulary is drawn once; each
    sequence starts at a random token and goes on with ``next = perm[token]``.
    The inputs are the sequence and the targets the same sequence shifted by
    one step, as for a language model: ``targets[:, t] == inputs[:, t + 1]``.
    A model that learns ``perm`` predicts every target, so the loss can fall
    to near zero; a model that has learnt nothing scores ``ln(vocab_size)``.

    Args:
        n_samples: number of sequences.
        seq_len: length of each input (and target) sequence.
        vocab_size: number of distinct tokens, ids ``0 .. vocab_size - 1``.
        seed: seed of the generator; same seed, same dataset.

    Returns:
        A ``TensorDataset`` of inputs and targets, both int64 ``(n_samples, seq_len)``.
    """
    n_samples, seq_len = whole("n_samples", n_samples), whole("seq_len", seq_len)
    vocab_size = whole("vocab_size", vocab_size, minimum=2)
    gen = _generator(seed)
    perm = torch.randperm(vocab_size, generator=gen)
    tokens = torch.empty(n_samples, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab_size, (n_samples,), generator=gen)
    for t in range(seq_len):
        tokens[:, t + 1] = perm[tokens[:, t]]
    return TensorDataset(tokens[:, :-1].clone(), tokens[:, 1:].clone())
