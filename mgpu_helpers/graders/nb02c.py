"""Used by notebook 02c's exercises: a vocabulary-parallel embedding written by hand (02c.1) and a
tensor-parallel plan for ``parallelize_module`` (02c.2), each run on two gloo processes and compared with
the unsplit model.

02c.1 draws a fresh random table on every call (nothing importable rebuilds it), gives rank ``r`` rows
``r·V/2 … (r+1)·V/2 - 1`` of it, calls the student's ``vocab_parallel_embedding(ids, weight_shard)`` with
ids from both halves, back-propagates a random gradient, and compares each rank's output and
``weight_shard.grad`` with ``nn.Embedding`` on the whole table (larger than the output).
:class:`~mgpu_helpers.collectives.CollectiveSpy` notes every collective and its bytes: nothing may gather,
scatter or broadcast rows, and the forward must run exactly one all-reduce, of the output's bytes, not
the table's; a collective that autograd goes through without knowing it (a plain ``dist.all_reduce``,
which PyTorch warns about) is refused, and so is a lookup done by DTensor (the exercise is the by-hand
piece that DTensor's ``Shard(0)`` embedding does for you).

02c.2 builds a small language-model-shaped network (embedding, 3 residual MLP blocks, head) with fresh
random weights, calls the student's ``shard_model(model, mesh)`` on a 1-D CPU mesh, and checks that
every weight is a sharded DTensor, that the logits (full, on every rank) and all gradients equal the
unsplit model's, and, with ``CommDebugMode``, that each block's forward runs a single collective. The
embedding must be split by vocabulary rows (``Shard(0)``), as the lesson and 02c.1 teach: a column-split
embedding whose output is gathered also gives the right logits but skips the lesson.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ..collectives import CollectiveSpy
from ..exercises import Wrong, exercise
from ._ranks import run_ranks

_NPROCS = 2


class _DTensorSeen(TorchFunctionMode):
    """Notes whether any torch function below it is handed or returns a DTensor."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        from torch.distributed.tensor import DTensor

        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, DTensor) for t in tree_leaves((args, kwargs, out))):
            self.seen = True
        return out


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _log(spy: CollectiveSpy) -> list[tuple[str, int]]:
    return [(c.op, c.nbytes) for c in spy.calls]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


# --- 02c.1: a vocabulary-parallel embedding ---------------------------------------------------------

_V, _H = 64, 8  # the table (2,048 B) is larger than the output (672 B)


