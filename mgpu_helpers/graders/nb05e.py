"""Used by notebook 05e's exercises: a trainable sequence-parallel block (05e.1) and causal ring
attention (05e.2), each run on real gloo processes started with :func:`mgpu_helpers.launching.launch`.

05e.1 calls the student's ``sp_block(x, norm, w1, b1, w2, b2, keep)`` on 2 ranks with weights and data
drawn from a seed chosen at grading time (float64), runs backward, and compares the output shard and the
gradients with one process running the unsplit block. A dispatch mode watches each rank: LayerNorm must
run on the rank's sequence shard, and forward and backward must each make one all-gather and one
reduce-scatter of a whole ``(b, s, h)`` activation and no all-reduce of an activation.

05e.2 calls the student's ``causal_ring_attention(q, k, v)`` on 3 ranks; each rank draws only its own
blocks (the whole sequence exists nowhere in a rank), and the result is compared with causal
``scaled_dot_product_attention`` on the whole sequence. Keys and values may travel only by point-to-point
messages no larger than one (K, V) block, and no tensor a rank makes may span the whole sequence. The
ring must also stream: once a rank has computed with a block it received, it never again touches a block
that arrived earlier (an online softmax merges each block as it comes; keeping blocks for a second pass
makes a rank's memory grow with the ring).
"""

from __future__ import annotations

import re
import secrets
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..collectives import CollectiveSpy, _tensors
from ..exercises import Wrong, exercise
from ._ranks import run_ranks

_P_DROP = 0.1


