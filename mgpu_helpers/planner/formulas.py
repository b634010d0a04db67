"""Used by notebooks 05d, 05e, 05g and 08b through :mod:`mgpu_helpers.planner`: the planner's model, workload
and layout, and the per-GPU formulas (state, activations, bytes sent per step) — see the package's
docstring for their sources."""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import whole
from ..memory import MemoryPrediction, predict_memory

GB = 10**9  # the Playbook's table counts in 10⁹ bytes; link speeds too
GIB = 2**30  # GPU capacities ("80 GB" ≈ 80 GiB) and the Playbook's charts
#: Share of a GPU's memory that state + activations may use; the rest is for what the formulas leave
#: out: logits, ZeRO-3's gathered weights, the CUDA context, NCCL buffers and allocator fragmentation.
USABLE = 0.9
INTRA_NODE_BW = 450e9  # assumed bytes/s one GPU sends inside a node (NVLink class)
INTER_NODE_BW = 50e9  # assumed bytes/s one GPU sends across nodes (a 400 Gb/s NIC per GPU)
GPU_FLOPS = 400e12  # assumed achieved bf16 FLOP/s per GPU (about 40 % of an H100's peak)
_RECOMPUTE = ("materialised", "selective", "full")


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer: ``layers`` L, ``hidden`` h, ``heads`` a, ``vocab`` v; for Llama-style
    blocks also ``kv_heads`` (grouped-query attention: K and V have ``kv_heads`` heads of ``h/a``
    features) and ``ffn`` (the SwiGLU MLP's width: three ``h × ffn`` matrices). 0 means "as GPT":
    ``kv_heads = heads`` and a 4h MLP of two matrices.

    ``n_params`` is the real count when known (e.g. Meta's model cards); otherwise the Playbook's count
    ``h·v + L·(12h² + 13h) + 2h``.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = 0
    n_params: int | None = None
    kv_heads: int = 0
    ffn: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads"):
            whole(f"Transformer.{name}", getattr(self, name), 1, "32")
        whole("Transformer.vocab", self.vocab, 0, "128256")
        whole("Transformer.kv_heads", self.kv_heads, 0, "8", hint=" (0: as many as heads)")
        whole("Transformer.ffn", self.ffn, 0, "14336", hint=" (0: a GPT MLP of 4·hidden)")
        if self.hidden % self.heads or (self.kv_heads and self.heads % self.kv_heads):
            raise ValueError(
                f"heads={self.heads} must divide hidden={self.hidden}, and kv_heads={self.kv_heads} must "
                "divide heads (each K/V head serves heads / kv_heads query heads)"
            )
        if self.n_params is not None:
            whole("Transformer.n_params", self.n_params, 1, "8 * 10**9")

    @property
    def params(self) -> int:
        """Ψ, the number of parameters."""
        if self.n_params is not None:
            return self.n_params
        h, L = self.hidden, self.layers
        return h * self.vocab + L * (12 * h * h + 13 * h) + 2 * h

    @property
    def layer_params(self) -> int:
        """Parameters of one block: Llama's (``ffn`` given: Q and O ``h²`` each, K and V ``h·kv·h/a``
        each, three ``h × ffn`` MLP matrices, two RMSNorm weights, no biases) or GPT's ``12h² + 13h``."""
        h = self.hidden
        if not self.ffn:
            return 12 * h * h + 13 * h
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        return 2 * h * h + 2 * h * kv + 3 * h * self.ffn + 2 * h

    def only_blocks(self, n: int) -> Transformer:
        """``n`` of this model's blocks and nothing else (no embeddings): what the scale lab's runs
        (notebook 05g, ``mgpu_helpers.scale.dry_run``) build and ask the planner about."""
        n = whole("n", n, 1, "2")
        return Transformer(
            f"{n} blocks of {self.name}",
            n,
            self.hidden,
            self.heads,
            0,
            n * self.layer_params,
            self.kv_heads,
            self.ffn,
        )


# Llama 3.1 shapes (Meta's config.json: GQA with 8 K/V heads, SwiGLU MLP, untied input and output
# embeddings) with the parameter counts of Meta's model cards, 8.03, 70.6 and 405 billion, which the
# Playbook's charts use. The exact counts of these shapes are 8,030,261,248, 70,553,706,496 and
# 405,853,388,800 (``layers·layer_params + 2·hidden·vocab + hidden``; notebook 05g counts them).
LLAMA_8B = Transformer("Llama 3.1 8B", 32, 4096, 32, 128_256, 8_030_000_000, kv_heads=8, ffn=14_336)
LLAMA_70B = Transformer("Llama 3.1 70B", 80, 8192, 64, 128_256, 70_600_000_000, kv_heads=8, ffn=28_672)
LLAMA_405B = Transformer("Llama 3.1 405B", 126, 16384, 128, 128_256, 405_000_000_000, kv_heads=8, ffn=53_248)
PRESETS = {m.name: m for m in (LLAMA_8B, LLAMA_70B, LLAMA_405B)}


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes, and how.

    ``global_batch`` sequences of ``seq_len`` s tokens per step, in micro-batches of ``micro_batch`` b:
    each of the ``dp`` data-parallel ranks runs m = global_batch / (dp·b) micro-batches. ``precision``
    and ``optimizer`` as in :func:`~mgpu_helpers.memory.predict_memory`; ``recompute``:
    ``"materialised"`` (attention scores stored: no recomputation, no FlashAttention), ``"selective"``
    (scores recomputed; FlashAttention/SDPA never store them) or ``"full"``. ``sequence_parallel``:
    Megatron's SP inside each TP group; ``context_parallel``: :func:`plan_all` also tries context-parallel
    degrees ``cp > 1`` (ring attention, ``cp`` dividing ``seq_len``).
    """

    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 64
    precision: str = "mixed"
    optimizer: str = "adam"
    fp32_grad_accumulation: bool = False
    recompute: str = "materialised"
    sequence_parallel: bool = False
    context_parallel: bool = False

    def __post_init__(self) -> None:
        whole("Workload.seq_len", self.seq_len, 1, "4096")
        whole("Workload.micro_batch", self.micro_batch, 1, "1")
        whole("Workload.global_batch", self.global_batch, 1, "64")
        if self.recompute not in _RECOMPUTE:
            raise ValueError(f"recompute must be one of {_RECOMPUTE}, not {self.recompute!r}")

    def n_micro(self, dp: int) -> int:
        """Micro-batches each data-parallel rank runs per step, global_batch / (dp·micro_batch)."""
        per_step = dp * self.micro_batch
        if self.global_batch % per_step:
            raise ValueError(
                f"global_batch={self.global_batch} sequences do not split into dp={dp} ranks × micro_batch="
                f"{self.micro_batch}: pass a dp dividing {self.global_batch // self.micro_batch} or a global "
                f"batch that is a multiple of {per_step}"
            )
        return self.global_batch // per_step

    @property
    def element_bytes(self) -> int:
        """Bytes of one activation (and, in mixed precision, of one weight or gradient) on the wire."""
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Layout:
    """``dp`` × ``tp`` × ``pp`` × ``cp`` GPUs; ``zero`` the ZeRO stage over the ``dp·cp`` ranks that hold
    the same weights (the context-parallel ranks of a sequence hold the same shard and sync its gradients
    with the data-parallel ranks, as in Megatron-LM)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp"):
            whole(f"Layout.{name}", getattr(self, name), 1, "2")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be 0, 1, 2 or 3, not {self.zero!r}")
        if self.zero and self.dp * self.cp == 1:
            raise ValueError("ZeRO shards over data-parallel ranks: with dp=1 pass zero=0")

    @property
    def n_gpus(self) -> int:
        """GPUs the layout uses, dp·tp·pp·cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def name(self) -> str:
        """E.g. ``"TP8 × CP2 × PP2 × DP4 ZeRO-1"``; ``"1 GPU"`` when nothing is split."""
        zero = f" ZeRO-{self.zero}" if self.zero else ""
        parts = [f"TP{self.tp}"] * (self.tp > 1)
        parts += [f"CP{self.cp}" + (zero if self.dp == 1 else "")] * (self.cp > 1)  # ZeRO over the CP ranks
        parts += [f"PP{self.pp}"] * (self.pp > 1) + [f"DP{self.dp}" + zero] * (self.dp > 1)
        return " × ".join(parts) or "1 GPU"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_DEFAULT_WORK = Workload()  # frozen, so one instance can be every call's default


def state_bytes(n_params: int, layout: Layout, work: Workload = _DEFAULT_WORK) -> MemoryPrediction:
    """Weights, gradients and optimizer state on one GPU: :func:`predict_memory` of the Ψ/(t·p)
    parameters one TP×PP shard holds, ZeRO-sharded over the ``layout.dp·layout.cp`` ranks that hold it."""
    shard = max(1, round(whole("n_params", n_params, 1, "8 * 10**9") / (layout.tp * layout.pp)))
    return predict_memory(
        shard,
        precision=work.precision,
        optimizer=work.optimizer,
        zero_stage=layout.zero,
        dp_size=layout.dp * layout.cp,
        fp32_grad_accumulation=work.fp32_grad_accumulation,
    )


def activation_bytes(model: Transformer, work: Workload, tp: int = 1, cp: int = 1) -> int:
    """Activation bytes of ONE layer and ONE micro-batch on one GPU of a ``tp``-way TP group and a
    ``cp``-way context-parallel group (16-bit). Context parallelism divides every term by ``cp``: a rank
    holds ``s/cp`` tokens, and its stored attention scores are its ``s/cp`` queries against all ``s`` keys
    (``5·a·(s/cp)·s·b``, the blocks of the ring, when they are materialised)."""
    if work.seq_len % whole("cp", cp, 1, "2"):
        raise ValueError(f"cp={cp} must divide seq_len={work.seq_len}: each rank holds seq_len / cp tokens")
    s, b, h, a = work.seq_len, work.micro_batch, model.hidden, model.heads
    if work.recompute == "full":  # /t with sequence parallelism: the course's extension of table 2
        per = 2.0 / (tp if work.sequence_parallel else 1)
    else:
        attention = 0.0 if work.recompute == "selective" else 5 * a * s / (h * tp)
        per = (34 / tp if work.sequence_parallel else 10 + 24 / tp) + attention
    return round(s * b * h * per / cp)


def communication_bytes(model: Transformer, work: Workload, layout: Layout) -> dict[str, int]:
    """Bytes one GPU sends per optimizer step, by kind: ``{"DP": …, "TP": …, "PP": …}``, and ``"CP"``
    when ``layout.cp > 1`` (the ring's K/V blocks: forward ``(cp−1)`` blocks of K and V of ``s/cp``
    tokens and ``h/t`` features; backward twice that, K/V again and their gradients; full recomputation
    repeats the forward). With CP, TP's and PP's activations hold ``s/cp`` tokens and the gradients are
    synchronised over the ``dp·cp`` ranks holding the same weights."""
    d, t, p, c = layout.dp, layout.tp, layout.pp, layout.cp
    m, e, full = work.n_micro(layout.dp), work.element_bytes, work.recompute == "full"
    shard, ring = model.params / (t * p), (d * c - 1) / (d * c)  # shard: the parameters a DP group syncs
    dp = {0: 2 * ring, 1: 2 * ring, 2: (m + 1) * ring, 3: 3 * m * ring}[layout.zero] * shard * e
    bsh = work.micro_batch * work.seq_len * model.hidden * e / c  # one activation of this rank's tokens
    all_reduces = 4 + 2 * full
    tp_bytes = all_reduces * 2 * (t - 1) / t * bsh * (model.layers // p) * m
    pp_bytes = (0 if p == 1 else 1 if p == 2 else 2) * bsh * m  # a middle stage sends both ways
    out = {"DP": round(dp), "TP": round(tp_bytes), "PP": round(pp_bytes)}
    if c > 1:  # K and V blocks of bsh/t bytes each, (cp-1) steps; ×3 forward + backward, ×4 with full
        out["CP"] = round((3 + full) * (c - 1) * 2 * bsh / t * (model.layers // p) * m)
    return out
