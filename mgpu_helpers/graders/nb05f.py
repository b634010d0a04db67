"""Used by notebook 05f's exercises: a differentiable all-to-all and the dispatch and combine of an
expert-parallel MoE layer (05f.1), run on 3 real gloo processes started with
:func:`mgpu_helpers.launching.launch` (3, so that code that holds only on 2 ranks fails).

05f.1 takes the student's ``AllToAll`` (a ``torch.autograd.Function``, ``AllToAll.apply(x, recv_split,
send_split)``, whose forward the notebook gives and whose backward the student writes) and
``dispatch_combine(x, idx, gate, local_experts, rank, world_size)``. ``torch.distributed`` is wrapped in
the ranks while the student's code runs, forward and backward: only ``all_to_all_single`` may run (no
all-gather, all-reduce, broadcast, send/recv …), and torch's ready-made differentiable all-to-alls
(``_functional_collectives.all_to_all_single_autograd``, the deprecated
``torch.distributed.nn.functional.all_to_all_single``) are refused.

* ``AllToAll`` alone first: uneven split sizes drawn at grading time (not symmetric, and no rank receiving
  as many rows as it sends); the rows that arrive and the gradients that reach each rank's input must be
  the right ones, and the float ``all_to_all_single`` calls must carry exactly the rows given forward and
  their gradients backward.
* then ``dispatch_combine``, on cases drawn at grading time: a different number of tokens per rank, 6 or
  9 experts split evenly over the ranks, top-1 then top-2 routing from a float64 router. The outputs and the
  gradients of the tokens, of the router and of the rank's experts (after a backward of a loss with random
  weights) must equal the unsplit layer computed here in one process, and ``all_to_all_single`` must carry
  the rows there with the routing's split sizes (one row per (token, chosen expert) pair, grouped by the
  rank holding the expert) and back with those split sizes swapped, in the forward, and the same two
  exchanges in the backward.

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
_A2A_WIDTH = 3  # width of the rows AllToAll is tried on alone


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


def _a2a_case(seed: int, n_ranks: int) -> dict[str, Any]:
    """``m[i][j]`` rows go from rank i to rank j: uneven, not symmetric, and every rank receives a number of
    rows different from what it sends (so that split lists used the wrong way round cannot fit); rank r's
    input rows and the weights of its loss on the rows it receives."""
    gen = torch.Generator().manual_seed(seed + 1)
    while True:
        m = torch.randint(0, 5, (n_ranks, n_ranks), generator=gen)
        if (m.sum(0) != m.sum(1)).all():
            break

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "m": m.tolist(),
        "xs": [rnd(int(m[r].sum()), _A2A_WIDTH) for r in range(n_ranks)],
        "ws": [rnd(int(m[:, r].sum()), _A2A_WIDTH) for r in range(n_ranks)],
    }


def _a2a_expected(case: dict[str, Any], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What rank ``rank`` receives (the blocks every rank sends it, in rank order), and the gradient its
    input gets (the loss weights that its rows met on the ranks they went to)."""
    m, n = case["m"], len(case["m"])
    out = torch.cat([case["xs"][src].split(m[src])[rank] for src in range(n)])
    grad = torch.cat([case["ws"][dst].split([m[src][dst] for src in range(n)])[rank] for dst in range(n)])
    return out, grad


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


