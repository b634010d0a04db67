"""Reference solutions of notebook 05f's exercises and typical wrong attempts and shortcuts
(run by tests/test_solutions.py, tests/test_shortcuts.py and tests/test_grader_variants.py).

05f.1 asks for the backward of ``AllToAll``, a differentiable ``dist.all_to_all_single``
(``AllToAll.apply(x, recv_split, send_split)``; the notebook gives its forward, repeated here): it sends
each received row's gradient back to the rank it came from, the same exchange with the split lists
swapped. Then for ``dispatch_combine(x, idx, gate, local_experts, rank, world_size)``: send one row per
(token, chosen expert) pair to the rank that holds the expert with it (counts first, then the rows, with
the routing's split sizes), run the local experts, send the results back with the split sizes swapped, put
them back in the tokens' order and combine them with the gates.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class AllToAll(torch.autograd.Function):
    """The notebook's ``all_to_all_single`` with a backward: the gradient travels back, splits swapped."""

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


class AllToAllSplitsNotSwapped(AllToAll):
    """Typical slip: the backward sends the gradients with the forward's split lists, as if the exchange
    were its own reverse (it is only when every pair of ranks sends each other as many rows)."""

    @staticmethod
    def backward(ctx, grad):
        recv_split, send_split = ctx.splits
        return AllToAllSplitsNotSwapped.apply(grad, recv_split, send_split), None, None


class AllToAllPlainBackward(AllToAll):
    """A variant: the backward calls dist.all_to_all_single itself (no second Function on the way back)."""

    @staticmethod
    def backward(ctx, grad):
        recv_split, send_split = ctx.splits
        back = grad.new_empty(sum(send_split), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), send_split, recv_split)
        return back, None, None


class TorchsFunctionalAllToAll:
    """Shortcut: torch's differentiable all-to-all (the one section 3 uses) under the exercise's name."""

    @staticmethod
    def apply(x, recv_split, send_split):
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        return all_to_all_single_autograd(x, recv_split, send_split, dist.group.WORLD) * 1


class TorchsPlainFunctionalAllToAll:
    """Shortcut: torch's plain functional all_to_all_single, which records a backward too in torch 2.13."""

    @staticmethod
    def apply(x, recv_split, send_split):
        from torch.distributed import _functional_collectives as funcol

        return funcol.all_to_all_single(x, recv_split, send_split, dist.group.WORLD) * 1


class TorchsDeprecatedAllToAll:
    """Shortcut: the deprecated ``torch.distributed.nn.functional.all_to_all_single``, differentiable and
    built on dist.all_to_all_single, so the split sizes it sends are right."""

    @staticmethod
    def apply(x, recv_split, send_split):
        import warnings

        from torch.distributed.nn import functional

        out = x.new_empty(sum(recv_split), *x.shape[1:])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return functional.all_to_all_single(out, x.contiguous(), recv_split, send_split)


def expert_mlp(x, w1, w2):
    """One expert: a two-layer MLP."""
    return torch.relu(x @ w1) @ w2


def _run_local_experts(x_in, e_in, local_experts, first):
    y_in = torch.zeros_like(x_in)
    for j, (w1, w2) in enumerate(local_experts):
        rows = (e_in == first + j).nonzero(as_tuple=True)[0]
        y_in = y_in.index_copy(0, rows, expert_mlp(x_in[rows], w1, w2))
    return y_in


def dispatch_combine(x, idx, gate, local_experts, rank, world_size):
    """Sort-based grouping: the (token, slot) pairs sorted by expert are grouped by destination rank."""
    return _dispatch_combine(x, idx, gate, local_experts, rank, world_size, owner=_owner)


def _owner(expert, n_local):
    """The rank that holds each expert: experts are split evenly, in order."""
    return expert // n_local


