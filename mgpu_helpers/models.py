"""Used by notebooks 01, 03a, 03b, 04a, 04b, 04c, 04e, 04f, 05a, 05b and 07a (and the benchmarks, tuning and
DDP helpers): small models
for the course, each matched to a dataset in :mod:`mgpu_helpers.data`, and the course's one
parameter-bytes count, :func:`parameter_bytes`.

They are deliberately tiny, so that they train in seconds on a CPU; the
point of the notebooks is how they are spread over GPUs, not the models.

==========================  ==================================  ==========================
model                       input -> output                     dataset
==========================  ==================================  ==========================
``MLP``                     (B, in) -> (B, out)                 ``make_classification``
``SmallCNN``                (B, C, H, W) -> (B, classes)        ``make_images``
``TinyRNN``                 (T, B, F) -> (B, classes)           ``make_sequences``
``TinyTransformer``         (B, T) int64 -> (B, T, vocab)       ``make_tokens``
``LargeOutputModel``        (B, in) -> (B, vocab)               (memory lessons)
==========================  ==================================  ==========================
"""

from typing import Any

import torch
from torch import Tensor, nn

from ._checks import whole

__all__ = [
    "MLP",
    "LargeOutputModel",
    "SmallCNN",
    "TinyRNN",
    "TinyTransformer",
    "count_parameters",
    "parameter_bytes",
]


def _module(model: Any) -> nn.Module:
    """Return ``model`` if it is an ``nn.Module``, else raise saying what to pass."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (e.g. MLP()), not {type(model).__name__}")
    return model


class MLP(nn.Sequential):
    """A multi-layer perceptron: ``depth`` hidden Linear+ReLU layers, then a Linear output.

    With the defaults: ``Linear(20, 64), ReLU, Linear(64, 64), ReLU, Linear(64, 4)``.
    Input ``(batch, in_features)`` -> logits ``(batch, out_features)``.

    Args:
        in_features: size of each input vector.
        hidden: width of the hidden layers.
        out_features: size of each output vector (the number of classes).
        depth: number of hidden layers, at least 1.
    """

    def __init__(
        self, in_features: int = 20, hidden: int = 64, out_features: int = 4, depth: int = 2
    ) -> None:
        in_features, hidden = whole("in_features", in_features), whole("hidden", hidden)
        out_features = whole("out_features", out_features)
        depth = whole("depth (hidden layers)", depth)
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)


class SmallCNN(nn.Module):
    """A small convolutional classifier: two conv blocks, global pooling, a linear layer.

    Each block is ``Conv2d(3x3, padding 1), ReLU, MaxPool2d(2)``; the second
    block doubles the width. Global average pooling makes the network work
    for any image of at least 4x4 pixels (16x16 and 32x32 alike).
    Input ``(batch, in_channels, H, W)`` -> logits ``(batch, n_classes)``.

    Args:
        in_channels: number of input channels.
        n_classes: number of classes.
        width: channels of the first conv block (the second has ``2 * width``).
    """

    def __init__(self, in_channels: int = 3, n_classes: int = 4, width: int = 16) -> None:
        in_channels, n_classes = whole("in_channels", in_channels), whole("n_classes", n_classes)
        width = whole("width (channels of the first conv block)", width)
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(2 * width, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Map images ``(batch, C, H, W)`` to logits ``(batch, n_classes)``."""
        return self.classifier(self.features(x))


