"""Used by notebook 05d's planner form ("measure this layout"): the scale lab's measurement (notebook 05g)
as one call — build Llama blocks on the meta device, shard them with torch's own APIs as ``layout``
says, materialise ONE rank's shards, run one real training step on them under the fake backend, and
count what that rank holds and sends. The cells of 05g are where this is taught; this is the plumbing
that lets a student try any other layout in seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .._checks import whole
from ..collectives import CollectiveSpy, ring_bytes_sent
from ..planner import LLAMA_8B, Layout, Transformer, Workload, communication_bytes, state_bytes
from .count import SavedActivations, local, rank_state
from .llama import LlamaBlocks, context_parallel, tp_plan
from .world import fake_world

__all__ = ["DryRun", "dry_run", "unmeasurable"]

_CATEGORIES = ("parameters", "gradients", "optimizer", "activations")


@dataclass(frozen=True)
class DryRun:
    """What rank ``rank`` of ``layout`` measured for ``blocks`` blocks of ``shape`` (fp32, Adam, one
    micro-batch of ``seq`` tokens), beside the planner's estimate of the same blocks (``planned``).

    ``measured`` and ``planned`` map ``parameters``, ``gradients``, ``optimizer`` (Adam's moments and its
    4-byte step counters) to bytes; ``measured`` also has ``activations`` (what autograd kept for the
    backward pass). ``sent`` and ``planned_sent`` are bytes this rank sends per step by kind (``DP``,
    ``TP``, ``PP``, and ``CP`` when ``layout.cp > 1``): all-reduces, all-gathers and reduce-scatters
    counted as rings over their group,
    point-to-point sends as they are; ZeRO-1's broadcasts are in ``broadcast``, which the planner counts
    as an all-gather inside ``DP``.
    """

    shape: Transformer
    layout: Layout
    rank: int
    blocks: int
    seq: int
    measured: dict[str, int]
    planned: dict[str, int]
    sent: dict[str, int]
    planned_sent: dict[str, int]
    broadcast: int
    seconds: float
    collectives: dict[str, int] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, int, int | None]]:
        """``(what, measured bytes, planner bytes or None)`` for each category and each kind of traffic."""
        out = [(k, self.measured[k], self.planned.get(k)) for k in _CATEGORIES]
        out += [(f"sends ({k})", self.sent[k], self.planned_sent.get(k)) for k in self.sent]
        if self.broadcast:
            out.append(("broadcasts (ZeRO-1)", self.broadcast, None))
        return out

    def html(self) -> str:
        """The rows as an HTML table, labelled: measured on this rank, estimated by the planner."""

        cut = f" (this rank {self.seq // self.layout.cp} of them)" if self.layout.cp > 1 else ""

        def cell(v: int | None) -> str:
            return "—" if v is None else f"{v:,}"

        body = "".join(
            f"<tr><td>{what}</td><td>{cell(m)}</td><td>{cell(p)}</td>"
            f"<td>{'' if p in (None, 0) else f'{m / p:.3f}×'}</td></tr>"
            for what, m, p in self.rows()
        )
        return (
            f"<p>Measured on rank {self.rank} of {self.layout.n_gpus} ({self.layout.name}): {self.blocks} "
            f"{self.shape.name} block(s), {self.seq} tokens{cut}, fp32 + Adam (whatever a form's precision "
            f"or sequence length say), in {self.seconds:.1f} s</p>"
            "<table><tr><th>bytes</th><th>measured</th><th>planner (estimate)</th><th>ratio</th></tr>"
            f"{body}</table>"
        )


def unmeasurable(layout: Layout) -> str | None:
    """Why :func:`dry_run` cannot measure ``layout`` (a sentence with what to pass instead), or None."""
    if layout.zero == 1 and layout.tp * layout.pp > 1:
        return (
            "ZeRO-1 here is torch's ZeroRedundancyOptimizer over all ranks: use it with dp alone, "
            "or zero=2 / zero=3 (FSDP2) beside TP or PP"
        )
    return None


def _available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _group_kinds(mesh, dp_mesh) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Process-group name -> ``"DP"``/``"TP"``/``"PP"``/``"CP"`` for the mesh's dimensions of size > 1
    (and ``"DP"`` for ``dp_mesh``, the ranks that hold the same weights: dp·cp of them)."""
    kinds = {}
    for dim, kind in (("pp", "PP"), ("dp", "DP"), ("cp", "CP"), ("tp", "TP")):
        if mesh[dim].size() > 1:
            kinds[mesh[dim].get_group().group_name] = kind
    if dp_mesh.size() > 1:
        kinds[dp_mesh.get_group().group_name] = "DP"
    return kinds


