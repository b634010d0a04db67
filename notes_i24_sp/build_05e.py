# ruff: noqa
"""Builds notebooks/05e_sequence_and_context_parallel.ipynb from the cells below (run from the repo root)."""
import json
import sys

sys.path.insert(0, ".")
from mgpu_helpers.course import install_cell  # noqa: E402

NB = "notebooks/05e_sequence_and_context_parallel.ipynb"
URL = "https://github.com/mgpu-course/mgpu-course/blob/main/" + NB
cells = []


def md(text, slide="-"):
    cells.append({"cell_type": "markdown", "metadata": {"slideshow": {"slide_type": slide}}, "source": text.strip("\n")})


def code(text, tag=None):
    meta = {"slideshow": {"slide_type": "-"}}
    if tag:
        meta["tags"] = [tag]
    cells.append({"cell_type": "code", "execution_count": None, "metadata": meta, "outputs": [],
                  "source": text.strip("\n")})


md(f"""
# 05e · Sequence and context parallelism

[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/mgpu-course/mgpu-course/blob/main/{NB}) [![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)](https://kaggle.com/kernels/welcome?src={URL})

Tensor parallelism (02c) splits the weights of the linear layers, but every rank still holds the
**whole sequence** of activations in the parts of a transformer block that are not matrix products: the
LayerNorm, the dropout, the residual add. Long contexts make those activations, and the attention scores,
the largest thing in memory. This notebook splits the **sequence** instead: first inside a TP group
(Megatron's *sequence parallelism*), then across ranks that each hold a block of the sequence through
attention itself (*context parallelism*, by ring attention). Both are built by hand on gloo processes and
checked against the unsplit layer.
""", "slide")

md("""
## Learning objectives

After this notebook you can:

1. run the LayerNorm/dropout region of a TP block on sequence shards, with an **all-gather** before the
   column-parallel layer and a **reduce-scatter** after the row-parallel one, exact against the unsplit
   block and torch's `SequenceParallel` styles (exercise 05e.1), and say why it costs no extra bytes;
2. compute attention over blocks of keys with an **online softmax**, and pass key/value blocks around a
   **ring** of ranks so that no rank holds the whole sequence's keys and values (exercise 05e.2, causal);
3. count what ring attention keeps per rank, and read the planner's activation memory with SP and CP.
""", "slide")

md("""
### Hardware note

| on this hardware | what this notebook does |
|---|---|
| CPU only | 2 ranks (section 1) and 3 ranks (section 3), real processes over **gloo**, float64 |
| 1 GPU (e.g. Colab) | the same, on the CPU: the lesson is the data layout, not speed |
| N GPUs (2 or more) | the same, on the CPU; Going deeper says what torch's own context parallelism needs (CUDA) |

Grading 05e.1 and 05e.2 takes a few seconds each.
""", "subslide")

code(install_cell(""))

code("""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from mgpu_helpers.collectives import CollectiveSpy, ring_bytes_sent
from mgpu_helpers.exercises import grade
from mgpu_helpers.labels import estimated
from mgpu_helpers.launching import launch
from mgpu_helpers.planner import GIB, LLAMA_8B, Workload, activation_bytes, plan_all

T, B, S, H, P_DROP = 2, 2, 8, 16, 0.1  # TP ranks, batch, sequence length, hidden size, dropout rate
class Block(nn.Module):
    \"\"\"A transformer block's MLP half: x + dropout(fc2(gelu(fc1(norm(x))))).\"\"\"
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same weights in every process
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(H), nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
    def forward(self, x, keep):  # keep: the dropout mask (1 = kept) for the tokens in x
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)))) * keep / (1 - P_DROP)
gen = torch.Generator().manual_seed(1)
x = torch.randn(B, S, H, dtype=torch.float64, generator=gen)
dy = torch.randn(B, S, H, dtype=torch.float64, generator=gen)  # the gradient from the layers above
keep = (torch.rand(B, S, H, dtype=torch.float64, generator=gen) > P_DROP).double()  # one mask, drawn once
block, x_ref = Block().double(), x.clone().requires_grad_()
y_ref = block(x_ref, keep)
y_ref.backward(dy)  # the unsplit block: what every version must give
def seq_shard(t):  # this rank's slice of the sequence (dimension 1)
    return t.chunk(dist.get_world_size(), dim=1)[dist.get_rank()]
def close(a, b):
    return torch.allclose(a, b, rtol=1e-12, atol=1e-12)
""", "nbval-ignore-output")

