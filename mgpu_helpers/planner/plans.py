"""Used by notebooks 05d, 05e and 08b through :mod:`mgpu_helpers.planner`: one layout's plan (memory on
its busiest GPU, traffic inside and across nodes, step time), every layout of a GPU count, and the
HTML table of plans."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._checks import whole
from ..memory import MemoryPrediction
from .formulas import (
    GB,
    GIB,
    GPU_FLOPS,
    INTER_NODE_BW,
    INTRA_NODE_BW,
    USABLE,
    Layout,
    Transformer,
    Workload,
    _divisors,
    activation_bytes,
    communication_bytes,
    state_bytes,
)


@dataclass(frozen=True)
class Plan:
    """One layout's estimated bytes per GPU, its traffic per step (inside / across nodes) and step time."""

    layout: Layout
    state: MemoryPrediction
    activations: int
    comm: dict[str, int] = field(default_factory=dict)
    gpu_memory: int = 80 * GIB
    bubble: float = 0.0  #: share of the step a pipeline stage idles, (p − 1)/(m + p − 1) (02a)
    intra: int = 0  #: bytes sent inside a node per step
    inter: int = 0  #: bytes sent across nodes per step
    compute_s: float = 0.0  #: estimated seconds of compute per step, without the bubble

    @property
    def memory(self) -> int:
        """Weights + gradients + optimizer state + activations on the busiest GPU, bytes."""
        return self.state.parameters + self.state.gradients + self.state.optimizer + self.activations

    @property
    def fits(self) -> bool:
        """Whether :attr:`memory` is within :data:`USABLE` of the GPU's memory."""
        return self.memory <= USABLE * self.gpu_memory

    @property
    def comm_total(self) -> int:
        """Bytes one GPU sends per step, all kinds together."""
        return sum(self.comm.values())

    @property
    def seconds(self) -> float:
        """Estimated step time: compute stretched by the bubble, plus communication at the two speeds."""
        return self.compute_s / (1 - self.bubble) + self.intra / INTRA_NODE_BW + self.inter / INTER_NODE_BW

    def row(self) -> dict[str, Any]:
        """The plan as one table row (memory in GiB, traffic in GB)."""
        state = self.state.parameters + self.state.gradients + self.state.optimizer
        return {
            "layout": self.layout.name,
            "state GiB": state / GIB,
            "activations GiB": self.activations / GIB,
            "total GiB": self.memory / GIB,
            "fits": self.fits,
            "intra-node GB": self.intra / GB,
            "inter-node GB": self.inter / GB,
            "bubble %": 100 * self.bubble,
            "step s": self.seconds,
        }