def _ready_made() -> set[Any]:
    """The code of torch's differentiable all-to-alls, which would be the answer to 05f.1's first part."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.nn.functional as dnnf

    found = {dnnf.all_to_all_single, dnnf._AlltoAllSingle.forward, funcol.all_to_all_single_autograd}
    return {getattr(f, "__code__", None) for f in found} - {None}


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}".strip()


def _backward(out: torch.Tensor, w: torch.Tensor) -> None:
    (out * w).sum().backward()


def _rank(rank: int, world_size: int, a2a: Any, fn: Any, seed: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    watching = {"on": False}
    calls: list[dict[str, Any]] = []
    real = {name: getattr(dist, name) for name in ("all_to_all_single", *_OTHERS) if hasattr(dist, name)}
    ready_made = _ready_made()

    def a2a_single(
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

    def watched(step: Callable[..., Any], *args: Any) -> tuple[Any, list[dict[str, Any]], bool, str | None]:
        """step(*args) with torch.distributed watched: its result, the collectives it called, whether it ran
        one of torch's differentiable all-to-alls, and the error it raised (None when it did not)."""
        calls.clear()
        watching["on"] = True
        try:
            result, used = calls_during(step, ready_made.__contains__, *args)
            return result, list(calls), bool(used), None
        except Exception as exc:  # the student's code raised: feedback, after the other ranks are told
            return None, list(calls), False, _error(exc)
        finally:
            watching["on"] = False

    def all_fine(ok: bool) -> bool:
        """Whether every rank got this far without an error (so that none waits for a failed one)."""
        flag = torch.tensor([0 if ok else 1])
        real["all_reduce"](flag)
        return int(flag) == 0

    patched = {"all_to_all_single": a2a_single, **{n: other(n) for n in real if n != "all_to_all_single"}}
    for module in (dist, c10d):
        for name, f in patched.items():
            if hasattr(module, name):
                setattr(module, name, f)
    result: dict[str, Any] = {"a2a": {}, "moe": []}
    try:
        # 1. AllToAll alone, on uneven splits
        case = _a2a_case(seed, world_size)
        m = case["m"]
        send, recv = m[rank], [m[src][rank] for src in range(world_size)]
        x = case["xs"][rank].clone().requires_grad_()
        out, fwd, used, err = watched(a2a.apply, x, recv, send)
        res = {
            "send": send,
            "recv": recv,
            "fwd": fwd,
            "ready_made": used,
            "raised": err and f"forward: {err}",
        }
        if err is None:
            if not isinstance(out, torch.Tensor) or out.shape != (sum(recv), _A2A_WIDTH):
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                res["bad_shape"] = shape
            else:
                res["out"] = out.detach().clone()
                res["graph"] = out.requires_grad
                if out.requires_grad:
                    w = case["ws"][rank]
                    _, bwd, _, err = watched(_backward, out, w)
                    res.update(bwd=bwd, x_grad=x.grad, raised=err and f"backward: {err}")
        result["a2a"] = res
        if not all_fine(res["raised"] is None and "bad_shape" not in res):
            return result
        # 2. dispatch_combine on a whole MoE layer, top-1 then top-2
        case = _case(seed, world_size)
        n_local = len(case["experts"]) // world_size
        for k in (1, 2):
            x = case["xs"][rank].clone().requires_grad_()
            router = case["router"].clone().requires_grad_()
            mine = case["experts"][rank * n_local : (rank + 1) * n_local]
            local = [tuple(w.clone().requires_grad_() for w in pair) for pair in mine]
            idx, gate = _route(x, router, k)
            out, forward_calls, used, err = watched(fn, x, idx, gate, local, rank, world_size)
            entry: dict[str, Any] = {"k": k, "raised": err and f"forward: {err}", "ready_made": used}
            if err is None and (not isinstance(out, torch.Tensor) or out.shape != x.shape):
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                entry.update(bad_shape=shape, want=tuple(x.shape))
            elif err is None:
                backward_calls: list[dict[str, Any]] = []
                if out.requires_grad:
                    w = case["loss_w"][rank]
                    _, backward_calls, _, err = watched(_backward, out, w)
                    entry["raised"] = err and f"backward: {err}"
                entry.update(
                    out=out.detach(),
                    grads_ok=out.requires_grad,
                    x_grad=x.grad,
                    router_grad=router.grad,
                    expert_grads=[[w.grad for w in pair] for pair in local],
                    calls=forward_calls,
                    backward_calls=backward_calls,
                    send=torch.bincount(idx.reshape(-1) // n_local, minlength=world_size).tolist(),
                    per_slot=[
                        torch.bincount(idx[:, j] // n_local, minlength=world_size).tolist() for j in range(k)
                    ],
                )
            result["moe"].append(entry)
            if not all_fine(entry["raised"] is None and "bad_shape" not in entry):
                return result
    finally:
        for module in (dist, c10d):
            for name in patched:
                if hasattr(module, name):
                    setattr(module, name, real[name])
    return result


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, atol=1e-10, rtol=1e-8)


_READY_MADE = (
    "torch's ready-made differentiable all-to-all does the exercise's first part: write the Function "
    "yourself on dist.all_to_all_single."
)


def _check_all_to_all(ranks: list[dict[str, Any]], seed: int) -> None:
    """AllToAll alone: rows, gradients, and what travelled with dist.all_to_all_single each way."""
    n = len(ranks)
    case = _a2a_case(seed, n)
    when = "tried alone on uneven splits"
    for rank, res in enumerate(r["a2a"] for r in ranks):
        send, recv = res["send"], res["recv"]
        if res["ready_made"]:
            raise Wrong(f"AllToAll, {when}: {_READY_MADE}")
        others = sorted({c["op"] for c in res["fwd"] + res.get("bwd", []) if c["op"] != "all_to_all_single"})
        if others:
            raise Wrong(
                f"AllToAll, {when}, called dist.{', dist.'.join(others)} on rank {rank}: an all-to-all "
                "sends each rank only its own rows, with dist.all_to_all_single."
            )
        if res["raised"]:
            raise Wrong(
                f"AllToAll.apply(x, recv_split={recv}, send_split={send}) on rank {rank} ({when}) raised "
                f"in its {res['raised']}"
            )
        if "bad_shape" in res:
            raise Wrong(
                f"AllToAll.apply(x, recv_split={recv}, send_split={send}) on rank {rank} returned "
                f"{res['bad_shape']}, not a tensor of {sum(recv)} rows of width {_A2A_WIDTH} (one per row "
                "received, in the senders' rank order)."
            )
        moved = [c for c in res["fwd"] if c["op"] == "all_to_all_single" and c["float"]]
        if not moved:
            raise Wrong(
                f"AllToAll, {when}, never called dist.all_to_all_single with the rows on rank {rank}: the "
                "rows must travel with it."
            )
        if not any(c["send"] == send and c["recv"] == recv for c in moved):
            raise Wrong(
                f"AllToAll's forward on rank {rank} called dist.all_to_all_single with split sizes "
                f"{[(c['send'], c['recv']) for c in moved]} (input_split_sizes, output_split_sizes): the "
                f"rank sends {send} rows to ranks 0..{n - 1} and receives {recv}, so exactly those."
            )
        want_out, want_grad = _a2a_expected(case, rank)
        if not torch.equal(res["out"], want_out):
            raise Wrong(
                f"AllToAll's output on rank {rank} ({when}) is not the rows the ranks sent it, in rank order."
            )
        if not res["graph"]:
            raise Wrong(
                f"AllToAll's output on rank {rank} has no autograd graph: call it through AllToAll.apply, a "
                "torch.autograd.Function, so that its backward runs."
            )
        if not _close(res["x_grad"], want_grad):
            got = "no gradient" if res["x_grad"] is None else "a wrong gradient"
            raise Wrong(
                f"after a backward through AllToAll ({when}), rank {rank}'s input has {got}: each row's "
                "gradient is computed on the rank the row went to, and must come back to the row."
            )
        back = [c for c in res["bwd"] if c["op"] == "all_to_all_single" and c["float"]]
        if not any(c["send"] == recv and c["recv"] == send for c in back):
            raise Wrong(
                f"AllToAll's backward on rank {rank} moved split sizes "
                f"{[(c['send'], c['recv']) for c in back]} with dist.all_to_all_single: only the "
                "gradients of the rows that arrived may travel, each to the rank its row came from (no "
                "padding, nothing gathered)."
            )


def _moves(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in calls if c["op"] == "all_to_all_single" and c["float"]]


@exercise(
    "05f.1",
    "a differentiable all-to-all, then dispatch and combine",
    task="`AllToAll` (a `torch.autograd.Function`, `AllToAll.apply(x, recv_split, send_split)`; its forward, "
    "section 2's exchange, is given) with its `backward` written: the gradients of the rows that arrived "
    "must reach `x` on the ranks they came from; and `dispatch_combine(x, idx, gate, local_experts, rank, "
    "world_size)` → this rank's MoE output for top-k routing (`idx`, `gate`: `[T, k]`), experts split "
    "evenly over the ranks. On 3 gloo ranks, with sizes and float64 weights drawn at grading: `AllToAll` "
    "alone on uneven splits (rows and gradients), then `dispatch_combine` for top-1 and top-2 (output and "
    "the gradients of tokens, router and experts equal the unsplit layer). `torch.distributed` is wrapped, "
    "forward and backward: the float rows move only with `all_to_all_single`, exactly the rows given (for "
    "`dispatch_combine`: the routing's, in one exchange there and one back; the counts and the expert ids "
    "may travel in exchanges of their own); torch's ready-made differentiable all-to-alls are refused.",
    hint="AllToAll.backward(ctx, grad): the gradient of each row that arrived belongs to the rank that sent "
    "the row, so it goes back by the same exchange with the two split lists (saved in ctx.splits) swapped. "
    "backward returns one value per input of forward: the gradients that come back, for x, then None for "
    "recv_split and None for send_split. "
    "dispatch_combine: make one row per (token, chosen expert) pair (idx.reshape(-1): pair i is token i // "
    "k), order the pairs by destination rank (expert // experts per rank), exchange the counts with "
    "all_to_all_single, send the rows with AllToAll.apply(rows, recv_counts, send_counts) (and the expert "
    "ids, so the receiver knows which local expert runs each row), run the local experts, send the results "
    "back with the two split lists swapped, put each result back at its pair's position (undo the ordering) "
    "and sum each token's k results weighted by its gates.",
    forbid=("all_to_all_single_autograd",),
)
def grade_dispatch_combine(all_to_all: Any, fn: Any) -> str:
    """3 gloo ranks: AllToAll alone on uneven splits, then top-1 and top-2 routing drawn at grading time:
    values, gradients, communication forward and backward."""
    if not hasattr(all_to_all, "apply"):
        raise Wrong(
            f"pass the class AllToAll (a torch.autograd.Function) first, not {type(all_to_all).__name__}"
        )
    if not callable(fn):
        raise Wrong(f"pass the function dispatch_combine second, not {type(fn).__name__}")
    seed = 1000 + secrets.randbelow(10**6)
    ranks = run_ranks(_rank, 3, all_to_all, fn, seed)
    n = len(ranks)
    _check_all_to_all(ranks, seed)
    case = _case(seed, n)
    for i, k in enumerate((1, 2)):
        ref = _reference(case, k)
        when = f"with top-{k} routing"
        for rank, res in enumerate(r["moe"][i] for r in ranks):
            if res["ready_made"]:
                raise Wrong(f"dispatch_combine, {when}: {_READY_MADE}")
            if "bad_shape" in res:
                raise Wrong(
                    f"{when}, rank {rank} returned {res['bad_shape']}, not a tensor of shape {res['want']} "
                    "(one row per token of the rank, in the tokens' order)."
                )
            if res["raised"]:
                raise Wrong(f"{when}, dispatch_combine on rank {rank} raised in the {res['raised']}")
            calls = res["calls"] + res["backward_calls"]
            others = sorted({c["op"] for c in calls if c["op"] != "all_to_all_single"})
            if others:
                raise Wrong(
                    f"{when}, rank {rank} called dist.{', dist.'.join(others)}: in expert parallelism "
                    "the tokens travel only to the ranks of their experts and back, with "
                    "dist.all_to_all_single; no rank gathers all tokens or all experts."
                )
            moves = _moves(res["calls"])
            if not moves:
                raise Wrong(
                    f"{when}, rank {rank} never sent a float tensor with dist.all_to_all_single: the "
                    "tokens must travel to the experts' ranks, with your AllToAll."
                )
            recv = [ranks[src]["moe"][i]["send"][rank] for src in range(n)]
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
                    f"{when}, rank {rank}'s output has no autograd graph: send the rows with your "
                    "AllToAll.apply so that the gradients travel back too."
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
            moved_back = _moves(res["backward_calls"])
            if not (
                any(c["send"] == res["send"] and c["recv"] == recv for c in moved_back)
                and any(c["send"] == recv and c["recv"] == res["send"] for c in moved_back)
            ):
                raise Wrong(
                    f"{when}, rank {rank}'s backward moved split sizes "
                    f"{[(c['send'], c['recv']) for c in moved_back]} with dist.all_to_all_single: the "
                    "gradients must travel the routing's two exchanges in reverse, with exactly the "
                    "routing's split sizes."
                )
        routers = [r["moe"][i]["router_grad"] for r in ranks if r["moe"][i]["router_grad"] is not None]
        if not routers or not _close(sum(routers), ref["router_grad"]):
            raise Wrong(
                f"{when}, the router's gradient (summed over the ranks) differs from the unsplit "
                "layer's: each token's results must be weighted by the gates passed in."
            )
    return (
        f"AllToAll moves the rows and their gradients on uneven splits; outputs and gradients equal the "
        f"unsplit layer for top-1 and top-2 routing on {n} ranks, the tokens sent there and back with "
        "all_to_all_single and the routing's split sizes, forward and backward"
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


def _first_difference(idx: torch.Tensor, n_experts: int, capacity_factor: float, got: torch.Tensor) -> str:
    """The first (token, slot) pair, in the priority order, that ``got`` gets wrong, and why."""
    n_tokens, k = idx.shape
    capacity = math.ceil(capacity_factor * n_tokens * k / n_experts)
    want = _kept(idx, n_experts, capacity_factor)
    used = [0] * n_experts
    for slot in range(k):
        for t in range(n_tokens):
            e = int(idx[t, slot])
            if bool(got[t, slot]) != bool(want[t, slot]):
                should, given = bool(want[t, slot]), bool(got[t, slot])
                return (
                    f"for idx={idx.tolist()}, {n_experts} experts and capacity factor {capacity_factor} "
                    f"(capacity {capacity}: at most {capacity} (token, slot) pairs per expert), you keep "
                    f"{got.int().tolist()}. The first pair that differs, in the priority order (every first "
                    f"choice in token order, then every second choice): token {t}, slot {slot}, for expert "
                    f"{e}, which by then holds {used[e]} of its {capacity} pairs, so it should be {should}, "
                    f"not {given}."
                )
            used[e] += bool(want[t, slot])
    raise AssertionError("no difference")  # pragma: no cover


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
    task="`kept(idx, n_experts, capacity_factor)` → a `[T, k]` boolean tensor, `True` where the (token, "
    "slot) pair is processed when each expert takes at most ⌈c·T·k/E⌉ pairs in section 1's priority order. "
    "Compared exactly on 3 fixed routings and 20 random ones drawn at grading (k = 1 or 2, 2 to 6 experts, "
    "factors 0.5 to 2); calling the grader's own reference is refused.",
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
            raise Wrong(_first_difference(idx, n_experts, factor, got))
    return "the kept slots match experts of capacity ceil(c·T·k/E), first choices first, on 23 routings."