md("""
## 1. Sequence parallelism: split the sequence where TP repeats work

In 02c's Megatron MLP every rank feeds the **whole** input to its slice of `fc1` and ends with an
all-reduce that gives every rank the whole output. LayerNorm, dropout and the residual add then run
identically on every rank, on all `B·S·H` activations. They act on each token alone, so each rank can
do them for **its own S/T tokens** only (*sequence parallelism*, SP, Korthikanti et al. 2022):

* **all-gather along the sequence** before the column-parallel `fc1`, which needs every token;
* **reduce-scatter along the sequence** after the row-parallel `fc2`: add the partial sums, as the
  all-reduce did, but keep only this rank's tokens.

A ring all-reduce *is* a reduce-scatter followed by an all-gather (01c), so the bytes stay the same.
Dropout: one mask for all `(B, S, H)` is drawn once and each rank uses its sequence slice, so the
results compare exactly with the unsplit block (real SP draws each rank's mask from its own random
stream). Forward only here — the exercise adds the backward:
""", "slide")

code("""
def tp_and_sp(rank, world_size):
    blk = Block().double()
    w1, b1 = blk.fc1.weight.chunk(world_size, 0)[rank], blk.fc1.bias.chunk(world_size, 0)[rank]  # column-parallel
    w2, b2 = blk.fc2.weight.chunk(world_size, 1)[rank], blk.fc2.bias  # row-parallel (bias added once, after the sum)
    with torch.no_grad(), CollectiveSpy() as tp:  # 02c: every rank holds all S tokens
        z = F.linear(F.gelu(F.linear(blk.norm(x), w1, b1)), w2)  # partial sums, (B, S, H)
        dist.all_reduce(z)
        y_tp = x + (z + b2) * keep / (1 - P_DROP)
    with torch.no_grad(), CollectiveSpy() as sp:  # SP: norm, dropout, residual on this rank's S/T tokens
        xs = seq_shard(x)
        n = blk.norm(xs)  # (B, S/T, H)
        parts = [torch.empty_like(n) for _ in range(world_size)]
        dist.all_gather(parts, n.contiguous())  # every rank's tokens ...
        z = F.linear(F.gelu(F.linear(torch.cat(parts, dim=1), w1, b1)), w2)  # ... through fc1, fc2: (B, S, H)
        zs = torch.empty_like(xs)
        dist.reduce_scatter(zs, [c.contiguous() for c in z.chunk(world_size, dim=1)])  # sum, keep my tokens
        y_sp = xs + (zs + b2) * seq_shard(keep) / (1 - P_DROP)
    return y_tp, y_sp, tuple(n.shape), tp.calls, sp.calls
runs = launch(tp_and_sp, T)
for rank, (y_tp, y_sp, norm_shape, tp_calls, sp_calls) in enumerate(runs):
    assert close(y_tp, y_ref) and close(y_sp, y_ref.chunk(T, dim=1)[rank])
print("TP and TP+SP forward == the unsplit block, to 1e-12; SP's norm input per rank:", runs[0][2])
act = B * S * H * 8  # one (B, S, H) float64 activation, bytes
print(f"norm-region activation per rank: without SP {act:,} B, with SP {act // T:,} B (1/T)")
for name, calls in (("TP", runs[0][3]), ("TP+SP", runs[0][4])):
    sent = sum(ring_bytes_sent(c.op, c.nbytes, T) for c in calls)
    print(f"{name:6s} forward: {[(c.op, c.nbytes) for c in calls]} -> each rank sends {sent:,.0f} B (ring)")
assert sum(ring_bytes_sent(c.op, c.nbytes, T) for c in runs[0][4]) == ring_bytes_sent("all_reduce", act, T)
""", "nbval-check-output")

md("""
Each rank's LayerNorm saw `(B, S/T, H)`, and SP's all-gather plus reduce-scatter sent exactly what TP's
one all-reduce sent. Backward mirrors the forward: the gradient of an all-gather is a reduce-scatter
and the gradient of a reduce-scatter is an all-gather. One more difference: each rank's LayerNorm now
sees only its tokens, so the gradients of its weight and bias (and of `fc2`'s bias, added after the
reduce-scatter) are **partial sums** — the TP ranks must add them before the optimizer step.

**The real engine.** torch's tensor-parallel styles have this layout (since torch 2.2, so also on
Colab's 2.11): `SequenceParallel()` runs a module on the sequence shard (`Shard(1)`),
`ColwiseParallel(input_layouts=Shard(1))` all-gathers its input, and
`RowwiseParallel(output_layouts=Shard(1))` reduce-scatters its output. Forward and backward, against
the unsplit block:
""")

