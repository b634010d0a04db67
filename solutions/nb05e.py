"""Reference solutions of notebook 05e's exercises and typical wrong attempts
(run by tests/test_solutions.py; shortcuts by tests/test_shortcuts.py)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_helpers.collectives import all_gather_single, reduce_scatter_single

P_DROP = 0.1


# --- 05e.1: a trainable sequence-parallel block --------------------------------------------------------


class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, part):  # (b, s/t, h) -> (b, s, h)
        parts = [torch.empty_like(part) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, part.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):  # each rank holds a partial gradient of the whole sequence: sum, keep mine
        out = torch.empty_like(grad.chunk(dist.get_world_size(), dim=1)[0])
        dist.reduce_scatter(out, [c.contiguous() for c in grad.chunk(dist.get_world_size(), dim=1)])
        return out


class ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):  # (b, s, h) partial sums -> (b, s/t, h)
        chunks = [c.contiguous() for c in partial.chunk(dist.get_world_size(), dim=1)]
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks)
        return out

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.cat(parts, dim=1)


def _sp_block_with(gather, scatter):
    def sp_block(x, norm, w1, b1, w2, b2, keep):
        z = F.linear(F.gelu(F.linear(gather.apply(norm(x)), w1, b1)), w2)
        return x + (scatter.apply(z) + b2) * keep / (1 - P_DROP)

    return sp_block


sp_block = _sp_block_with(GatherSeq, ScatterSeq)


class GatherSeqSlicesBack(GatherSeq):
    """Typical slip: the backward of the all-gather keeps this rank's slice without adding the other ranks'
    partial gradients (it should reduce-scatter)."""

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()


sp_block_slices_back = _sp_block_with(GatherSeqSlicesBack, ScatterSeq)


# shortcuts: the right numbers without the sequence-parallel layout


def sp_block_norm_on_whole_sequence(x, norm, w1, b1, w2, b2, keep):
    """The right collectives, but the gather comes first: every rank normalises all s tokens."""
    z = F.linear(F.gelu(F.linear(norm(GatherSeq.apply(x)), w1, b1)), w2)
    return x + (ScatterSeq.apply(z) + b2) * keep / (1 - P_DROP)


class _AllReduceThenSlice(torch.autograd.Function):
    """Forward: 02c's all-reduce of the whole output, then this rank's tokens; backward: all-gather."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.cat(parts, dim=1)


def sp_block_all_reduce_then_slice(x, norm, w1, b1, w2, b2, keep):
    """LayerNorm on the shard and the all-gather, but an all-reduce of the whole output then a slice
    instead of the reduce-scatter."""
    z = F.linear(F.gelu(F.linear(GatherSeq.apply(norm(x)), w1, b1)), w2)
    return x + (_AllReduceThenSlice.apply(z) + b2) * keep / (1 - P_DROP)