def _embedding_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full table, ids that use both halves of it, and the gradient arriving from above."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(_V, _H, generator=gen)
    ids = torch.randint(0, _V, (3, 7), generator=gen)
    ids[0, :4] = torch.tensor([0, _V // 2 - 1, _V // 2, _V - 1])  # both edges of both halves
    upstream = torch.randn(3, 7, _H, generator=gen)
    return table, ids, upstream


def _embedding_rank(rank: int, world_size: int, fn: Callable[..., Any], seed: int) -> dict[str, Any]:
    table, ids, upstream = _embedding_case(seed)
    weight_shard = table.chunk(world_size, 0)[rank].clone().requires_grad_()
    with _DTensorSeen() as dtensor, CollectiveSpy() as fwd:
        out = fn(ids.clone(), weight_shard)
    if not isinstance(out, torch.Tensor):
        return {"type": type(out).__name__}
    if dtensor.seen:
        return {"dtensor": True}
    result: dict[str, Any] = {"out": out.detach().clone(), "fwd": _log(fwd), "graph": out.requires_grad}
    if out.requires_grad and out.shape == upstream.shape:
        with warnings.catch_warnings(record=True) as caught, CollectiveSpy() as bwd:
            warnings.simplefilter("always")
            out.backward(upstream)
        result["bwd"] = _log(bwd)
        result["untracked"] = any("autograd kernel was not registered" in str(w.message) for w in caught)
        result["grad"] = None if weight_shard.grad is None else weight_shard.grad.clone()
    return result


@exercise(
    "02c.1",
    "a vocabulary-parallel embedding",
    task="vocab_parallel_embedding(ids, weight_shard) returns on every rank what F.embedding(ids, "
    "full_table) would (shape ids.shape + (h,)), with autograd reaching weight_shard, on plain tensors (no "
    "DTensor). On 2 gloo ranks with a fresh 64 × 8 table and ids from both halves, outputs and each "
    "weight_shard.grad are compared with nn.Embedding; CollectiveSpy checks the collectives and their "
    "bytes, and no rank may copy another's rows.",
    hint="a rank can look up only the ids that fall in its own rows, numbered from 0 inside its shard; "
    "every other token must add nothing, and the ranks' partial results add up like a row-parallel "
    "layer's partial sums, in an all-reduce that autograd can go through.",
)
def grade_vocab_parallel_embedding(fn: Callable[..., Any]) -> str:
    if not callable(fn):
        raise Wrong(f"pass the function itself, not {type(fn).__name__}")
    seed = _fresh_seed()
    results = run_ranks(_embedding_rank, _NPROCS, fn, seed, timeout_s=60.0)
    table, ids, upstream = _embedding_case(seed)
    full = table.clone().requires_grad_()
    want = F.embedding(ids, full)
    want.backward(upstream)
    rows = _V // _NPROCS
    for rank, res in enumerate(results):
        if "type" in res:
            raise Wrong(f"rank {rank} returned a {res['type']}, not a tensor of embeddings.")
        if "dtensor" in res:
            raise Wrong(
                f"rank {rank}'s lookup went through DTensor, which does this exercise's work for you: "
                "write it by hand on plain tensors."
            )
        if tuple(res["out"].shape) != tuple(want.shape):
            raise Wrong(
                f"rank {rank} returned shape {tuple(res['out'].shape)}; the embeddings of ids of shape "
                f"{tuple(ids.shape)} have shape {tuple(want.shape)}."
            )
        copied = [(op, size) for op, size in res["fwd"] if not op.startswith("all_reduce")]
        if copied:
            raise Wrong(
                f"rank {rank}'s forward ran {copied[0][0]} ({copied[0][1]:,} B): it copies what another rank "
                "holds, and each rank may use only its own rows."
            )
        out_bytes = want.numel() * want.element_size()
        if [size for _, size in res["fwd"]] != [out_bytes]:
            ran = ", ".join(f"{op} of {size:,} B" for op, size in res["fwd"]) or "no collective"
            raise Wrong(
                f"rank {rank}'s forward ran {ran}; a row-parallel lookup needs one all-reduce of the "
                f"output's {out_bytes:,} B, and the table's rows are not the ranks' to exchange."
            )
        bad = ~torch.isclose(res["out"], want.detach(), rtol=1e-4, atol=1e-5).all(-1)
        if bad.any():
            token = int(ids[bad][0])
            owner = token // rows
            raise Wrong(
                f"rank {rank}'s output differs from nn.Embedding on the whole table for {int(bad.sum())} of "
                f"{ids.numel()} tokens, e.g. id {token}, which lies in rank {owner}'s rows."
            )
        if not res["graph"]:
            raise Wrong(
                f"rank {rank}'s output does not require grad: autograd cannot reach weight_shard through it."
            )
        if res.get("untracked"):
            raise Wrong(
                f"rank {rank}'s backward went through a collective that autograd does not know (PyTorch "
                "warns that this 'may lead to silently incorrect behavior' and will stop allowing it)."
            )
        grad, ref = res.get("grad"), full.grad.chunk(_NPROCS, 0)[rank]
        if grad is None:
            raise Wrong(
                f"after backward, rank {rank}'s weight_shard.grad is None: no gradient reached the shard."
            )
        if not _close(grad, ref):
            off = (grad - ref).abs().sum(-1).nonzero().flatten().tolist()
            raise Wrong(
                f"rank {rank}'s weight_shard.grad differs from its slice of the full table's gradient in "
                f"{len(off)} of its {rows} rows (its local rows {off[:4]})."
            )
    return (
        f"on {_NPROCS} gloo ranks the embeddings and every shard's gradient equal nn.Embedding's; "
        "the forward ran one all-reduce of the output's bytes, by hand, and copied no rows between ranks."
    )


# --- 02c.2: a parallelize_module plan -----------------------------------------------------------------

_VOCAB, _HIDDEN, _BLOCKS = 32, 16, 3


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(_HIDDEN, 4 * _HIDDEN), nn.Linear(4 * _HIDDEN, _HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.relu(self.up(x)))


class _Net(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(_VOCAB, _HIDDEN)
        self.blocks = nn.Sequential(*[_Block() for _ in range(_BLOCKS)])
        self.head = nn.Linear(_HIDDEN, _VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


def _weights() -> list[str]:
    names = ["embed.weight"]
    names += [f"blocks.{i}.{part}.weight" for i in range(_BLOCKS) for part in ("up", "down")]
    return [*names, "head.weight"]


def _plan_case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, _VOCAB, (2, 6), generator=gen), torch.randn(2, 6, _VOCAB, generator=gen)


def _plan_rank(rank: int, world_size: int, fn: Callable[..., Any], seed: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (world_size,))
    model = _Net(seed)
    returned = fn(model, mesh)
    if isinstance(returned, nn.Module):
        model = returned
    params = dict(model.named_parameters())
    unsharded = [
        n
        for n in _weights()
        if not isinstance(params[n], DTensor)
        or params[n].to_local().numel() * world_size != params[n].numel()
    ]
    if unsharded:
        return {"unsharded": unsharded}
    embed_split = [p.dim for p in params["embed.weight"].placements if p.is_shard()]
    if embed_split != [0]:
        return {"embed": str(tuple(params["embed.weight"].placements))}
    ids, upstream = _plan_case(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CommDebugMode's module hooks warn about inputs without gradients
        with CommDebugMode() as debug:
            logits = model(ids)
    blocks = {}
    for i in range(_BLOCKS):
        counts = next(
            (c["forward"] for m, c in debug.comm_module_counts.items() if m.endswith(f"blocks.{i}")), {}
        )
        blocks[i] = {str(op).split(".")[-1]: n for op, n in counts.items() if n}
    if isinstance(logits, DTensor):
        logits = logits.full_tensor()
    result: dict[str, Any] = {"logits": logits.detach().clone(), "blocks": blocks}
    if logits.shape == upstream.shape:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the same hooks fire again in the backward
            logits.backward(upstream)
        result["grads"] = {
            n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
    return result


@exercise(
    "02c.2",
    "a tensor-parallel plan",
    task="shard_model(model, mesh) applies parallelize_module with a plan that splits every weight (embed "
    "by vocabulary rows, each block's up and down, head) so that the model returns the full logits on every "
    "rank. On 2 gloo ranks (3 blocks, fresh random weights) every weight must be sharded, logits and "
    "gradients equal the unsplit model's, and CommDebugMode counts each block's forward collectives.",
    hint="give each layer a style by its role: which layers make a slice of the features and which take "
    "one in; then ask what layout the ids have on entry (what each rank holds of them) and what layout "
    "the logits must have on exit, and compare with each style's defaults.",
)
def grade_shard_model(fn: Callable[..., Any]) -> str:
    if not callable(fn):
        raise Wrong(f"pass the function itself, not {type(fn).__name__}")
    seed = _fresh_seed()
    results = run_ranks(_plan_rank, _NPROCS, fn, seed, timeout_s=60.0)
    ids, upstream = _plan_case(seed)
    model = _Net(seed)
    want = model(ids)
    want.backward(upstream)
    for rank, res in enumerate(results):
        if "unsharded" in res:
            raise Wrong(
                f"on rank {rank} {', '.join(res['unsharded'][:3])} "
                f"{'is' if len(res['unsharded']) == 1 else 'are'} not split over the mesh "
                "(still whole on every rank)."
            )
        if "embed" in res:
            raise Wrong(
                f"on rank {rank} embed.weight has placements {res['embed']}: each rank holds a slice of "
                "every token's embedding dimensions. Split the embedding as the lesson does (§3's table, "
                "exercise 02c.1): by vocabulary rows, each rank looking up only the ids it holds."
            )
        got = res["logits"]
        if got.dim() == 3 and got.shape[1] == want.shape[1] * _NPROCS:
            raise Wrong(
                f"rank {rank}'s logits have shape {tuple(got.shape)}: the embedding treated the ids as "
                "sharded (RowwiseParallel's default input_layouts is Shard(-1)); they arrive whole on every "
                "rank."
            )
        if tuple(got.shape) != tuple(want.shape):
            raise Wrong(
                f"rank {rank}'s logits have shape {tuple(got.shape)}; the unsplit model returns "
                f"{tuple(want.shape)} on every rank."
            )
        if not _close(got, want.detach()):
            raise Wrong(
                f"rank {rank}'s logits differ from the unsplit model's by up to "
                f"{(got - want).abs().max():.3g}."
            )
        for i, counts in res["blocks"].items():
            if sum(counts.values()) != 1:
                ran = ", ".join(f"{op} ×{n}" for op, n in counts.items()) or "no collective"
                raise Wrong(
                    f"block {i}'s forward ran {ran} on rank {rank}; §2's MLP needed a single collective."
                )
        grads = res.get("grads", {})
        for name, p in model.named_parameters():
            if name not in grads or not _close(grads[name], p.grad):
                raise Wrong(f"on rank {rank} the gradient of {name} differs from the unsplit model's.")
    return (
        f"every weight sharded over {_NPROCS} gloo ranks; logits and all gradients equal the unsplit "
        f"model's; one collective per block in the forward ({_BLOCKS} blocks)."
    )