def dry_run(
    shape: Transformer = LLAMA_8B,
    layout: Layout | None = None,
    *,
    blocks: int = 1,
    seq: int = 16,
    rank: int = 0,
    sequence_parallel: bool = False,
) -> DryRun:
    """Measure one rank of ``layout`` (default: DP over 8) running ``blocks`` blocks of ``shape`` per
    pipeline stage; ZeRO-1 is torch's ``ZeroRedundancyOptimizer``, ZeRO-2/3 FSDP2's ``fully_shard``
    (each block its own unit; ZeRO-2 without resharding after the forward), TP the Megatron plan of
    :func:`~mgpu_helpers.scale.tp_plan`, CP Llama 3's all-gathered keys and values
    (:func:`~mgpu_helpers.scale.llama.context_parallel`; ``seq`` is then the whole sequence, of which
    this rank holds ``seq / cp`` tokens, and ZeRO and DP span the dp·cp ranks that hold the same
    weights). Collectives move no data (torch's fake backend): count bytes here, never values."""
    layout = Layout(dp=8) if layout is None else layout
    if not isinstance(shape, Transformer) or not isinstance(layout, Layout):
        raise TypeError("pass a planner Transformer (e.g. LLAMA_8B) and a planner Layout (e.g. Layout(dp=8))")
    whole("blocks", blocks, 1, "1")
    whole("seq", seq, 1, "16")
    tp, dp, pp, cp, zero = layout.tp, layout.dp, layout.pp, layout.cp, layout.zero
    reason = unmeasurable(layout)
    if reason:
        raise ValueError(reason)
    kv = shape.kv_heads or shape.heads
    if tp > 1 and (shape.heads % tp or kv % tp):
        raise ValueError(
            f"tp={tp} must divide heads={shape.heads} and kv_heads={kv}: each rank its own heads"
        )
    if seq % cp:
        raise ValueError(f"cp={cp} must divide seq={seq}: each context-parallel rank holds seq / cp tokens")
    tokens = seq // cp  # this rank's part of the sequence
    if sequence_parallel and (tp == 1 or tokens % tp):
        raise ValueError(
            f"sequence_parallel needs tp > 1 dividing the {tokens} tokens of this rank (each then s/tp)"
        )

    # The fake all-gather hands FSDP2 a whole block (of this rank's TP shard), so the forward needs the
    # block's fp32 weights and, in the backward, its gradients: 8 B per parameter (16 with Adam unsharded).
    need = blocks * shape.layer_params // tp * (8 if zero >= 2 else 16)
    free = _available_bytes()
    if need > free // 2:
        raise MemoryError(
            f"this run would need about {need / 2**30:.1f} GiB and the machine has {free / 2**30:.1f} GiB "
            "available: pass fewer blocks, a larger tp, zero=2 or 3, or a smaller shape (LLAMA_8B)"
        )

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor.parallel import parallelize_module

    start = time.perf_counter()
    with fake_world(layout.n_gpus, rank):
        mesh = init_device_mesh("cpu", (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
        same_weights = mesh["dp", "cp"]._flatten("dp_cp") if cp > 1 else mesh["dp"]  # ZeRO's and DP's ranks
        stage = mesh.get_coordinate()[0]
        stages = dist.get_process_group_ranks(mesh["pp"].get_group()) if pp > 1 else [rank]
        with torch.device("meta"):
            model = LlamaBlocks(shape, blocks)
        for blk in model.layers:
            if tp > 1:
                parallelize_module(blk, mesh["tp"], tp_plan(sequence_parallel=sequence_parallel))
            if cp > 1:
                context_parallel(blk, mesh["cp"].get_group())
            if zero >= 2:
                fully_shard(blk, mesh=same_weights, reshard_after_forward=zero == 3)
        if zero >= 2:
            fully_shard(model, mesh=same_weights, reshard_after_forward=zero == 3)
        model.to_empty(device="cpu")
        model.init_weights()
        params = list(model.parameters())
        if zero == 1:
            optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-4)
        else:
            optimizer = torch.optim.Adam(params, lr=1e-4)
        x = torch.randn(1, tokens // tp if sequence_parallel else tokens, shape.hidden)
        with CollectiveSpy() as spy:
            if stage > 0:
                dist.recv(x, src=stages[stage - 1])  # nothing arrives: the fake backend leaves x as it is
            x.requires_grad_()
            with SavedActivations(model) as saved:
                y = model(x)
            if stage < pp - 1:
                dist.send(local(y).detach(), dst=stages[stage + 1])
                grad = torch.zeros_like(local(y))
                dist.recv(grad, src=stages[stage + 1])
                y.backward(grad)
            else:
                y.sum().backward()
            if stage > 0:
                dist.send(x.grad, dst=stages[stage - 1])
            # plain data parallelism: all-reduce the gradients by hand (DDP stops under the fake backend)
            if zero < 2 and dp * cp > 1:
                group = same_weights.get_group()
                for p in params:
                    dist.all_reduce(local(p.grad), group=group)
            optimizer.step()
        measured = rank_state(model, optimizer) | {"activations": saved.bytes}
        kinds = _group_kinds(mesh, same_weights)
    seconds = time.perf_counter() - start

    sent = {"DP": 0, "TP": 0, "PP": 0} | ({"CP": 0} if cp > 1 else {})
    for call in spy.calls:
        if call.op == "send":
            sent["PP"] += call.nbytes
        elif call.op in ("all_reduce", "all_gather", "reduce_scatter") and call.group in kinds:
            sent[kinds[call.group]] += round(ring_bytes_sent(call.op, call.nbytes, call.group_size))
    planner_model = shape.only_blocks(blocks * pp)
    work = Workload(seq, 1, dp, precision="fp32", recompute="selective")
    state = state_bytes(planner_model.params, layout, work)
    planned = {"parameters": state.parameters, "gradients": state.gradients, "optimizer": state.optimizer}
    traffic = communication_bytes(planner_model, work, layout)
    return DryRun(
        shape=shape,
        layout=layout,
        rank=rank,
        blocks=blocks,
        seq=seq,
        measured=measured,
        planned=planned,
        sent=sent,
        planned_sent={k: traffic[k] for k in sent},
        broadcast=spy.bytes("broadcast"),
        seconds=seconds,
        collectives={op: spy.count(op) for op in sorted({c.op for c in spy.calls})},
    )
