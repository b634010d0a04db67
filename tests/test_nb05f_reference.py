"""Partial issue 24 part 3b: the by-hand expert-parallel dispatch/combine equals the unsplit MoE (float64)."""
import pytest
import torch
import torch.distributed as dist

from mgpu_helpers.launching import launch
from solutions.nb05f import dispatch_combine, moe_reference, route


def _make(seed, n_experts=4, d=6, h=8, tokens=20):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    experts = [(rnd(d, h), rnd(h, d)) for _ in range(n_experts)]
    return rnd(tokens, d), rnd(d, n_experts), experts


def _worker(rank, world, k):
    x, rw, ex = _make(0)
    for t in [x, rw, *[w for pair in ex for w in pair]]:
        t.requires_grad_()
    n_tok, n_loc = x.shape[0] // world, len(ex) // world
    mine = slice(rank * n_tok, (rank + 1) * n_tok)
    xs = x.detach()[mine].clone().requires_grad_()
    rw2 = rw.detach().clone().requires_grad_()
    held = ex[rank * n_loc:(rank + 1) * n_loc]
    loc = [tuple(w.detach().clone().requires_grad_() for w in pair) for pair in held]
    idx, gate = route(xs, rw2, k)
    out = dispatch_combine(xs, idx, gate, loc, rank, world)
    out.pow(2).sum().backward()
    ref = moe_reference(x, rw, ex, k)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(out, ref[mine].detach())
    torch.testing.assert_close(xs.grad, x.grad[mine])
    router_grad = rw2.grad.clone()
    dist.all_reduce(router_grad)
    torch.testing.assert_close(router_grad, rw.grad)
    for mine_pair, ref_pair in zip(loc, held, strict=True):
        for a, b in zip(mine_pair, ref_pair, strict=True):
            torch.testing.assert_close(a.grad, b.grad)
    return "ok"


@pytest.mark.parametrize("k", [1, 2])
def test_expert_parallel_matches_unsplit(k):
    assert launch(_worker, 2, args=(k,), backend="gloo") == ["ok", "ok"]
