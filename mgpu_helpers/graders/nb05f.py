"""Used by notebook 05f's exercise: the dispatch and combine of an expert-parallel MoE layer (05f.1), run
on 3 real gloo processes started with :func:`mgpu_helpers.launching.launch` (3, so that code that holds
only on 2 ranks fails).

05f.1 calls the student's ``dispatch_combine(x, idx, gate, local_experts, rank, world_size)`` on each
rank with cases drawn at grading time: a different number of tokens per rank, 6 or 9 experts split
evenly over the ranks, top-1 then top-2 routing from a float64 router. The outputs and the gradients of
the tokens, of the router and of the rank's experts (after a backward of a loss with random weights)
must equal the unsplit layer computed here in one process. ``torch.distributed`` is wrapped in the ranks
while the student's function runs: ``all_to_all_single`` must carry the tokens there with the routing's
split sizes (one row per (token, chosen expert) pair, grouped by the rank holding the expert) and bring
them back with those split sizes swapped; no other collective (all-gather, all-reduce, broadcast,
send/recv …) may run.

05f.2 calls the student's ``kept(idx, n_experts, capacity_factor)`` on fixed and random routings and
compares the returned ``[T, k]`` mask with experts that each accept ``ceil(c·T·k/E)`` (token, slot) pairs,
all tokens' first choices before any second choice, each slot in token order; calling the grader's own
reference is refused.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from typing import Any

import torch

from ..exercises import Wrong, calls_during, exercise
from ._ranks import run_ranks

_D, _H = 6, 10  # model width, expert hidden width
_OTHERS = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "broadcast",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_to_all",
)


def _case(seed: int, n_ranks: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    n_experts = 2 * n_ranks if seed % 2 else 3 * n_ranks
    tokens = [int(t) for t in torch.randint(5, 13, (n_ranks,), generator=gen)]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "xs": [rnd(t, _D) for t in tokens],
        "router": rnd(_D, n_experts),
        "experts": [(rnd(_D, _H) / _D**0.5, rnd(_H, _D) / _H**0.5) for _ in range(n_experts)],
        "loss_w": [rnd(t, _D) for t in tokens],
    }


def _route(x: torch.Tensor, router: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gate, idx = (x @ router).softmax(-1).topk(k, dim=-1)
    return idx, gate


def _reference(case: dict[str, Any], k: int) -> dict[str, Any]:
    xs = [x.clone().requires_grad_() for x in case["xs"]]
    router = case["router"].clone().requires_grad_()
    experts = [tuple(w.clone().requires_grad_() for w in pair) for pair in case["experts"]]
    x = torch.cat(xs)
    idx, gate = _route(x, router, k)
    out = torch.zeros_like(x)
    for e, (w1, w2) in enumerate(experts):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        out = out.index_add(0, tok, gate[tok, slot, None] * (torch.relu(x[tok] @ w1) @ w2))
    (out * torch.cat(case["loss_w"])).sum().backward()
    return {
        "out": out.detach().split([len(t) for t in xs]),
        "x_grad": [t.grad for t in xs],
        "router_grad": router.grad,
        "expert_grads": [[w.grad for w in pair] for pair in experts],
    }


def _split(s: Any) -> list[int] | None:
    return None if s is None else [int(v) for v in s]


def _rank(rank: int, world_size: int, fn: Any, seed: int) -> list[dict[str, Any]]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    watching = {"on": False}
    calls: list[dict[str, Any]] = []
    real = {name: getattr(dist, name) for name in ("all_to_all_single", *_OTHERS) if hasattr(dist, name)}

    def a2a(
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Any = None,
        input_split_sizes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if watching["on"]:
            calls.append(
                {
                    "op": "all_to_all_single",
                    "float": input.is_floating_point(),
                    "send": _split(input_split_sizes),
                    "recv": _split(output_split_sizes),
                    "rows": input.shape[0] if input.dim() else 0,
                }
            )
        return real["all_to_all_single"](
            output, input, output_split_sizes, input_split_sizes, *args, **kwargs
        )

    def other(name: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if watching["on"]:
                calls.append({"op": name})
            return real[name](*args, **kwargs)

        return wrapped

    patched = {"all_to_all_single": a2a, **{n: other(n) for n in real if n != "all_to_all_single"}}
    for module in (dist, c10d):
        for name, f in patched.items():
            if hasattr(module, name):
                setattr(module, name, f)
    case = _case(seed, world_size)
    n_local = len(case["experts"]) // world_size
    results = []
    try:
        for k in (1, 2):
            x = case["xs"][rank].clone().requires_grad_()
            router = case["router"].clone().requires_grad_()
            mine = case["experts"][rank * n_local : (rank + 1) * n_local]
            local = [tuple(w.clone().requires_grad_() for w in pair) for pair in mine]
            idx, gate = _route(x, router, k)
            calls.clear()
            watching["on"] = True
            try:
                out = fn(x, idx, gate, local, rank, world_size)
            finally:
                watching["on"] = False
            forward_calls = list(calls)
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                results.append({"k": k, "bad_shape": shape, "want": tuple(x.shape)})
                continue
            grads_ok = out.requires_grad
            if grads_ok:
                (out * case["loss_w"][rank]).sum().backward()
            send = torch.bincount(idx.reshape(-1) // n_local, minlength=world_size).tolist()
            results.append(
                {
                    "k": k,
                    "out": out.detach(),
                    "grads_ok": grads_ok,
                    "x_grad": x.grad,
                    "router_grad": router.grad,
                    "expert_grads": [[w.grad for w in pair] for pair in local],
                    "calls": forward_calls,
                    "send": send,
                    "per_slot": [
                        torch.bincount(idx[:, j] // n_local, minlength=world_size).tolist() for j in range(k)
                    ],
                }
            )
    finally:
        for module in (dist, c10d):
            for name in patched:
                if hasattr(module, name):
                    setattr(module, name, real[name])
    return results


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, atol=1e-10, rtol=1e-8)


@exercise(
    "05f.1",
    "dispatch and combine with all-to-all",
    hint="make one row per (token, chosen expert) pair (idx.reshape(-1): pair i is token i // k), order the "
    "pairs by destination rank (expert // experts per rank), exchange the counts with all_to_all_single, "
    "send the rows with AllToAll.apply(rows, recv_counts, send_counts) (and the expert ids, so the receiver "
    "knows which local expert runs each row), run the local experts, send the results back with the two "
    "split lists swapped, put each result back at its pair's position (undo the ordering) and sum each "
    "token's k results weighted by its gates.",
)
def grade_dispatch_combine(fn: Any) -> str:
    """3 gloo ranks, top-1 and top-2 routing drawn at grading time: values, gradients, communication."""
    if not callable(fn):
        raise Wrong(f"pass the function itself, not {type(fn).__name__}")
    seed = 1000 + secrets.randbelow(10**6)
    ranks = run_ranks(_rank, 3, fn, seed)
    n = len(ranks)
    case = _case(seed, n)
    for i in range(2):
        k = ranks[0][i]["k"]
        ref = _reference(case, k)
        when = f"with top-{k} routing"
        for rank, res in enumerate(r[i] for r in ranks):
            if "bad_shape" in res:
                raise Wrong(
                    f"{when}, rank {rank} returned {res['bad_shape']}, not a tensor of shape {res['want']} "
                    "(one row per token of the rank, in the tokens' order)."
                )
            others = sorted({c["op"] for c in res["calls"] if c["op"] != "all_to_all_single"})
            if others:
                raise Wrong(
                    f"{when}, rank {rank} called dist.{', dist.'.join(others)}: in expert parallelism "
                    "the tokens travel only to the ranks of their experts and back, with "
                    "dist.all_to_all_single; no rank gathers all tokens or all experts."
                )
            moves = [c for c in res["calls"] if c["op"] == "all_to_all_single" and c["float"]]
            if not moves:
                raise Wrong(
                    f"{when}, rank {rank} never sent a float tensor with dist.all_to_all_single: the "
                    "tokens must travel to the experts' ranks."
                )
            recv = [ranks[src][i]["send"][rank] for src in range(n)]
            there = any(c["send"] == res["send"] and c["recv"] == recv for c in moves)
            back = any(c["send"] == recv and c["recv"] == res["send"] for c in moves)
            if k > 1 and not there and any(c["send"] in res["per_slot"] for c in moves):
                raise Wrong(
                    f"{when}, rank {rank} sent each slot's rows in an all-to-all of its own ({len(moves)} "
                    "exchanges of float rows): send all k rows of every token in one all-to-all there and "
                    "one back, one message per pair of ranks, as an MoE layer does."
                )
            if not (there and back):
                raise Wrong(
                    f"{when}, rank {rank}'s all_to_all_single calls with float tensors had split sizes "
                    f"{[(c['send'], c['recv']) for c in moves]} (input_split_sizes, output_split_sizes); the "
                    f"routing sends {res['send']} rows (pairs) to ranks 0..{n - 1} and receives {recv}: the "
                    "rows must go there with exactly those split sizes and come back with them swapped "
                    "(no padding to a fixed size)."
                )
            if not _close(res["out"], ref["out"][rank]):
                bad = (res["out"] - ref["out"][rank]).abs().amax(1) > 1e-9
                raise Wrong(
                    f"{when}, rank {rank}'s output differs from the unsplit layer on tokens "
                    f"{bad.nonzero().flatten().tolist()[:6]} (of {len(bad)}): check the order in which "
                    "the results come back and how each token's results are combined."
                )
            if not res["grads_ok"]:
                raise Wrong(
                    f"{when}, rank {rank}'s output has no autograd graph: send the rows with the "
                    "notebook's AllToAll.apply so that the gradients travel back too."
                )
            if not _close(res["x_grad"], ref["x_grad"][rank]):
                raise Wrong(
                    f"{when}, rank {rank}'s tokens get a wrong gradient: the rows must be sent with "
                    "AllToAll.apply (autograd-aware), there and back."
                )
            n_local = len(res["expert_grads"])
            for j, grads in enumerate(res["expert_grads"]):
                want = ref["expert_grads"][rank * n_local + j]
                if not all(_close(g, w) for g, w in zip(grads, want, strict=True)):
                    raise Wrong(
                        f"{when}, rank {rank}'s expert {rank * n_local + j} gets a wrong gradient: it "
                        "must receive the gradients of every rank's tokens it processed."
                    )
        routers = [r[i]["router_grad"] for r in ranks if r[i]["router_grad"] is not None]
        if not routers or not _close(sum(routers), ref["router_grad"]):
            raise Wrong(
                f"{when}, the router's gradient (summed over the ranks) differs from the unsplit "
                "layer's: each token's results must be weighted by the gates passed in."
            )
    return (
        f"outputs and gradients equal the unsplit layer for top-1 and top-2 routing on {n} ranks; tokens "
        "sent there and back with all_to_all_single and the routing's split sizes"
    )


# --- 05f.2: capacity and dropped tokens -----------------------------------------------------------------

_FIXED_ROUTES = (
    ([[0, 1], [0, 2], [1, 0], [0, 1]], 3, 1.0),  # capacity 3: expert 0's 4th pair (token 2's 2nd slot) drops
    ([[2], [2], [2], [0], [2], [1]], 3, 1.0),  # top-1, capacity 2: tokens 2 and 4 drop
    ([[1, 0], [1, 2], [1, 3], [0, 1]], 4, 0.5),  # token 0's 2nd choice must not take token 3's 1st
)


def _kept(idx: torch.Tensor, n_experts: int, capacity_factor: float) -> torch.Tensor:
    n_tokens, k = idx.shape
    capacity = math.ceil(capacity_factor * n_tokens * k / n_experts)
    used = [0] * n_experts
    keep = torch.zeros(n_tokens, k, dtype=torch.bool)
    for slot in range(k):  # all first choices before any second choice
        for t in range(n_tokens):
            e = int(idx[t, slot])
            if used[e] < capacity:
                used[e] += 1
                keep[t, slot] = True
    return keep


def _random_route(gen: torch.Generator) -> tuple[torch.Tensor, int, float]:
    n_experts = int(torch.randint(2, 7, (), generator=gen))
    k = int(torch.randint(1, 3, (), generator=gen))
    n_tokens = int(torch.randint(6, 25, (), generator=gen))
    skew = torch.rand(n_experts, generator=gen) ** 2 + 0.05  # uneven loads, so that some experts overflow
    idx = torch.stack([torch.multinomial(skew, k, generator=gen) for _ in range(n_tokens)])
    factor = [0.5, 1.0, 1.25, 2.0][int(torch.randint(0, 4, (), generator=gen))]
    return idx, n_experts, factor


@exercise(
    "05f.2",
    "capacity: which token slots are kept",
    hint="capacity = math.ceil(capacity_factor * T * k / n_experts); keep one counter per expert; walk the "
    "slots in priority order (every token's first choice, in token order, then every token's second "
    "choice) and keep a pair while its expert's counter is below the capacity.",
)
def grade_kept(kept: Callable[[torch.Tensor, int, float], Any]) -> str:
    """3 fixed routings (overflow, top-1, second choices last) and 20 random ones."""
    if not callable(kept):
        raise Wrong(f"pass the function kept itself, not {type(kept).__name__}")
    gen = torch.Generator().manual_seed(secrets.randbits(32))
    cases = [(torch.tensor(i), e, c) for i, e, c in _FIXED_ROUTES] + [_random_route(gen) for _ in range(20)]
    for idx, n_experts, factor in cases:
        got, own = calls_during(kept, lambda code: code is _kept.__code__, idx.clone(), n_experts, factor)
        if own:
            raise Wrong("your kept calls the grader's own reference: write the walk over the slots.")
        want = _kept(idx, n_experts, factor)
        try:
            got = torch.as_tensor(got).bool()
        except (TypeError, ValueError, RuntimeError):
            raise Wrong(f"kept must return a [T, k] tensor of booleans, not {type(got).__name__}.") from None
        if got.shape != want.shape:
            raise Wrong(
                f"kept returned shape {tuple(got.shape)}; want one boolean per (token, slot): "
                f"{tuple(want.shape)}."
            )
        if not torch.equal(got, want):
            capacity = math.ceil(factor * idx.numel() / n_experts)
            raise Wrong(
                f"for idx={idx.tolist()}, {n_experts} experts and capacity factor {factor} (capacity "
                f"{capacity}), you keep {got.int().tolist()}: not the pairs that fit, first choices first."
            )
    return "the kept slots match experts of capacity ceil(c·T·k/E), first choices first, on 23 routings."
