"""Used by notebook 05g's exercises: a tensor-parallel plan with Megatron's traffic (05g.1), the exact
activation bytes of a Llama block (05g.2) and the state one rank holds (05g.3), all run as one rank of a
fake job (:func:`mgpu_helpers.scale.fake_world`) on Llama-shaped blocks drawn at grading time.

**05g.1.** ``plan()`` must return a ``parallelize_module`` plan for one block. On 2 blocks of a random
Llama shape, TP over 2 or 4 ranks of a ``(2, tp)`` mesh, one training step: every projection must hold
Megatron's slice (Q, K, V, ``w1``, ``w3`` by rows, ``wo`` and ``w2`` by columns, the norms whole), no
all-gather or reduce-scatter may run (no sequence parallelism asked), and the all-reduces must send what
the planner's TP term says: 2 forward and 2 backward per block. The package's own ``tp_plan`` is the
answer key and is refused.

**05g.2.** ``block_activation_bytes(shape, seq, batch, tp)`` must give the fp32 bytes one block keeps for
backward on one TP rank (plan: ``mgpu_helpers.scale.tp_plan()``, no sequence parallelism), equal to the
bytes measured here with :class:`~mgpu_helpers.scale.SavedActivations` on 6 cases (hidden width, heads,
K/V heads, MLP width, tokens, batch, TP degree drawn at grading time). Measuring instead of counting
(``saved_tensors_hooks``, ``SavedActivations``, this module's own measurement) is refused.

**05g.3.** ``rank_state_bytes(shape, layout, blocks)`` must give the parameter, gradient and Adam bytes
(fp32) that one rank holds for ``blocks`` blocks of its pipeline stage, equal to what
:func:`~mgpu_helpers.scale.dry_run` measures on 6 layouts (DP, TP, ZeRO-2, ZeRO-3, TP × FSDP, PP × FSDP)
of shapes drawn at grading time; a function that runs a fake job to find out is refused.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from typing import Any

import torch

from ..exercises import Wrong, calls_during, exercise

_PROJECTIONS = {  # name → (dimension a Megatron rank splits, 0: rows = output features, 1: columns)
    "attention.wq": 0,
    "attention.wk": 0,
    "attention.wv": 0,
    "attention.wo": 1,
    "feed_forward.w1": 0,
    "feed_forward.w3": 0,
    "feed_forward.w2": 1,
}


def _shape(rng: random.Random, tp: int, split: int = 1) -> Any:
    """A Llama-shaped block whose heads, K/V heads and MLP width all divide by ``tp``, and each of whose
    TP slices divides again by ``split`` (so that FSDP over ``split`` ranks pads nothing)."""
    from ..planner import Transformer

    heads = rng.choice([4, 8])
    kv_heads = rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0 and d % tp == 0])
    head_dim = rng.choice([d for d in (8, 16, 32) if d % split == 0])  # every slice of heads divides too
    ffn = tp * split * rng.randint(max(2, 6 // split), 40 // split)
    return Transformer("case", 1, heads * head_dim, heads, 0, kv_heads=kv_heads, ffn=ffn)


def _tp_step(plan_for: Callable[[], Any], shape: Any, tp: int, rank: int, seq: int, batch: int, blocks: int):
    """One step of ``blocks`` blocks under TP as rank ``rank`` of a (2, tp) fake job: the model, the
    collectives seen and the activation bytes of the forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from ..collectives import CollectiveSpy
    from ..scale import LlamaBlocks, SavedActivations, fake_world

    with fake_world(2 * tp, rank=rank):
        mesh = init_device_mesh("cpu", (2, tp), mesh_dim_names=("dp", "tp"))
        with torch.device("meta"):
            model = LlamaBlocks(shape, blocks)
        for block in model.layers:
            plan = plan_for()
            if not isinstance(plan, dict):
                raise Wrong(
                    f"plan() must return a dict of module name → ParallelStyle, not {type(plan).__name__}"
                )
            parallelize_module(block, mesh["tp"], plan)
        model.to_empty(device="cpu")
        model.init_weights()
        x = torch.randn(batch, seq, shape.hidden, requires_grad=True)
        with CollectiveSpy() as spy:
            with SavedActivations(model) as saved:
                loss = model(x).sum()
            loss.backward()
        return model, spy, saved.bytes


def _local_shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple((t.to_local() if hasattr(t, "to_local") else t).shape)