class _Watch(CollectiveSpy):
    """The course's collective spy, plus the input shapes of LayerNorm and the shapes a rank creates."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_inputs: list[tuple[int, ...]] = []
        self.shapes: list[tuple[str, tuple[int, ...]]] = []
        self.functional: set[str] = set()  # collectives of DTensor and functional collectives (own autograd)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = func.name()
        if name.startswith("_c10d_functional"):
            self.functional.add(name)
        if "layer_norm" in name and "backward" not in name and args and isinstance(args[0], torch.Tensor):
            self.norm_inputs.append(tuple(args[0].shape))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append((name, tuple(t.shape)))
        return out


# --- 05e.1: a trainable sequence-parallel block ------------------------------------------------------


def _block_case(seed: int, b: int, s: int, h: int) -> tuple[Any, ...]:
    torch.manual_seed(seed)
    norm, fc1, fc2 = nn.LayerNorm(h).double(), nn.Linear(h, 4 * h).double(), nn.Linear(4 * h, h).double()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
        norm.bias.normal_(0.0, 0.2)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(b, s, h, dtype=torch.float64, generator=gen)
    dy = torch.randn(b, s, h, dtype=torch.float64, generator=gen)
    keep = (torch.rand(b, s, h, dtype=torch.float64, generator=gen) > _P_DROP).double()
    return norm, fc1, fc2, x, dy, keep


def _sp_rank(rank: int, world: int, fn: Any, seed: int, b: int, s: int, h: int) -> dict[str, Any]:
    norm, fc1, fc2, x, dy, keep = _block_case(seed, b, s, h)

    def mine(t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.detach().chunk(world, dim)[rank].clone().requires_grad_()

    w1, b1, w2 = mine(fc1.weight, 0), mine(fc1.bias, 0), mine(fc2.weight, 1)
    b2 = fc2.bias.detach().clone().requires_grad_()
    xs, dys, ks = mine(x, 1), dy.chunk(world, 1)[rank].clone(), keep.chunk(world, 1)[rank].clone()
    del fc1, fc2, x, dy, keep  # the rank keeps only what a TP+SP rank holds
    with _Watch() as fwd:
        y = fn(xs, norm, w1, b1, w2, b2, ks)
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        raise TypeError("sp_block must return a tensor that autograd can go back through (not detached)")
    with _Watch() as bwd:
        y.backward(dys)
    grads = {
        n: None if t.grad is None else t.grad.detach()
        for n, t in (
            ("x", xs),
            ("w1", w1),
            ("b1", b1),
            ("w2", w2),
            ("b2", b2),
            ("norm.weight", norm.weight),
            ("norm.bias", norm.bias),
        )
    }
    return {
        "y": y.detach(),
        "grads": grads,
        "fwd": [(c.op, c.nbytes) for c in fwd.calls],
        "bwd": [(c.op, c.nbytes) for c in bwd.calls],
        "norm_inputs": fwd.norm_inputs,
        "functional": sorted(fwd.functional | bwd.functional, key=lambda n: ("wrap" in n, n)),
    }


def _output_message(rank: int, world: int, got: Any, want: Any, b2: Any, keep: Any, diff: float) -> str:
    """The ❌ text for a wrong output shard; names the slip it can recognise (b2 summed over the ranks)."""
    summed = want + (world - 1) * b2.detach() * keep / (1 - _P_DROP)  # b2 went into the reduce-scatter
    if torch.allclose(got, summed, rtol=1e-9, atol=1e-10):
        return (
            f"rank {rank}'s output is off by exactly {world - 1} × b2 (masked, / 0.9): b2 went into the "
            f"reduce-scatter on every rank, which summed it {world} times. Add the whole fc2 bias once."
        )
    return (
        f"rank {rank}'s output differs from the unsplit block's by up to {diff:.3g}. Is a term summed "
        "over the ranks that should be added once (the reduce-scatter adds what every rank passes in), or "
        "is a step of x + fc2(gelu(fc1(norm(x)))) · keep / 0.9 missing on the shard?"
    )


def _gradient_message(rank: int, grads: dict[str, Any], wrong: dict[str, bool]) -> str:
    """The ❌ text for wrong gradients, from which of x, w1, b1, w2 are wrong (which backward is at fault)."""
    names = ", ".join(n for n, bad in wrong.items() if bad)
    missing = [n for n in ("w1", "b1", "w2") if grads[n] is None]
    if missing:
        return (
            f"rank {rank}'s {', '.join(missing)} got no gradient: autograd did not go back through the "
            "collectives. dist.all_gather and dist.reduce_scatter write into tensors autograd does not "
            "track; call them inside GatherSeq.forward and ScatterSeq.forward, used through .apply, and "
            "write each backward yourself."
        )
    if wrong["w2"]:
        return (
            f"rank {rank}'s gradients of {names} are wrong, so the gradient that ScatterSeq's backward "
            "hands to fc2 is already wrong. The gradient of a reduce-scatter is an all-gather, and of an "
            "all-gather a reduce-scatter."
        )
    if wrong["x"] and not (wrong["w1"] or wrong["b1"]):
        return (
            f"rank {rank}'s gradient of x is wrong, those of w1, b1 and w2 are right: the gradient going "
            "back from fc1 to LayerNorm is wrong, so look at GatherSeq's backward (the gradient of an "
            "all-gather is a reduce-scatter)."
        )
    return (
        f"rank {rank}'s gradients of {names} are not its slices of the unsplit block's: check what each "
        "backward returns (the gradient of an all-gather is a reduce-scatter, and of a reduce-scatter an "
        "all-gather)."
    )


def _check_comm(phase: str, calls: list[tuple[str, int]], act: int, rank: int) -> None:
    big = [op for op, n in calls if op == "all_reduce" and n >= act // 2]
    if big:
        raise Wrong(
            f"rank {rank}'s {phase} all-reduced a whole activation: sequence parallelism replaces that "
            "all-reduce by an all-gather and a reduce-scatter along the sequence."
        )
    for op in ("all_gather", "reduce_scatter"):
        sizes = [n for o, n in calls if o == op]
        if sizes != [act]:
            raise Wrong(
                f"rank {rank}'s {phase} made {len(sizes)} {op.replace('_', '-')}(s) of "
                f"{sizes} bytes: one of the whole (b, s, h) activation ({act:,} bytes) was expected."
            )


@exercise(
    "05e.1",
    "a trainable sequence-parallel block",
    task="`sp_block(x, norm, w1, b1, w2, b2, keep)`, built on your `GatherSeq` and `ScatterSeq`, returns "
    "this rank's differentiable `(b, s/t, h)` output shard. On 2 gloo ranks, sizes and float64 values drawn "
    "at grading: output and every gradient equal one process's unsplit block; LayerNorm sees the shard; "
    "forward and backward each make one all-gather and one reduce-scatter of `(b, s, h)`, no activation "
    "all-reduce. DTensor's redistribute is refused.",
    hint="GatherSeq.forward all-gathers the shards (dist.all_gather into a list, then torch.cat along "
    "dim 1) and its backward reduce-scatters the gradient's sequence chunks (dist.reduce_scatter); "
    "ScatterSeq is its mirror. In sp_block: norm(x) on the shard, GatherSeq, the fc1 slice with b1, gelu, "
    "the fc2 slice without b2, ScatterSeq, then + b2, the dropout mask / (1 - 0.1) and the residual x.",
    forbid=("parallelize_module", "SequenceParallel"),
)
def grade_sp_block(fn: Any) -> str:
    """2 gloo ranks, sizes and values drawn at grading: output, gradients, LayerNorm's shard, collectives."""
    if not callable(fn):
        raise Wrong(f"pass the function sp_block itself, not {type(fn).__name__}")
    world, seed = 2, 1000 + secrets.randbelow(10**6)
    b, per, h = 2 + secrets.randbelow(2), 3 + secrets.randbelow(3), 8 + 4 * secrets.randbelow(2)
    s = per * world
    ranks = run_ranks(_sp_rank, world, fn, seed, b, s, h)
    norm, fc1, fc2, x, dy, keep = _block_case(seed, b, s, h)
    x.requires_grad_()
    y = x + fc2(F.gelu(fc1(norm(x)))) * keep / (1 - _P_DROP)
    y.backward(dy)
    shards = {
        "x": (x.grad, 1),
        "w1": (fc1.weight.grad, 0),
        "b1": (fc1.bias.grad, 0),
        "w2": (fc2.weight.grad, 1),
    }
    whole = {"b2": fc2.bias.grad, "norm.weight": norm.weight.grad, "norm.bias": norm.bias.grad}
    act = b * s * h * 8
    for rank, out in enumerate(ranks):
        want = y.detach().chunk(world, 1)[rank]
        if out["y"].shape != want.shape:
            raise Wrong(
                f"rank {rank} returned shape {tuple(out['y'].shape)}; its sequence shard is "
                f"{tuple(want.shape)} (b, s/t, h)."
            )
        diff = (out["y"] - want).abs().max().item()
        if not diff < 1e-10:
            raise Wrong(
                _output_message(rank, world, out["y"], want, fc2.bias, keep.chunk(world, 1)[rank], diff)
            )
        wrong = {
            name: out["grads"][name] is None
            or out["grads"][name].shape != full.chunk(world, dim)[rank].shape
            or not torch.allclose(out["grads"][name], full.chunk(world, dim)[rank], rtol=1e-9, atol=1e-10)
            for name, (full, dim) in shards.items()
        }
        if any(wrong.values()):
            raise Wrong(_gradient_message(rank, out["grads"], wrong))
    for name, ref in whole.items():
        got = [r["grads"][name] for r in ranks]
        if any(g is None for g in got):
            raise Wrong(f"{name} got no gradient: use it in sp_block.")
        summed, each = sum(got), all(torch.allclose(g, ref, rtol=1e-9, atol=1e-10) for g in got)
        if not (torch.allclose(summed, ref, rtol=1e-9, atol=1e-10) or each):
            raise Wrong(f"the gradient of {name}, summed over the ranks, is not the unsplit block's.")
    for rank, out in enumerate(ranks):
        shard = (b, per, h)
        if out["functional"]:
            raise Wrong(
                f"rank {rank} ran {out['functional'][0]}: DTensor's redistribute or a functional collective "
                "wrote the backward for you. Write GatherSeq and ScatterSeq with dist.all_gather and "
                "dist.reduce_scatter, and state each backward yourself."
            )
        if not out["norm_inputs"]:
            raise Wrong("no LayerNorm ran in the forward: apply norm(x) (the module) to the shard.")
        if any(sh != shard for sh in out["norm_inputs"]):
            raise Wrong(
                f"rank {rank}'s LayerNorm ran on {out['norm_inputs']}, not on its sequence shard {shard}: "
                "normalise before gathering."
            )
        _check_comm("forward", out["fwd"], act, rank)
        _check_comm("backward", out["bwd"], act, rank)
    return (
        f"2 ranks, (b, s, h) = ({b}, {s}, {h}): output and gradients equal the unsplit block; LayerNorm on "
        f"(b, s/2, h); one all-gather and one reduce-scatter of {act:,} B each way, no all-reduce"
    )