class TinyRNN(nn.Module):
    """A one-layer GRU that classifies a sequence from its last time step.

    By default (``batch_first=False``) the input is ``(seq_len, batch,
    n_features)``, PyTorch's RNN layout; with ``nn.DataParallel`` wrap it as
    ``nn.DataParallel(model, dim=1)`` so that the batch, not time, is split.
    With ``batch_first=True`` the input is ``(batch, seq_len, n_features)``.
    The output is ``(batch, n_classes)`` either way.

    Args:
        n_features: number of features at each time step.
        hidden: size of the GRU's hidden state.
        n_classes: number of classes.
        batch_first: whether the batch is dimension 0 of the input (else dimension 1).
    """

    def __init__(
        self, n_features: int = 8, hidden: int = 32, n_classes: int = 2, batch_first: bool = False
    ) -> None:
        n_features, hidden = whole("n_features", n_features), whole("hidden", hidden)
        n_classes = whole("n_classes", n_classes)
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first must be True or False, not {batch_first!r}")
        super().__init__()
        self.batch_first = batch_first
        self.rnn = nn.GRU(n_features, hidden, batch_first=batch_first)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Map sequences to logits ``(batch, n_classes)``, read from the last time step."""
        out, _ = self.rnn(x)
        last = out[:, -1] if self.batch_first else out[-1]
        return self.head(last)


class TinyTransformer(nn.Module):
    """A tiny decoder-only (GPT-style) language model.

    Token embedding plus a learned position embedding, ``n_layers`` of
    ``nn.TransformerEncoderLayer`` with a causal mask (position ``t`` sees only
    positions ``<= t``), then a linear projection to the vocabulary. Dropout
    is off, so a forward pass is deterministic in train mode too.
    Input token ids, int64 ``(batch, seq_len)`` with ``seq_len <= max_len`` ->
    logits ``(batch, seq_len, vocab_size)``.

    Args:
        vocab_size: number of distinct tokens.
        d_model: width of the embeddings and of the transformer layers.
        n_heads: attention heads per layer; must divide ``d_model``.
        n_layers: number of transformer layers.
        max_len: longest sequence the position embedding covers.
    """

    def __init__(
        self,
        vocab_size: int = 1000,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        max_len: int = 64,
    ) -> None:
        vocab_size, d_model = whole("vocab_size", vocab_size), whole("d_model", d_model)
        n_heads, n_layers = whole("n_heads", n_heads), whole("n_layers", n_layers)
        max_len = whole("max_len", max_len)
        if d_model % n_heads:
            raise ValueError(
                f"n_heads ({n_heads}) must divide d_model ({d_model}), e.g. d_model=64, n_heads=4"
            )
        super().__init__()
        self.max_len = max_len
        self.token_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        """Map token ids ``(batch, seq_len)`` to next-token logits ``(batch, seq_len, vocab_size)``."""
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError("tokens must be an integer tensor of token ids, shape (batch, seq_len)")
        seq_len = tokens.shape[1]
        if seq_len > self.max_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_len {self.max_len}")
        positions = torch.arange(seq_len, device=tokens.device)
        x = self.token_emb(tokens) + self.pos_emb(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(seq_len, device=tokens.device)
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.head(x)


class LargeOutputModel(nn.Module):
    """A tiny body with a vocabulary-sized output layer: small inputs, huge outputs.

    ``Linear(in_features, hidden), ReLU, Linear(hidden, vocab_size)``. Each
    sample's output is ``vocab_size`` logits, i.e. ``vocab_size * 4`` bytes in
    fp32: 128,000 B (125 KiB) per sample with the defaults, so a batch of 256
    gives 32.8 MB of logits from a 64-value (256 B) input per sample.

    It shows why ``nn.DataParallel``'s first GPU needs more memory than the
    others: every replica's outputs are gathered onto it (and the loss and its
    gradient are computed there), so that GPU holds the whole batch's logits.

    Args:
        in_features: size of each input vector.
        hidden: width of the hidden layer.
        vocab_size: size of each output vector.
    """

    def __init__(self, in_features: int = 64, hidden: int = 128, vocab_size: int = 32_000) -> None:
        in_features, hidden = whole("in_features", in_features), whole("hidden", hidden)
        vocab_size = whole("vocab_size", vocab_size)
        super().__init__()
        self.vocab_size = vocab_size
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        """Map inputs ``(batch, in_features)`` to logits ``(batch, vocab_size)``."""
        return self.head(self.body(x))

    def output_bytes_per_sample(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of output for one sample: ``vocab_size * dtype.itemsize`` (``vocab_size * 4`` in fp32)."""
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype such as torch.float16, not {dtype!r}")
        return self.vocab_size * dtype.itemsize


def count_parameters(model: nn.Module) -> int:
    """Return the number of parameter values (elements) in ``model``, trainable or not."""
    return sum(p.numel() for p in _module(model).parameters())


def parameter_bytes(model: nn.Module) -> int:
    """Return the memory the parameters of ``model`` take, in bytes (``numel * element_size``).

    Gradients and optimizer state come on top: with Adam in fp32, training
    needs about four times this (weights, gradients, two moment buffers).
    """
    return sum(p.numel() * p.element_size() for p in _module(model).parameters())