@exercise(
    "05g.1",
    "a tensor-parallel plan with Megatron's traffic",
    task="`plan()` → a new `parallelize_module` plan (module name → ParallelStyle) for one Llama block on "
    "each call: `per_projection_plan()`'s shards with Megatron's traffic. Applied in a fake job to 2 blocks "
    "of a random Llama shape, TP 2 then 4 on a (2, tp) mesh, one training step: each weight's local shape, "
    "the RMSNorms whole, only all-reduces, their bytes equal to the planner's TP term. `tp_plan` is "
    "refused.",
    hint="the extra all-reduces come from each ColwiseParallel wrapping its input for itself: give the "
    "attention and the MLP modules their input once, already as a replicated DTensor (torch has a "
    "ParallelStyle that prepares a module's inputs), so that autograd sums the projections' input "
    "gradients before the one all-reduce.",
    forbid=("tp_plan",),
)
def grade_plan(plan: Any) -> str:
    """2 blocks of a random Llama shape, TP 2 or 4: shards, collectives and bytes against the planner."""
    if not callable(plan):
        raise Wrong(
            f"pass the function plan itself (it returns a new plan each call), not {type(plan).__name__}"
        )
    from .. import scale
    from ..collectives import ring_bytes_sent
    from ..planner import Layout, Workload, communication_bytes

    rng = random.Random(secrets.randbits(32))
    for tp in (2, 4):
        shape, seq = _shape(rng, tp), rng.randint(4, 16)
        rank = rng.randrange(2 * tp)
        (model, spy, _), answer_key = calls_during(
            _tp_step, lambda code: code is scale.tp_plan.__code__, plan, shape, tp, rank, seq, 1, 2
        )
        if answer_key:
            raise Wrong("your plan calls mgpu_helpers.scale.tp_plan: write the plan's entries yourself.")
        where = f"(hidden {shape.hidden}, {shape.heads} heads, {shape.kv_heads} K/V heads, TP {tp})"
        for name, dim in _PROJECTIONS.items():
            weight = model.layers[0].get_submodule(name).weight
            want = list(weight.shape)
            want[dim] //= tp
            if _local_shape(weight) != tuple(want):
                how = (
                    "Q, K, V, w1 and w3 by output features (rows)"
                    if dim == 0
                    else "wo and w2 by inputs (columns)"
                )
                raise Wrong(
                    f"{where}: {name}'s weight is {_local_shape(weight)} on a rank, not {tuple(want)}: {how}."
                )
        for norm in ("attention_norm", "ffn_norm"):
            if _local_shape(model.layers[0].get_submodule(norm).weight) != (shape.hidden,):
                raise Wrong(
                    f"{where}: leave the RMSNorm weights whole on every rank (no sequence parallelism here)."
                )
        others = sorted({c.op for c in spy.calls} - {"all_reduce"})
        if others:
            raise Wrong(
                f"{where}: your plan also runs {', '.join(others)}: Megatron's TP (no sequence "
                "parallelism) only all-reduces: after wo and w2 in the forward, each sub-layer's input "
                "gradient in the backward."
            )
        blocks = shape.only_blocks(2)
        work = Workload(seq_len=seq, micro_batch=1, global_batch=2, precision="fp32", recompute="selective")
        planned = communication_bytes(blocks, work, Layout(dp=2, tp=tp))["TP"]
        sent = sum(ring_bytes_sent(c.op, c.nbytes, tp) for c in spy.calls)
        if sent != planned:
            raise Wrong(
                f"{where}: {spy.count('all_reduce')} all-reduces for 2 blocks sent {sent:,.0f} B; "
                f"Megatron's 2 forward and 2 backward per block send {planned:,} B."
            )
    return "shards as Megatron's on TP 2 and 4, 4 all-reduces per block, bytes equal to the planner's TP term"


def _measured(shape: Any, seq: int, batch: int, tp: int, rank: int) -> int:
    """What one block keeps for backward on ``rank`` of a (2, tp) job, with the package's TP plan."""
    from ..scale import tp_plan

    plan = tp_plan if tp > 1 else dict
    return _tp_step(plan, shape, tp, rank, seq, batch, 1)[2]