def sp_block_dtensor_redistribute(x, norm, w1, b1, w2, b2, keep):
    """No autograd.Function written: DTensor's redistribute does the all-gather and the reduce-scatter,
    and its own backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    n = DTensor.from_local(norm(x), mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
    z = F.linear(F.gelu(F.linear(n.to_local(grad_placements=[Partial()]), w1, b1)), w2)
    zs = DTensor.from_local(z, mesh, [Partial()]).redistribute(mesh, [Shard(1)]).to_local()
    return x + (zs + b2) * keep / (1 - P_DROP)


class GatherSeqSingle(torch.autograd.Function):
    """Also correct: one-tensor collectives on a (s, b, h) view instead of lists."""

    @staticmethod
    def forward(ctx, part):
        t = part.transpose(0, 1).contiguous()
        out = torch.empty((dist.get_world_size() * t.shape[0], *t.shape[1:]), dtype=t.dtype)
        all_gather_single(out, t)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        g = grad.transpose(0, 1).contiguous()
        out = torch.empty((g.shape[0] // dist.get_world_size(), *g.shape[1:]), dtype=g.dtype)
        reduce_scatter_single(out, g)
        return out.transpose(0, 1)


class ScatterSeqSingle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        return GatherSeqSingle.backward(ctx, partial)

    @staticmethod
    def backward(ctx, grad):
        return GatherSeqSingle.forward(ctx, grad)


sp_block_single_tensor = _sp_block_with(GatherSeqSingle, ScatterSeqSingle)


# --- 05e.2: causal ring attention ----------------------------------------------------------------------


def merge(o, m, den, scores, v_blk):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new)
    alpha = torch.exp(m - m_new)
    return o * alpha + p @ v_blk, m_new, den * alpha + p.sum(dim=-1, keepdim=True)


def merge_no_rescale(o, m, den, scores, v_blk):
    """Typical slip: each block is exponentiated with its own max and added without rescaling."""
    m_blk = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - m_blk)
    return o + p @ v_blk, torch.maximum(m, m_blk), den + p.sum(dim=-1, keepdim=True)


def start(q):
    return (
        torch.zeros_like(q),
        torch.full((len(q), 1), -torch.inf, dtype=q.dtype),
        torch.zeros(len(q), 1, dtype=q.dtype),
    )


def _causal_ring(q, k, v, merge_fn):
    rank, cp = dist.get_rank(), dist.get_world_size()
    o, m, den = start(q)
    kv = torch.stack([k, v])
    for step in range(cp):
        src = (rank - step) % cp
        if step < cp - 1:
            incoming = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, kv, (rank + 1) % cp),
                    dist.P2POp(dist.irecv, incoming, (rank - 1) % cp),
                ]
            )
        if src <= rank:  # later ranks' keys are in the future of every query here
            scores = q @ kv[0].T / q.shape[-1] ** 0.5
            if src == rank:
                scores = scores.masked_fill(torch.ones(len(q), len(q), dtype=torch.bool).triu(1), -torch.inf)
            o, m, den = merge_fn(o, m, den, scores, kv[1])
        if step < cp - 1:
            for req in reqs:
                req.wait()
            kv = incoming
    return o / den


def causal_ring_attention(q, k, v):
    return _causal_ring(q, k, v, merge)


def causal_ring_attention_no_rescale(q, k, v):
    return _causal_ring(q, k, v, merge_no_rescale)


def causal_ring_attention_all_gather(q, k, v):
    """All-gather every rank's keys and values, then causal attention over the whole sequence."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(cp)], [torch.empty_like(v) for _ in range(cp)]
    dist.all_gather(ks, k)
    dist.all_gather(vs, v)
    keys, values = torch.cat(ks), torch.cat(vs)
    scores = q @ keys.T / q.shape[-1] ** 0.5
    rows = torch.arange(len(q)).unsqueeze(1) + rank * len(q)
    scores = scores.masked_fill(torch.arange(len(keys)) > rows, -torch.inf)
    return torch.softmax(scores, dim=-1) @ values


def causal_ring_attention_collects_blocks(q, k, v):
    """The ring's messages, but every block kept; then causal attention over the concatenated sequence."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    kv, held = torch.stack([k, v]), {rank: torch.stack([k, v])}
    for step in range(1, cp):
        incoming = torch.empty_like(kv)
        for req in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, kv, (rank + 1) % cp), dist.P2POp(dist.irecv, incoming, (rank - 1) % cp)]
        ):
            req.wait()
        kv = incoming
        held[(rank - step) % cp] = kv
    keys = torch.cat([held[r][0] for r in range(cp)])
    values = torch.cat([held[r][1] for r in range(cp)])
    scores = q @ keys.T / q.shape[-1] ** 0.5
    rows = torch.arange(len(q)).unsqueeze(1) + rank * len(q)
    scores = scores.masked_fill(torch.arange(len(keys)) > rows, -torch.inf)
    return torch.softmax(scores, dim=-1) @ values


def causal_ring_attention_two_pass(q, k, v):
    """The ring's messages and no whole-sequence tensor, but every block is kept in a list and the softmax
    takes two passes over them at the end (its memory grows with the ring, unlike the online softmax)."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    kv, held = torch.stack([k, v]), []
    for step in range(cp):
        if (rank - step) % cp <= rank:
            held.append((kv, (rank - step) % cp == rank))
        if step < cp - 1:
            incoming = torch.empty_like(kv)
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % cp)]
            ops.append(dist.P2POp(dist.irecv, incoming, (rank - 1) % cp))
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            kv = incoming
    scores = []
    for blk, diagonal in held:
        s = q @ blk[0].T / q.shape[-1] ** 0.5
        if diagonal:
            s = s.masked_fill(torch.ones(len(q), len(q), dtype=torch.bool).triu(1), -torch.inf)
        scores.append(s)
    m = torch.stack([s.amax(dim=-1) for s in scores]).amax(dim=0).unsqueeze(-1)
    out, den = torch.zeros_like(q), torch.zeros(len(q), 1, dtype=q.dtype)
    for s, (blk, _) in zip(scores, held, strict=True):
        p = torch.exp(s - m)
        out, den = out + p @ blk[1], den + p.sum(dim=-1, keepdim=True)
    return out / den