def plan(
    model: Transformer, work: Workload, layout: Layout, gpu_gib: float = 80.0, *, gpus_per_node: int = 8
) -> Plan:
    """Estimate one layout: memory on its busiest GPU (the first pipeline stage), bytes sent per step
    inside and across nodes of ``gpus_per_node``, and the step time."""
    if not (isinstance(model, Transformer) and isinstance(work, Workload) and isinstance(layout, Layout)):
        raise TypeError(
            "pass plan(Transformer(...), Workload(...), Layout(...) or make_layout(...), gpu_gib)"
        )
    if model.heads % layout.tp or model.hidden % layout.tp:
        raise ValueError(
            f"tp={layout.tp} must divide the {model.heads} heads and the hidden size {model.hidden}"
        )
    if work.seq_len % layout.cp:
        raise ValueError(f"cp={layout.cp} must divide seq_len={work.seq_len} (a rank holds s / cp tokens)")
    if model.layers % layout.pp:
        ok = [p for p in _divisors(model.layers) if p > 1][:8]
        raise ValueError(f"pp={layout.pp} does not divide the {model.layers} layers: pass pp among {ok}")
    if not gpu_gib > 0:
        raise ValueError(f"gpu_gib must be > 0 (e.g. 80.0 for an 80 GB GPU), not {gpu_gib!r}")
    node = whole("gpus_per_node", gpus_per_node, 1, "8")
    d, t, p, c, m = layout.dp, layout.tp, layout.pp, layout.cp, work.n_micro(layout.dp)
    act = (model.layers // p) * min(p, m) * activation_bytes(model, work, t, c)  # 1F1B: ≤ p in flight
    comm = communication_bytes(model, work, layout)
    # GPUs numbered TP innermost, then CP, then DP, then PP
    inside = {"TP": t <= node, "CP": t * c <= node, "DP": t * c * d <= node, "PP": d * t * c * p <= node}
    flops = (8 if work.recompute == "full" else 6) * model.params * work.global_batch * work.seq_len
    intra = sum(v for k, v in comm.items() if inside[k])
    gpu, bubble, compute = round(gpu_gib * GIB), (p - 1) / (m + p - 1), flops / (layout.n_gpus * GPU_FLOPS)
    state = state_bytes(model.params, layout, work)
    return Plan(layout, state, act, comm, gpu, bubble, intra, sum(comm.values()) - intra, compute)


def plan_all(
    model: Transformer, work: Workload, n_gpus: int, gpu_gib: float = 80.0, *, gpus_per_node: int = 8
) -> list[Plan]:
    """Every layout of ``n_gpus``: TP within a node (tp ≤ ``gpus_per_node``, dividing the heads), with
    ``work.context_parallel`` any CP degree dividing the sequence, any PP degree dividing the layers,
    DP the rest (if the global batch splits over it) with ZeRO stages 0–3. Fitting plans first, fastest
    estimated step first; the others by memory."""
    n = whole("n_gpus", n_gpus, 1, "8")
    plans = []
    for t in _divisors(n):
        if t > gpus_per_node or model.heads % t or model.hidden % t:
            continue
        cps = [c for c in _divisors(n // t) if work.seq_len % c == 0] if work.context_parallel else [1]
        for c in cps:
            for p in _divisors(n // (t * c)):
                d = n // (t * c * p)
                if model.layers % p or work.global_batch % (d * work.micro_batch):
                    continue  # unequal stages, or the global batch does not split over d ranks
                for z in (0, 1, 2, 3) if d * c > 1 else (0,):
                    layout = Layout(d, t, p, z, cp=c)
                    plans.append(plan(model, work, layout, gpu_gib, gpus_per_node=gpus_per_node))
    return sorted(plans, key=lambda q: (not q.fits, q.seconds if q.fits else q.memory))


def no_layout_reason(model: Transformer, work: Workload, n_gpus: int, gpus_per_node: int = 8) -> str:
    """Why :func:`plan_all` finds no layout of ``n_gpus``, and GPU counts that have one."""
    near = [k for k in range(max(1, n_gpus - 8), n_gpus + 9) if plan_all(model, work, k, 80.0)]
    return (
        f"No layout uses exactly {n_gpus} GPUs: tp must divide the {model.heads} heads (and be ≤ "
        f"{gpus_per_node}), pp the {model.layers} layers, and dp × micro-batch ({work.micro_batch}) the "
        f"global batch of {work.global_batch}. GPU counts nearby that work: {near[:8]}."
    )


def plans_html(plans: list[Plan], limit: int = 12) -> str:
    """An HTML table of the first ``limit`` plans (a static picture that any viewer shows)."""
    rows = [q.row() for q in plans[:limit]]
    if not rows:
        return "<p>no layout</p>"
    head = "".join(f"<th>{k}</th>" for k in rows[0])
    fmt = {bool: lambda v: "✅" if v else "❌", float: lambda v: f"{v:,.1f}", str: str}
    body = "".join(
        "<tr>" + "".join(f"<td>{fmt[type(v)](v)}</td>" for v in r.values()) + "</tr>" for r in rows
    )
    more = f"<p>… and {len(plans) - limit} more layouts</p>" if len(plans) > limit else ""
    fitting, gib = sum(q.fits for q in plans), plans[0].gpu_memory / GIB
    if fitting == len(plans):
        order = "fastest estimated step first"
    elif fitting:
        order = "fitting layouts first, fastest estimated step first; then the others, smallest memory first"
    else:
        order = "none fits: smallest memory first"
    return (
        f"<p>{fitting} of {len(plans)} layouts fit in {USABLE:.0%} of {gib:g} GiB; {order} (estimated: "
        f"Playbook / Korthikanti formulas, assumed link and compute speeds)</p>"
        f"<table><tr>{head}</tr>{body}</table>{more}"
    )