# --- 05e.2: causal ring attention ---------------------------------------------------------------------


def _blocks(seed: int, rank: int, b: int, d: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 16 + rank)
    return [torch.randn(b, d, dtype=torch.float64, generator=gen) for _ in range(3)]


_COPIES = {"clone", "_to_copy", "cat", "stack", "contiguous"}  # ops whose output holds their input's values
_OVERWRITES = {"copy_", "zero_", "fill_"}  # in-place ops that replace a tensor's values without reading them
_SHAPE_ONLY = {"empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros", "new_ones"}


class _RingWatch(_Watch):
    """:class:`_Watch`, plus which received block each tensor holds and the order in which blocks are used.

    A received tensor is numbered by the block it belongs to: bytes received so far // one (K, V) block's
    bytes, + 1 (so K and V sent apart, or a block cut into smaller messages, count as one block). Views share
    their base's storage and copies inherit the number. ``late`` is the first op that used a block after a
    later one had been used: (op, earlier block, later block)."""

    def __init__(self, block_bytes: int) -> None:
        super().__init__()
        self.block_bytes, self.received = block_bytes, 0
        self.held: list[tuple[weakref.ref, int, frozenset[int]]] = []  # (tensor, storage address, blocks)
        self.newest = 0
        self.late: tuple[str, int, int] | None = None

    @staticmethod
    def _address(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr() if t.numel() else 0

    def _blocks_in(self, tensors: list[torch.Tensor]) -> frozenset[int]:
        self.held = [h for h in self.held if h[0]() is not None]  # a freed tensor's address may come back
        addresses = {self._address(t) for t in tensors} - {0}
        return frozenset().union(*(blocks for _, a, blocks in self.held if a in addresses))

    def _mark(self, t: torch.Tensor, blocks: frozenset[int]) -> None:
        address = self._address(t)
        if address:  # a write replaces what every view of that storage holds
            self.held = [h for h in self.held if h[1] != address and h[0]() is not None]
            if blocks:
                self.held.append((weakref.ref(t), address, blocks))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        namespace, _, name = func.name().partition("::")
        name = name.split(".")[0]
        if namespace == "c10d":
            if name.strip("_") == "recv":
                for t in _tensors(args[0]):
                    block = self.received // self.block_bytes + 1
                    self.received += t.numel() * t.element_size()
                    self._mark(t, frozenset({block}))
            return out
        if name in _SHAPE_ONLY:
            return out
        if name in _OVERWRITES:  # the old content is dropped, not used; a copy brings its source's blocks
            used = self._blocks_in(_tensors(args[1:])) if name == "copy_" else frozenset()
            self._mark(args[0], used)
        else:
            used = self._blocks_in(_tensors((args, kwargs)))
            if name in _COPIES:
                for t in _tensors(out):
                    self._mark(t, used)
        if used:
            if self.late is None and min(used) < self.newest:
                self.late = (name, min(used), self.newest)
            self.newest = max(self.newest, *used)
        return out


def _ring_rank(rank: int, world: int, fn: Any, seed: int, b: int, d: int, block_bytes: int) -> dict[str, Any]:
    q, k, v = _blocks(seed, rank, b, d)  # this rank's blocks only: no rank ever has the whole sequence
    with _RingWatch(block_bytes) as watch:
        out = fn(q, k, v)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"causal_ring_attention must return a tensor, not {type(out).__name__}")
    return {
        "out": out.detach(),
        "calls": [(c.op, c.nbytes) for c in watch.calls],
        "shapes": watch.shapes,
        "late": watch.late,
    }


