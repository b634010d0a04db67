"""Reference solutions for notebook 05f (expert parallelism by hand). PARTIAL: the grader is not built yet.

``dispatch_combine`` is what exercise 05f.1 asks for: send each routed (token, expert) pair to the rank
that holds the expert with two ``all_to_all_single`` calls (counts, then tokens), run the local experts,
send the results back with a third, put them back in the original order and combine with the gates.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with a backward: the gradient travels the same way back, splits swapped."""

    @staticmethod
    def forward(ctx, x, recv_split, send_split):
        ctx.splits = (recv_split, send_split)
        out = x.new_empty(sum(recv_split), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv_split, send_split)
        return out

    @staticmethod
    def backward(ctx, grad):
        recv_split, send_split = ctx.splits
        return AllToAll.apply(grad, send_split, recv_split), None, None


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert: a two-layer MLP."""
    return torch.relu(x @ w1) @ w2


def route(x: torch.Tensor, router_w: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: (expert index [T, k], gate weight [T, k]); gates = softmax over the k chosen logits."""
    logits = x @ router_w
    top, idx = logits.topk(k, dim=-1)
    return idx, top.softmax(dim=-1)


def moe_reference(x, router_w, experts, k):
    """The unsplit MoE layer in one process: every expert here."""
    idx, gate = route(x, router_w, k)
    out = torch.zeros_like(x)
    for e, (w1, w2) in enumerate(experts):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if len(tok):
            out = out.index_add(0, tok, gate[tok, slot, None] * expert_mlp(x[tok], w1, w2))
    return out


def dispatch_combine(x, idx, gate, local_experts, rank, world_size):
    """Expert parallel: this rank's tokens go to the experts' ranks and come back, combined with gates."""
    n_local = len(local_experts)
    T, k = idx.shape
    flat_e = idx.reshape(-1)                          # expert of each (token, slot) pair
    flat_tok = torch.arange(T).repeat_interleave(k)   # token of each pair
    order = torch.argsort(flat_e, stable=True)        # sort by expert => grouped by destination rank
    dest = flat_e[order] // n_local
    send_counts = torch.bincount(dest, minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # 1) how many rows each rank will send me
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
    n_recv = sum(recv_split)
    # 2) the tokens (autograd-aware all-to-all) and their expert ids
    recv_x = AllToAll.apply(x[flat_tok[order]], recv_split, send_split)
    recv_e = flat_e.new_empty(n_recv)
    dist.all_to_all_single(recv_e, flat_e[order].contiguous(), recv_split, send_split)
    local_e = recv_e - rank * n_local
    y = torch.zeros_like(recv_x)
    for j, (w1, w2) in enumerate(local_experts):
        rows = (local_e == j).nonzero(as_tuple=True)[0]
        if len(rows):
            y = y.index_copy(0, rows, expert_mlp(recv_x[rows], w1, w2))
    # 3) results back to the ranks that own the tokens, same splits reversed
    back = AllToAll.apply(y, send_split, recv_split)
    # undo the sort: row i of `back` belongs to pair order[i]
    pair_out = torch.empty_like(back).index_copy(0, order, back)
    return (pair_out.view(T, k, -1) * gate[..., None]).sum(1)