code("""
def torch_sp(rank, world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {"norm": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1))}
    blk = parallelize_module(Block().double(), mesh, plan)
    xs = seq_shard(x).clone().requires_grad_()
    with CollectiveSpy() as fwd:
        y = blk(xs, seq_shard(keep))
    with CollectiveSpy() as bwd:
        y.backward(seq_shard(dy))
    grads = {name: p.grad.full_tensor() for name, p in blk.named_parameters()}  # LayerNorm's: Partial -> summed
    return y, xs.grad, grads, [c.op for c in fwd.calls], [c.op for c in bwd.calls], blk.norm.weight.grad.placements
for rank, (y, x_grad, grads, fwd, bwd, norm_grad) in enumerate(launch(torch_sp, T)):
    assert close(y, y_ref.chunk(T, dim=1)[rank]) and close(x_grad, x_ref.grad.chunk(T, dim=1)[rank])
    assert all(close(g, p.grad) for (_, g), p in zip(grads.items(), block.parameters(), strict=True))
print("torch's SequenceParallel + Colwise/Rowwise(Shard(1)) == the unsplit block: output, input and weight gradients")
print("forward:", fwd, " backward:", bwd, " LayerNorm weight's gradient:", norm_grad)
""", "nbval-check-output")

md("""
torch keeps LayerNorm's gradient as a `Partial(sum)` DTensor — the partial sums named above — and adds
them only when asked (`full_tensor()`, or the optimizer's redistribution).

SP leaves one activation whole on every rank: the attention scores, `5·a·s²·b` bytes per layer when
stored (05d's formula, `a` heads). They grow with the **square** of the sequence, and SP does not split
the sequence inside attention. Context parallelism does.
""")

md("""
## 2. Attention one block of keys at a time: the online softmax

Attention for queries `Q` (`s × d`) over keys `K` and values `V` is `softmax(Q Kᵀ/√d) V`. Each row of the
softmax divides by a sum over **all** keys, so it seems to need every key at once. It does not: keep, for
each query, a running maximum `m` (for numerical safety), a running sum `den` (the softmax's denominator) of `exp(score − m)`, and a
running weighted sum `o` of values. When a new block of scores arrives with a larger maximum, multiply
what was summed so far by `exp(m_old − m_new)` (**rescaling**), then add the new block. At the end
`o / den` is the softmax-weighted sum. This is the *online softmax* of FlashAttention:
""", "slide")

code("""
s, d, CP = 12, 8, 3  # sequence length, head size, context-parallel ranks (each holds s / CP = 4 tokens)
gen = torch.Generator().manual_seed(3)
q, k, v = (torch.randn(s, d, dtype=torch.float64, generator=gen) for _ in range(3))
full = F.scaled_dot_product_attention(q, k, v)  # softmax(q kᵀ / √d) v over all s keys
def merge(o, m, den, scores, v_blk):
    \"\"\"Fold one block of scores (queries × its keys) and its values into the running o, m, den.\"\"\"
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new)
    alpha = torch.exp(m - m_new)  # rescales everything summed with the old maximum
    return o * alpha + p @ v_blk, m_new, den * alpha + p.sum(dim=-1, keepdim=True)
def start(q):  # o = 0, m = -inf, den = 0 for each query
    return torch.zeros_like(q), torch.full((len(q), 1), -torch.inf, dtype=q.dtype), torch.zeros(len(q), 1, dtype=q.dtype)
o, m, den = start(q)
for k_blk, v_blk in zip(k.chunk(CP), v.chunk(CP)):
    o, m, den = merge(o, m, den, q @ k_blk.T / d**0.5, v_blk)
assert close(o / den, full)
no_rescale = sum(F.softmax(q @ kb.T / d**0.5, dim=-1) @ vb for kb, vb in zip(k.chunk(CP), v.chunk(CP))) / CP
print(f"online softmax over {CP} key blocks == full attention, to 1e-12; averaging per-block softmaxes "
      f"instead is off by {(no_rescale - full).abs().max():.2f}")
""", "nbval-check-output")

md("""
## 3. Ring attention: context parallelism over processes

Context parallelism (CP) gives each of `CP` ranks one block of `s/CP` tokens for the **whole** block,
attention included: its queries, keys and values. Its queries need every rank's keys and values, so
the K/V blocks travel around a **ring**: at each of `CP` steps a rank computes with the block in hand,
folds it in with `merge`, and meanwhile sends that block to rank `r+1` and receives the next from
rank `r−1` (`dist.batch_isend_irecv`, asynchronous, so the transfer overlaps the computation). After
`CP` steps every rank has seen every block and never held more than two of them:
""", "slide")