def _nth(block: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(block, f"{block}th")


@exercise(
    "05e.2",
    "causal ring attention",
    task="`causal_ring_attention(q, k, v)` → this rank's block of causal attention over the whole sequence, "
    "from its own `(s/CP, d)` blocks. On 3 gloo ranks, float64 blocks drawn at grading, compared with "
    "causal attention on the whole sequence (1e-10). Each rank is watched: only point-to-point messages of "
    "at most one K/V block, no tensor the size of the whole sequence, no received block used after a later "
    "one. `scaled_dot_product_attention` is refused.",
    hint="section 3's loop with src = (rank - step) % cp: when src > rank, skip merge (but still pass the "
    "block on); when src == rank, set the scores above the diagonal to -inf "
    "(torch.ones(n, n, dtype=torch.bool).triu(1)) before merge; when src < rank, merge the whole block. "
    "merge must rescale o and den by exp(m_old - m_new).",
    forbid=("scaled_dot_product_attention",),
)
def grade_causal_ring(fn: Any) -> str:
    """3 gloo ranks, blocks drawn per rank at grading: output vs causal SDPA, messages, no whole sequence."""
    if not callable(fn):
        raise Wrong(f"pass the function causal_ring_attention itself, not {type(fn).__name__}")
    world, seed = 3, 1000 + secrets.randbelow(10**6)
    b, d = 4 + secrets.randbelow(2), 6 + 2 * secrets.randbelow(2)
    s, block_bytes = world * b, 2 * b * d * 8
    try:
        ranks = run_ranks(_ring_rank, world, fn, seed, b, d, block_bytes)
    except Wrong as exc:  # a rank returned while its neighbours still sent to it or waited on it
        if not re.search(r"Connection (closed|reset) by peer", str(exc)):
            raise
        raise Wrong(
            "a rank left the ring while its neighbours were still sending to it or waiting for its blocks "
            "(gloo: connection closed by peer). Every rank takes part in all CP − 1 passes, sending on "
            "and receiving blocks it no longer computes with."
        ) from None
    for rank, out in enumerate(ranks):
        others = sorted({op for op, _ in out["calls"]} - {"send", "recv"})
        if others:
            raise Wrong(
                f"rank {rank} used {others}: keys and values must travel around the ring by point-to-point "
                "messages (isend/irecv, batch_isend_irecv), one block at a time."
            )
        big = [n for _, n in out["calls"] if n > block_bytes]
        if big:
            raise Wrong(
                f"rank {rank} sent or received {max(big):,} bytes at once: at most one (K, V) block "
                f"({block_bytes:,} bytes) travels per message."
            )
        whole = [
            (op, sh) for op, sh in out["shapes"] if s in sh or (len(sh) and torch.Size(sh).numel() >= s * d)
        ]
        if whole:
            raise Wrong(
                f"rank {rank} made a tensor of shape {whole[0][1]} ({whole[0][0]}), as large as the whole "
                "sequence: a rank of the ring holds only its own block and the one in hand."
            )
    parts = [_blocks(seed, r, b, d) for r in range(world)]
    q, k, v = (torch.cat([p[i] for p in parts]) for i in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for rank, out in enumerate(ranks):
        ref = want.chunk(world)[rank]
        if out["out"].shape != ref.shape:
            raise Wrong(
                f"rank {rank} returned shape {tuple(out['out'].shape)}, not its block's {tuple(ref.shape)}."
            )
        nan_rows = int(out["out"].isnan().any(dim=-1).sum())
        if nan_rows:
            raise Wrong(
                f"rank {rank}'s output has NaN in {nan_rows} of its {len(ref)} rows: those queries had no "
                "allowed key, so den stayed 0 (0 / 0), or every score was −inf. Query i may see every key "
                "j ≤ i, its own position included."
            )
        diff = (out["out"] - ref).abs().max().item()
        if not diff < 1e-10:
            raise Wrong(
                f"rank {rank}'s output differs from causal attention over the whole sequence by up to "
                f"{diff:.3g}."
            )
    for rank, out in enumerate(ranks):
        if out["late"]:
            _, old, new = out["late"]
            raise Wrong(
                f"rank {rank} used the block it received {_nth(old)} after it had already computed "
                f"with the {_nth(new)}: it kept blocks for a second pass, so its memory grows with the ring. "
                "A streaming ring is done with each block before it computes with the next, holding only its "
                "own block and the one in hand however long the ring."
            )
    if not any(op == "send" for op, _ in ranks[-1]["calls"]):
        raise Wrong("the last rank sent nothing: every rank passes its blocks on around the ring.")
    return (
        f"3 ranks, blocks of {b} tokens, head size {d}: equal to causal attention over the whole sequence; "
        f"only point-to-point messages of ≤ {block_bytes:,} B, no whole-sequence tensor on any rank"
    )