def _dispatch_combine(x, idx, gate, local_experts, rank, world_size, owner, a2a=None):
    a2a = a2a or AllToAll
    n_local = len(local_experts)
    T, k = idx.shape
    expert = idx.reshape(-1)  # pair i is token i // k, slot i % k
    order = torch.argsort(expert, stable=True)
    send_counts = torch.bincount(owner(expert, n_local), minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    x_in = a2a.apply(x[order // k], recv, send)
    e_in = expert.new_empty(sum(recv))
    dist.all_to_all_single(e_in, expert[order].contiguous(), recv, send)
    y_in = _run_local_experts(x_in, e_in, local_experts, rank * n_local)
    y = a2a.apply(y_in, send, recv)
    y = torch.empty_like(y).index_copy(0, order, y)  # row i of y belongs to pair order[i]
    return (y.view(T, k, -1) * gate[..., None]).sum(1)


def dispatch_combine_plain_backward(x, idx, gate, local_experts, rank, world_size):
    """The reference dispatch and combine, its rows sent with :class:`AllToAllPlainBackward`."""
    return _dispatch_combine(x, idx, gate, local_experts, rank, world_size, _owner, AllToAllPlainBackward)


def two_halves_owner(x, idx, gate, local_experts, rank, world_size):
    """Right on 2 ranks only: an expert's rank read as "first half of the experts or second half"."""

    def halves(expert, n_local):
        return (expert >= n_local).long()

    return _dispatch_combine(x, idx, gate, local_experts, rank, world_size, owner=halves)


def dispatch_combine_mask_grouping(x, idx, gate, local_experts, rank, world_size):
    """A variant: the pairs grouped by destination rank with a mask per rank, not a sort."""
    n_local = len(local_experts)
    T, k = idx.shape
    expert = idx.reshape(-1)
    dest = expert // n_local
    groups = [(dest == r).nonzero(as_tuple=True)[0] for r in range(world_size)]
    order = torch.cat(groups)
    send = [len(g) for g in groups]
    recv_counts = torch.empty(world_size, dtype=torch.long)
    dist.all_to_all_single(recv_counts, torch.tensor(send))
    recv = recv_counts.tolist()
    x_in = AllToAll.apply(x[order // k], recv, send)
    e_in = expert.new_empty(sum(recv))
    dist.all_to_all_single(e_in, expert[order].contiguous(), recv, send)
    y_in = _run_local_experts(x_in, e_in, local_experts, rank * n_local)
    y = AllToAll.apply(y_in, send, recv)
    out = torch.zeros(T * k, x.shape[1], dtype=x.dtype).index_add(0, order, y)
    return (out.view(T, k, -1) * gate[..., None]).sum(1)


def one_top1_exchange_per_slot(x, idx, gate, local_experts, rank, world_size):
    """Shortcut: the notebook's top-1 function once per slot: k exchanges there and k back."""
    out = torch.zeros_like(x)
    for j in range(idx.shape[1]):
        out = out + _top1(x, idx[:, j : j + 1], gate[:, j : j + 1], local_experts, rank, world_size)
    return out


def _top1(x, idx, gate, local_experts, rank, world_size):
    """The notebook's ``moe_expert_parallel_top1``."""
    n_local = len(local_experts)
    expert = idx[:, 0]
    order = torch.argsort(expert, stable=True)
    send_counts = torch.bincount(expert // n_local, minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    x_in = AllToAll.apply(x[order], recv, send)
    e_in = expert.new_empty(sum(recv))
    dist.all_to_all_single(e_in, expert[order], recv, send)
    y_in = _run_local_experts(x_in, e_in, local_experts, rank * n_local)
    y = AllToAll.apply(y_in, send, recv)
    y = torch.empty_like(y).index_copy(0, order, y)
    return gate * y


def dispatch_combine_with_section_3s_exchange(x, idx, gate, local_experts, rank, world_size):
    """Shortcut: the rows sent with torch's all_to_all_single_autograd, as section 3 does, not AllToAll."""
    from torch.distributed import _functional_collectives as funcol

    def torchs(rows, recv, send):
        return funcol.all_to_all_single_autograd(rows, recv, send, dist.group.WORLD) * 1

    n_local = len(local_experts)
    T, k = idx.shape
    expert = idx.reshape(-1)
    order = torch.argsort(expert, stable=True)
    send_counts = torch.bincount(expert // n_local, minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    x_in = torchs(x[order // k], recv, send)
    e_in = expert.new_empty(sum(recv))
    dist.all_to_all_single(e_in, expert[order].contiguous(), recv, send)
    y = torchs(_run_local_experts(x_in, e_in, local_experts, rank * n_local), send, recv)
    y = torch.empty_like(y).index_copy(0, order, y)
    return (y.view(T, k, -1) * gate[..., None]).sum(1)


def all_experts_on_every_rank(x, idx, gate, local_experts, rank, world_size):
    """Shortcut: gather every expert's weights (autograd-aware) and compute the whole layer locally."""
    from torch.distributed.nn.functional import all_gather

    experts = []
    for j in range(len(local_experts)):
        w1s, w2s = all_gather(local_experts[j][0]), all_gather(local_experts[j][1])
        experts.append(list(zip(w1s, w2s, strict=True)))
    experts = [experts[j][r] for r in range(world_size) for j in range(len(local_experts))]
    out = torch.zeros_like(x)
    for e, (w1, w2) in enumerate(experts):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        out = out.index_add(0, tok, gate[tok, slot, None] * expert_mlp(x[tok], w1, w2))
    return out


def all_gather_every_token(x, idx, gate, local_experts, rank, world_size):
    """Shortcut: every rank gets every token (autograd-aware all-gather), runs its experts on all of
    them, and the partial outputs are summed with an all-reduce."""
    from torch.distributed import nn as dnn

    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world_size)]
    dist.all_gather(counts, torch.tensor([x.shape[0]]))
    sizes = [int(c) for c in counts]
    biggest = max(sizes)
    pad = biggest - x.shape[0]

    def padded(t):
        return torch.cat([t, t.new_zeros(pad, *t.shape[1:])])

    xs, gs = dnn.functional.all_gather(padded(x)), dnn.functional.all_gather(padded(gate))
    ids = [torch.zeros(biggest, idx.shape[1], dtype=idx.dtype) for _ in range(world_size)]
    dist.all_gather(ids, padded(idx))
    n_local = len(local_experts)
    outs = []
    for r in range(world_size):
        xr, ir, gr = xs[r][: sizes[r]], ids[r][: sizes[r]], gs[r][: sizes[r]]
        out = torch.zeros_like(xr)
        for j, (w1, w2) in enumerate(local_experts):
            tok, slot = (ir == rank * n_local + j).nonzero(as_tuple=True)
            out = out.index_add(0, tok, gr[tok, slot, None] * expert_mlp(xr[tok], w1, w2))
        outs.append(padded_to(out, biggest))
    total = dnn.functional.all_reduce(torch.stack(outs))
    return total[rank][: x.shape[0]]


def padded_to(t, n):
    return torch.cat([t, t.new_zeros(n - t.shape[0], *t.shape[1:])])


def padded_fixed_splits(x, idx, gate, local_experts, rank, world_size):
    """Shortcut: every destination gets a fixed T*k rows (padding), so the split sizes ignore the routing."""
    n_local = len(local_experts)
    T, k = idx.shape
    sizes = torch.empty(world_size, dtype=torch.long)
    dist.all_to_all_single(sizes, torch.full((world_size,), T))  # every rank's number of tokens
    slots = int(sizes.max()) * k  # rows reserved per destination: enough for any routing
    expert = idx.reshape(-1)
    dest = expert // n_local
    rows, ids = [], []
    for r in range(world_size):
        pairs = (dest == r).nonzero(as_tuple=True)[0]
        rows.append(padded_to(x[pairs // k], slots))
        ids.append(torch.cat([expert[pairs], expert.new_full((slots - len(pairs),), -1)]))
    fixed = [slots] * world_size
    x_in = AllToAll.apply(torch.cat(rows), fixed, fixed)
    e_in = expert.new_empty(slots * world_size)
    dist.all_to_all_single(e_in, torch.cat(ids), fixed, fixed)
    y_in = _run_local_experts(x_in, e_in, local_experts, rank * n_local)
    y = AllToAll.apply(y_in, fixed, fixed)
    out = torch.zeros(T * k, x.shape[1], dtype=x.dtype)
    for r in range(world_size):
        pairs = (dest == r).nonzero(as_tuple=True)[0]
        out = out.index_add(0, pairs, y[r * slots : r * slots + len(pairs)])
    return (out.view(T, k, -1) * gate[..., None]).sum(1)


def kept(idx, n_experts, capacity_factor):
    """05f.2: which (token, slot) pairs fit, every first choice before any second choice."""
    T, k = idx.shape
    capacity = math.ceil(capacity_factor * T * k / n_experts)
    used = [0] * n_experts
    keep = torch.zeros(T, k, dtype=torch.bool)
    for slot in range(k):
        for t in range(T):
            e = int(idx[t, slot])
            if used[e] < capacity:
                used[e] += 1
                keep[t, slot] = True
    return keep


def kept_cumsum(idx, n_experts, capacity_factor):
    """A variant, vectorised as in Switch Transformer: position in the expert's queue by a cumulative sum."""
    T, k = idx.shape
    capacity = math.ceil(capacity_factor * T * k / n_experts)
    one_hot = torch.nn.functional.one_hot(idx.T.reshape(-1), n_experts)  # slot-major: first choices first
    position = (one_hot.cumsum(0) * one_hot).sum(1)  # 1-based place in its expert's queue
    return (position <= capacity).view(k, T).T


def kept_token_order(idx, n_experts, capacity_factor):
    """Typical slip: pairs taken token by token, so a token's second choice beats later first choices."""
    T, k = idx.shape
    capacity = math.ceil(capacity_factor * T * k / n_experts)
    used = [0] * n_experts
    keep = torch.zeros(T, k, dtype=torch.bool)
    for t in range(T):
        for slot in range(k):
            e = int(idx[t, slot])
            if used[e] < capacity:
                used[e] += 1
                keep[t, slot] = True
    return keep


def kept_graders_own(idx, n_experts, capacity_factor):
    """The grader's reference as the answer key."""
    from mgpu_helpers.graders.nb05f import _kept

    return _kept(idx, n_experts, capacity_factor)


SOLUTIONS = {"05f.1": (AllToAll, dispatch_combine), "05f.2": (kept,)}
WRONG = {"05f.1": (AllToAllSplitsNotSwapped, dispatch_combine), "05f.2": (kept_token_order,)}
SHORTCUTS = {
    "05f.1": {
        "torchs_functional_all_to_all_as_AllToAll": (TorchsFunctionalAllToAll, dispatch_combine),
        "torchs_deprecated_all_to_all_as_AllToAll": (TorchsDeprecatedAllToAll, dispatch_combine),
        "torchs_plain_functional_all_to_all_as_AllToAll": (TorchsPlainFunctionalAllToAll, dispatch_combine),
        "section_3s_torch_exchange_for_the_rows": (AllToAll, dispatch_combine_with_section_3s_exchange),
        "all_experts_on_every_rank": (AllToAll, all_experts_on_every_rank),
        "all_gather_every_token": (AllToAll, all_gather_every_token),
        "padded_fixed_splits": (AllToAll, padded_fixed_splits),
        "one_top1_exchange_per_slot": (AllToAll, one_top1_exchange_per_slot),
        "two_ranks_only_owner_by_halves": (AllToAll, two_halves_owner),
    },
    "05f.2": {"graders_own_reference": (kept_graders_own,)},
}
VARIANTS = {
    "05f.1": {
        "mask_grouping": (AllToAll, dispatch_combine_mask_grouping),
        "plain_all_to_all_in_the_backward": (AllToAllPlainBackward, dispatch_combine_plain_backward),
    },
    "05f.2": {"cumsum_one_hot": (kept_cumsum,)},
}