code("""
def ring_attention(q, k, v):
    \"\"\"This rank's blocks of queries, keys and values (s/CP rows each) -> its block of the output.\"\"\"
    rank, cp = dist.get_rank(), dist.get_world_size()
    o, m, den = start(q)
    kv = torch.stack([k, v])  # the block in hand
    for step in range(cp):
        if step < cp - 1:  # pass the block on while computing with it
            incoming = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % cp),
                                           dist.P2POp(dist.irecv, incoming, (rank - 1) % cp)])
        o, m, den = merge(o, m, den, q @ kv[0].T / q.shape[-1] ** 0.5, kv[1])  # block (rank - step) % cp
        if step < cp - 1:
            for req in reqs:
                req.wait()
            kv = incoming
    return o / den
def ring_rank(rank, world_size):
    mine = [t.chunk(world_size)[rank] for t in (q, k, v)]
    with CollectiveSpy() as spy:
        out = ring_attention(*mine)
    return out, spy.bytes("send")
ring = launch(ring_rank, CP)
for rank, (out, sent) in enumerate(ring):
    assert close(out, full.chunk(CP)[rank])
    assert sent == (CP - 1) * 2 * (s // CP) * d * 8  # CP-1 steps, one K and one V block each
print(f"ring attention on {CP} ranks == full attention, to 1e-12; each rank sent {ring[0][1]:,} B "
      f"= {CP - 1} × one (K, V) block")
""", "nbval-check-output")

md("""
**What one rank holds.** Its `s/CP` queries and outputs; two K/V blocks (in hand and arriving),
`2·2·(s/CP)·d` numbers instead of `2·s·d`; one `(s/CP) × (s/CP)` block of scores instead of `s × s`.
Each rank sends `(CP−1)/CP` of all keys and values per attention layer — an all-gather's volume, but in
steps that hide behind the computation of the block in hand.
""")

code("""
for seq, cp in ((8_192, 1), (131_072, 1), (131_072, 8), (131_072, 32)):  # bf16, head size 128
    scores = (seq // cp) ** 2 * 2  # bytes of one head's score block
    kv = (2 if cp > 1 else 1) * 2 * (seq // cp) * 128 * 2  # K and V; in the ring, the block in hand + the next
    print(f"s = {seq:>7,}, CP = {cp:>2}: one head's scores", estimated(scores / 2**20, "MiB", how="(s/cp)² · 2 B"),
          "| K/V held", estimated(kv / 2**20, "MiB", how="2 blocks · 2 · (s/cp) · d · 2 B"))
""", "nbval-check-output")

md("""
**Causal attention.** Token `i` may only look at keys `j ≤ i`. With the sequence split in order, rank
`r`'s queries need no key from a later rank: a block from rank `src > r` is **skipped** (it still
travels on); the rank's own block (`src == r`, the first step) gets the triangular mask (`−inf` above
the diagonal) before `merge`; blocks from earlier ranks are used whole. Rank 0 then computes one block
and rank `CP−1` computes `CP`: the others wait for the last — a **load imbalance**. *Zig-zag* splitting
fixes it: rank `r` holds chunks `r` and `2·CP−1−r` of the sequence, one early and one late, so every
rank does the same work. Exercise 05e.2 asks you for the causal ring.
""")

md("""
## 4. The planner learns context parallelism

05d's planner adds SP with `Workload(sequence_parallel=True)`; it now also has a `cp` degree in the
layout (`Layout(..., cp=2)`, GPUs counted dp·tp·pp·cp; `Workload(context_parallel=True)` lets `plan_all`
try it). CP divides every activation term by `cp`: a rank holds `s/cp` tokens, and where attention
scores are stored they are its `s/cp` queries against all `s` keys, `(s/cp)·s` per head. Each layer
adds the ring's K/V blocks to the bytes sent, and the `cp` ranks of a sequence hold the same weights, so
they synchronise gradients together with the DP ranks. The planner against the figures the Ultra-Scale
Playbook publishes for Llama 8B (its context-parallelism chart, one-GPU panel), then 128k tokens:
""", "slide")