def _merge_causal(q, k_blk, v_blk, state, src, rank):
    """The reference's step for the block from rank ``src``, for the variants below: skipped when it
    lies in the future, masked on the diagonal, merged whole otherwise."""
    if src > rank:
        return state
    scores = q @ k_blk.T / q.shape[-1] ** 0.5
    if src == rank:
        scores = scores.masked_fill(torch.ones(len(q), len(q), dtype=torch.bool).triu(1), -torch.inf)
    return merge(*state, scores, v_blk)


def causal_ring_attention_isend_recv(q, k, v):
    """Also correct: isend + blocking recv instead of batch_isend_irecv, K and V as two messages, and the
    block received before it is used (no overlap)."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    o, m, den = start(q)
    for step in range(cp):
        o, m, den = _merge_causal(q, k, v, (o, m, den), (rank - step) % cp, rank)
        if step < cp - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            reqs = [dist.isend(k.contiguous(), (rank + 1) % cp), dist.isend(v.contiguous(), (rank + 1) % cp)]
            dist.recv(k_in, (rank - 1) % cp)
            dist.recv(v_in, (rank - 1) % cp)
            for req in reqs:
                req.wait()
            k, v = k_in, v_in
    return o / den


def causal_ring_attention_persistent_buffers(q, k, v):
    """Also correct: two buffers made once, each block received into spares and copied in (a copy is not a
    late use of the block it overwrites)."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    o, m, den = start(q)
    k_buf, v_buf, k_in, v_in = k.clone(), v.clone(), torch.empty_like(k), torch.empty_like(v)
    for step in range(cp):
        o, m, den = _merge_causal(q, k_buf, v_buf, (o, m, den), (rank - step) % cp, rank)
        if step < cp - 1:
            nxt, prv = (rank + 1) % cp, (rank - 1) % cp
            ops = [dist.P2POp(dist.isend, k_buf, nxt), dist.P2POp(dist.isend, v_buf, nxt)]
            ops += [dist.P2POp(dist.irecv, k_in, prv), dist.P2POp(dist.irecv, v_in, prv)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            k_buf.copy_(k_in)
            v_buf.copy_(v_in)
    return o / den


SOLUTIONS = {"05e.1": (sp_block,), "05e.2": (causal_ring_attention,)}
WRONG = {"05e.1": (sp_block_slices_back,), "05e.2": (causal_ring_attention_no_rescale,)}
SHORTCUTS = {
    "05e.1": {
        "norm_on_whole_sequence": (sp_block_norm_on_whole_sequence,),
        "all_reduce_then_slice": (sp_block_all_reduce_then_slice,),
        "dtensor_redistribute": (sp_block_dtensor_redistribute,),
    },
    "05e.2": {
        "all_gather_kv": (causal_ring_attention_all_gather,),
        "ring_keeps_every_block": (causal_ring_attention_collects_blocks,),
        "two_pass_softmax_over_kept_blocks": (causal_ring_attention_two_pass,),
    },
}
VARIANTS = {
    "05e.1": {"single_tensor_collectives": (sp_block_single_tensor,)},
    "05e.2": {
        "isend_and_recv": (causal_ring_attention_isend_recv,),
        "persistent_buffers": (causal_ring_attention_persistent_buffers,),
    },
}
