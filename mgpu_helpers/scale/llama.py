"""Used by notebook 05g (and its graders): Llama 3's transformer block, the model the
scale lab shards, and the tensor-parallel plan notebook 02c taught, written for it.

A block is RMSNorm → grouped-query attention with rotary position embeddings (RoPE) → residual, then
RMSNorm → SwiGLU MLP → residual; no biases (Meta's ``model.py`` of Llama 3). Its shape comes from a
:class:`mgpu_helpers.planner.Transformer` (``hidden``, ``heads``, ``kv_heads``, ``ffn``), so the planner
and the lab talk about the same model. :class:`LlamaBlocks` holds ``n`` such blocks and no embeddings:
the lab measures blocks and says so where a whole model would not fit.

The attention reads the number of heads from its input (``view(b, s, -1, head_dim)``): under tensor
parallelism each rank's ``wq`` has ``heads / tp`` heads' columns, and the same code runs on the shard.
:func:`context_parallel` gives the attention a context-parallel group: each rank then holds one chunk of
the sequence, and the attention all-gathers the keys and values (Llama 3's CP, 05g's Going deeper).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import whole
from ..collectives import all_gather_autograd
from ..planner.formulas import Transformer

__all__ = [
    "Attention", "Block", "FeedForward", "LlamaBlocks", "RMSNorm", "context_parallel", "rope_tables",
    "tp_plan",
]  # fmt: skip

ROPE_THETA = 500_000.0  # Llama 3's rotary base (config.json: rope_theta)


class RMSNorm(nn.Module):
    """``x / rms(x) · weight`` over the last dimension (Llama's normalisation, no bias, no mean)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(seq_len: int, head_dim: int, device: Any = None, start: int = 0) -> tuple[Tensor, Tensor]:
    """RoPE's cos and sin tables for positions ``start … start + seq_len − 1``, ``(seq_len, head_dim)``
    each, fp32."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    positions = torch.arange(start, start + seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos[:, None, :] + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin[:, None, :]


class Attention(nn.Module):
    """Causal grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value heads.

    With a context-parallel group (``cp_group``, set by :func:`context_parallel`) the input is rank
    ``r``'s chunk of a sequence cut into ``cp`` equal chunks in rank order: its queries sit at positions
    ``r·s … (r+1)·s − 1``, and it attends to the keys and values of every chunk, all-gathered.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.wq = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.cp_group: dist.ProcessGroup | None = None

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        r, cp = (0, 1) if self.cp_group is None else (dist.get_rank(self.cp_group), self.cp_group.size())
        cos, sin = rope_tables(s, self.head_dim, x.device, start=r * s)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)  # each token rotated by its place in the sequence
        if cp > 1:  # every chunk's keys and values, in rank order: (b, cp·s, kv heads, head_dim)
            k, v = (all_gather_autograd(t, 1, self.cp_group) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, local heads, tokens, head_dim)
        gqa = q.shape[1] != k.shape[1]
        if cp == 1:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # causal across chunks: the query at position r·s + i sees the keys at positions <= r·s + i
            keys = torch.arange(cp * s, device=x.device)
            queries = torch.arange(r * s, (r + 1) * s, device=x.device)
            mask = keys[None, :] <= queries[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) · w3 x)``, three ``hidden × ffn`` matrices."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """One Llama 3 block: pre-norm attention and pre-norm SwiGLU, each with a residual connection."""

    def __init__(self, shape: Transformer) -> None:
        super().__init__()
        if not isinstance(shape, Transformer) or not shape.ffn:
            raise TypeError(
                "shape must be a planner Transformer with kv_heads and ffn, such as "
                f"mgpu_helpers.planner.LLAMA_8B, not {shape!r}"
            )
        h = shape.hidden
        self.attention_norm = RMSNorm(h)
        self.attention = Attention(h, shape.heads, shape.kv_heads or shape.heads)
        self.ffn_norm = RMSNorm(h)
        self.feed_forward = FeedForward(h, shape.ffn)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class LlamaBlocks(nn.Module):
    """``n_blocks`` Llama blocks of ``shape`` (no embeddings, no output layer): ``(b, s, h) → (b, s, h)``."""

    def __init__(self, shape: Transformer, n_blocks: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(shape) for _ in range(whole("n_blocks", n_blocks, 1, "2")))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Fill every parameter (a DTensor's local shard where sharded): norms 1, matrices N(0, 0.02²)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02, generator=g)


def context_parallel(model: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """Make every :class:`Attention` in ``model`` context-parallel over ``group`` (returns ``model``).

    This is Llama 3's context parallelism (Llama 3 paper, arXiv 2407.21783, §3.3.2): each of the group's
    ``cp`` ranks holds one chunk of the sequence, all-gathers the keys and values of every chunk, and
    computes attention for its own queries; the backward reduce-scatters the keys' and values' gradients.
    It sends the keys and values once, not once per step of a ring as ring attention does (notebook 05e):
    cheap under grouped-query attention, whose keys and values are ``kv_heads / heads`` of the hidden
    size. Unlike Llama 3 this does not balance the causal work (its rank ``r`` takes chunks ``r`` and
    ``2·cp − 1 − r``): here the last rank's queries see the most keys. The sequence's chunks are the
    ranks' inputs: feed rank ``r`` tokens ``r·s … (r+1)·s − 1``."""
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    if not attentions:
        raise TypeError(
            f"{type(model).__name__} has no mgpu_helpers.scale.llama.Attention to make context-parallel"
        )
    for attention in attentions:
        attention.cp_group = group
    return model


def tp_plan(sequence_parallel: bool = False) -> dict[str, Any]:
    """Megatron's split of a block for ``parallelize_module``: Q, K, V and the MLP's ``w1``/``w3`` by
    columns (each rank its heads, its slice of ``ffn``), ``wo`` and ``w2`` by rows (a partial sum,
    all-reduced). The attention and the MLP each take their input as ONE replicated DTensor
    (``PrepareModuleInput``), so the backward all-reduces its gradient once per sub-layer, not once per
    projection (notebook 05g measures both). With ``sequence_parallel`` the norms and residuals run on
    ``s / tp`` tokens (``Shard(1)``) and the all-reduces become an all-gather before and a reduce-scatter
    after."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    out = Shard(1) if sequence_parallel else Replicate()
    one_input = {"input_layouts": (out,), "desired_input_layouts": (Replicate(),)}
    plan: dict[str, Any] = {
        "attention": PrepareModuleInput(**one_input),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out),
        "feed_forward": PrepareModuleInput(**one_input),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=out),
    }
    if sequence_parallel:
        plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()}
    return plan