code("""
playbook = {1_024: 4.25, 4_096: 17.0, 16_384: 68.0, 65_536: 272.0, 131_072: 544.0}  # GiB: its CP chart, 1 GPU
for seq, gib in playbook.items():  # Llama 8B, b = 1, 32 layers, selective recomputation (FlashAttention)
    ours = LLAMA_8B.layers * activation_bytes(LLAMA_8B, Workload(seq, recompute="selective")) / GIB
    assert abs(ours - gib) <= 0.005 * gib  # the chart gives 3 significant digits
    print(f"s = {seq:>7,}: planner", estimated(ours, "GiB", how="34·s·b·h × 32 layers"), f"| Playbook {gib} GiB")
long = dict(seq_len=131_072, global_batch=16, recompute="selective", sequence_parallel=True)
for cp in (1, 2, 4):
    act = LLAMA_8B.layers * activation_bytes(LLAMA_8B, Workload(**long), 8, cp) / GIB
    print(f"s = 131,072, TP8 + SP, CP{cp}: activations per GPU", estimated(act, "GiB", how="34·s·b·h/(t·cp)"))
for ctx in (False, True):
    best = plan_all(LLAMA_8B, Workload(**long, context_parallel=ctx), 16)[0]
    print(f"16 GPUs, {'with' if ctx else 'without'} CP: best layout {best.layout.name},",
          f"{best.memory / GIB:.0f} GiB per GPU, fits in 90 % of 80 GiB: {best.fits}")
""", "nbval-check-output")

md("""
At 128k tokens no 16-GPU layout fits without CP: TP stops at a node's 8 GPUs, and a pipeline's first
stage still holds `min(p, m)` micro-batches of activations. CP2 halves what every GPU holds.
""")

md("""
## Summary

* **Sequence parallelism** runs LayerNorm, dropout and the residual add of a TP block on each rank's
  sequence shard; an all-gather before the column-parallel layer and a reduce-scatter after the
  row-parallel one replace the all-reduce: the same bytes, `1/t` of that region's activations. Their
  LayerNorm gradients become partial sums over the TP ranks.
* The **online softmax** folds in one block of keys at a time with a running max and sum, rescaling by
  `exp(m_old − m_new)`; without rescaling the result is wrong.
* **Ring attention** (context parallelism) passes K/V blocks around the ranks: each holds `s/CP` tokens,
  two K/V blocks and an `(s/CP)²` block of scores. Causal masking skips later blocks and masks the
  diagonal one, leaving the last rank the most work (zig-zag fixes it).
""", "slide")

md("""
## Exercises

**Exercise 05e.1 — a trainable sequence-parallel block.** Section 1's SP forward ran under `no_grad`.
Write two `torch.autograd.Function`s — `GatherSeq` (forward: all-gather along dimension 1; backward:
reduce-scatter) and `ScatterSeq` (forward: reduce-scatter along dimension 1; backward: all-gather) — and
with them `sp_block(x, norm, w1, b1, w2, b2, keep)`: `x` is this rank's shard `(b, s/t, h)`, `norm` the
whole LayerNorm, `w1, b1` and `w2` this rank's column- and row-parallel slices, `b2` the whole `fc2`
bias, `keep` this rank's slice of the dropout mask. Return this rank's shard of
`x + fc2(gelu(fc1(norm(x)))) · keep / 0.9`. The grader runs it on 2 ranks with weights and data it
draws and checks the output and every gradient (LayerNorm's and `b2`'s summed over the ranks), that
LayerNorm ran on `(b, s/t, h)`, and one all-gather and one reduce-scatter of `(b, s, h)` each way, with
no all-reduce of an activation.
""", "slide")

code("""
class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, part):  # (b, s/t, h) -> (b, s, h): every rank's tokens, in rank order
        raise NotImplementedError
    @staticmethod
    def backward(ctx, grad):  # (b, s, h) -> (b, s/t, h)
        raise NotImplementedError
class ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):  # (b, s, h) partial sums -> (b, s/t, h): the sum, this rank's tokens
        raise NotImplementedError
    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError
def sp_block(x, norm, w1, b1, w2, b2, keep):
    # your code: norm on the shard, GatherSeq, fc1 slice, gelu, fc2 slice, ScatterSeq, bias, dropout, residual
    raise NotImplementedError
grade("05e.1", sp_block)
""", "nbval-check-output")