@exercise(
    "05g.2",
    "the bytes a Llama block keeps for backward",
    task="`block_activation_bytes(shape, seq, batch, tp)` → the fp32 bytes (an int) one Llama block keeps "
    "for backward on one rank of a `tp`-way group under `tp_plan()`, counted from the shape. Compared "
    "exactly with what `SavedActivations` measures on 6 cases drawn at grading (random shapes and lengths, "
    "batches 1 to 3, TP 1, 2 and 4); measuring a run instead is refused.",
    hint="go through section 5's list of saved tensors one by one and write each one's size from the shape's "
    "fields (hidden, heads, kv_heads, ffn) and seq; then ask of each whether TP splits it (it is computed "
    "from split weights) and whether it grows with the batch (not every one does).",
    forbid=("SavedActivations", "saved_tensors_hooks", "_measured", "_tp_step"),
)
def grade_activations(fn: Any) -> str:
    """6 random Llama shapes, tokens, batches and TP degrees, each measured here."""
    if not callable(fn):
        raise Wrong(f"pass the function block_activation_bytes itself, not {type(fn).__name__}")
    from .. import scale

    rng = random.Random(secrets.randbits(32))
    watched = {scale.SavedActivations.__enter__.__code__, _measured.__code__, _tp_step.__code__}
    for i in range(6):
        tp = (1, 2, 4)[i % 3]
        shape, seq, batch = _shape(rng, tp), rng.randint(3, 20), 1 + i % 3
        got, measuring = calls_during(fn, lambda code: code in watched, shape, seq, batch, tp)
        if measuring:
            raise Wrong(
                "block_activation_bytes measures a run: count the saved tensors from the shape instead."
            )
        want = _measured(shape, seq, batch, tp, rng.randrange(2 * tp))
        if got != want:
            raise Wrong(
                f"hidden {shape.hidden}, {shape.heads} heads, {shape.kv_heads} K/V heads, ffn {shape.ffn}, "
                f"seq {seq}, batch {batch}, TP {tp}: you count {got!r} B, the block keeps {want:,} B "
                f"({'too many' if isinstance(got, (int, float)) and got > want else 'check each term'})."
            )
    return "exact on 6 shapes drawn now (TP 1, 2 and 4, batches 1 to 3)"


@exercise(
    "05g.3",
    "the state one rank holds, before you run it",
    task='`rank_state_bytes(shape, layout, blocks)` → a dict of the fp32 `"parameters"`, `"gradients"` '
    'and `"optimizer"` (Adam) bytes one rank holds for `blocks` blocks of its stage. Compared exactly '
    "with what `dry_run` measures on a random rank of 6 layouts (DP, TP, ZeRO-2, ZeRO-3, TP × FSDP, PP × "
    "FSDP), shapes and 1 to 3 blocks drawn at grading; running a fake job instead is refused.",
    hint="start from the planner's state_bytes and look for what it leaves out, all of it shown in "
    "section 4: what Adam keeps besides its two moments, which weights TP leaves whole (and so who "
    "shards them), and what FSDP2 keeps between steps when it does not reshard after the forward.",
)
def grade_state(fn: Any) -> str:
    """6 layouts of 4 to 8 ranks, shapes and block counts drawn now, each measured with dry_run."""
    if not callable(fn):
        raise Wrong(f"pass the function rank_state_bytes itself, not {type(fn).__name__}")
    from ..planner import Layout
    from ..scale import dryrun, world

    layouts = (
        Layout(dp=4),
        Layout(dp=2, tp=2),
        Layout(dp=4, zero=2),
        Layout(dp=4, zero=3),
        Layout(dp=4, tp=2, zero=3),
        Layout(dp=2, pp=2, zero=3),
    )
    watched = {dryrun.dry_run.__code__, world.fake_world.__wrapped__.__code__}
    rng = random.Random(secrets.randbits(32))
    for layout in layouts:
        shape, blocks = _shape(rng, layout.tp, split=4), rng.randint(1, 3)
        got, running = calls_during(fn, lambda code: code in watched, shape, layout, blocks)
        if running:
            raise Wrong("rank_state_bytes runs a fake job: count the bytes from the shape and the layout.")
        rank = rng.randrange(layout.n_gpus)
        run = dryrun.dry_run(shape, layout, blocks=blocks, seq=4, rank=rank)
        want = {k: run.measured[k] for k in ("parameters", "gradients", "optimizer")}
        if not isinstance(got, dict) or set(got) != set(want):
            raise Wrong(f"return a dict with the keys {sorted(want)}, not {got!r}")
        for key, value in want.items():
            if got[key] != value:
                raise Wrong(
                    f"{layout.name}, {blocks} block(s) of hidden {shape.hidden}, {shape.heads} heads, "
                    f"{shape.kv_heads} K/V heads, ffn {shape.ffn}: {key}: you count {got[key]!r} B, "
                    f"rank {rank} holds {value:,} B."
                )
    return "exact on 6 layouts (DP, TP, ZeRO-2, ZeRO-3, TP × FSDP, PP × FSDP), shapes drawn now"