md("""
**Exercise 05e.2 — causal ring attention.** Write `causal_ring_attention(q, k, v)`: like section 3's
`ring_attention` (this rank's `(s/CP, d)` blocks in, its output block out; `merge` and `start` from
section 2 may be used), but each query attends only to keys at the same or an earlier position of the
whole sequence. The grader runs it on 3 ranks with data it draws and compares with
`F.scaled_dot_product_attention(..., is_causal=True)` on the whole sequence (float64, 1e-10). It watches
every rank: keys and values may only travel by point-to-point messages of at most one K/V block (no
all-gather), and no tensor the rank makes may span the whole sequence.
""")

code("""
def causal_ring_attention(q, k, v):
    rank, cp = dist.get_rank(), dist.get_world_size()
    # your code: section 3's loop; skip the blocks from later ranks, mask the rank's own block
    raise NotImplementedError
grade("05e.2", causal_ring_attention)
""", "nbval-check-output")

md("""
## Further reading

* V. Korthikanti et al., [Reducing Activation Recomputation in Large Transformer Models](https://arxiv.org/abs/2205.05198) (2022) — sequence parallelism, the activation-memory table the planner uses.
* H. Liu, M. Zaharia, P. Abbeel, [Ring Attention with Blockwise Transformers for Near-Infinite Context](https://arxiv.org/abs/2310.01889) (2023).
* M. Milakov, N. Gimelshein, [Online normalizer calculation for softmax](https://arxiv.org/abs/1805.02867) (2018); T. Dao et al., [FlashAttention](https://arxiv.org/abs/2205.14135) (2022) — the online softmax.
* Hugging Face, [The Ultra-Scale Playbook](https://huggingface.co/spaces/nanotron/ultrascale-playbook) — sections on sequence and context parallelism, with the activation-memory figures checked in section 4.
* PyTorch, [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html) (`SequenceParallel`) and the [context parallel tutorial](https://pytorch.org/tutorials/prototype/context_parallel.html).
""", "slide")

md("""
## Going deeper (optional)

Optional: nothing here is needed for the exercises.

* **torch's own context parallelism.** `torch.distributed.tensor.experimental.context_parallel(mesh,
  buffers=[q, k, v], buffer_seq_dims=[2, 2, 2])` shards the given tensors along the sequence in place and,
  inside the context manager, runs scaled-dot-product attention as a ring over the mesh. It does so only
  for the **CUDA** attention kernels (`aten._scaled_dot_product_flash_attention`, `_efficient_attention`,
  `_cudnn_attention` and their backwards: the ops it has ring versions and sharding rules for, in
  `_context_parallel/_attention.py` and `_sharding_rules.py`, torch 2.13). On a CPU, SDPA calls
  `aten._scaled_dot_product_flash_attention_for_cpu`, and on 2 gloo ranks here it stops with
  `NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a
  sharding strategy registered` — so it needs CUDA tensors and an NCCL mesh, which is why this notebook
  builds the ring by hand. For causal attention it reorders the sequence by default with its
  `_HeadTailLoadBalancer` (when `2·cp` divides the sequence): section 3's zig-zag.
* **What SP saves in a real model** (Korthikanti et al., table 2, used by 05d's planner): per layer,
  activations take `s·b·h·(34 + 5·a·s/h)` bytes without parallelism, `s·b·h·(10 + 24/t + 5·a·s/(h·t))`
  with TP of degree `t` — the 10 is the region every rank repeats (LayerNorm inputs, dropout masks, the
  inputs of the first linear layers) — and `s·b·h/t·(34 + 5·a·s/h)` with TP and SP.
* **Ulysses (all-to-all) sequence parallelism.** DeepSpeed-Ulysses splits the sequence everywhere except
  attention, where an all-to-all trades the sequence split for a split of the attention heads; it needs
  heads divisible by the degree, while ring attention does not.
* **Memory vs speed.** In the ring, each step computes a `(s/CP)²` block while one K/V block travels: the
  transfer hides when `(s/CP)² · d` multiply-adds take longer than sending `2·(s/CP)·d` numbers, i.e. for
  long enough blocks; short sequences over many ranks stop hiding it.
""", "slide")

nb = {"cells": cells, "metadata": {
    "celltoolbar": "Slideshow",
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                      "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                      "pygments_lexer": "ipython3", "version": "3.11.7"}},
    "nbformat": 4, "nbformat_minor": 5}
for i, c in enumerate(nb["cells"]):
    c["id"] = f"05e-{i:02d}"
    src = c["source"]
    lines = src.split("\n")
    c["source"] = [ln + "\n" for ln in lines[:-1]] + [lines[-1]]
with open(NB, "w") as f:
    f.write(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
print("wrote", NB, len(cells), "cells")
