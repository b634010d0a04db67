"""Used by notebooks 05d (and its graders) and 08b: a parallelism planner. Given a transformer, a workload
and a cluster, it lists which layouts — data parallel (DP), ZeRO-1/2/3, tensor parallel (TP), pipeline
parallel (PP) and their combinations — fit in one GPU's memory, what each sends per optimizer step, and
a rough step time to rank them.

Every number is *estimated*:

* **state** (weights, gradients, optimizer) — the course's one estimator,
  :func:`mgpu_helpers.memory.predict_memory` (mixed precision: 2Ψ + 2Ψ + 12Ψ, ZeRO-k dividing by the DP
  size), applied to the Ψ/(t·p) parameters one TP×PP shard holds (Hugging Face's *Ultra-Scale
  Playbook*, after Rajbhandari et al., ZeRO, arXiv 1910.02054);
* **activations** per layer and micro-batch, 16-bit (Korthikanti et al., arXiv 2205.05198, table 2):
  ``s·b·h·(34 + 5·a·s/h)`` with the attention scores materialised (no FlashAttention); with TP
  ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``, with sequence parallelism everything ``/t``; selective
  recomputation (what FlashAttention gives for free) drops the ``5·a·s/h`` term; full recomputation
  keeps each layer's input, ``2·s·b·h`` — divided by t under sequence parallelism, the course's extension
  of the table. The 34 is a GPT layer's (not Llama's SwiGLU/GQA). A pipeline stage holds ``L/p`` layers,
  and under 1F1B the first stage keeps ``min(p, m)`` micro-batches in flight;
* **communication**, bytes one GPU *sends* per optimizer step of ``m`` micro-batches (ring collectives:
  an all-reduce sends ``2(n−1)/n`` of the buffer, a reduce-scatter or all-gather ``(n−1)/n``):
  DP and ZeRO-1 one gradient all-reduce (≈ 2Ψ); ZeRO-2 a reduce-scatter per micro-batch plus one
  all-gather of weights, ZeRO-3 two weight all-gathers and a reduce-scatter per micro-batch (≈ 3Ψ) —
  the course's model of gradient accumulation; TP four all-reduces of ``b·s·h`` per layer and
  micro-batch (Megatron-LM, Shoeybi et al., arXiv 1909.08053; full recomputation repeats the forward
  two); PP one ``b·s·h`` activation forward and one gradient backward per micro-batch and stage boundary
  (Narayanan et al., arXiv 2104.04473). GPUs are numbered TP innermost, then DP, then PP: a group stays
  inside a node (``intra``) when it spans at most ``gpus_per_node`` GPUs, else it crosses nodes (``inter``);
* **step time** = compute / (1 − bubble) + intra / :data:`INTRA_NODE_BW` + inter / :data:`INTER_NODE_BW`,
  compute = 6Ψ (8Ψ with full recomputation) FLOPs per token at :data:`GPU_FLOPS`, no overlap.

Memory in GiB (2³⁰ B, as GPU capacities and the Playbook's charts), traffic in GB (10⁹ B, as link
speeds). A layout *fits* in :data:`USABLE` of the GPU. Embeddings are spread evenly like other weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._checks import whole
from .memory import MemoryPrediction, predict_memory

# fmt: off
__all__ = [
    "GB", "GIB", "GPU_FLOPS", "INTER_NODE_BW", "INTRA_NODE_BW", "LLAMA_8B", "LLAMA_70B", "LLAMA_405B",
    "USABLE", "Layout", "Plan", "Transformer", "Workload", "activation_bytes", "communication_bytes",
    "gpu_memory_gib", "no_layout_reason", "plan", "plan_all", "plans_html", "planner_form", "state_bytes",
]
# fmt: on

GB = 10**9  # the Playbook's table counts in 10⁹ bytes; link speeds too
GIB = 2**30  # GPU capacities ("80 GB" ≈ 80 GiB) and the Playbook's charts
#: Share of a GPU's memory that state + activations may use; the rest is for what the formulas leave
#: out: logits, ZeRO-3's gathered weights, the CUDA context, NCCL buffers and allocator fragmentation.
USABLE = 0.9
INTRA_NODE_BW = 450e9  # assumed bytes/s one GPU sends inside a node (NVLink class)
INTER_NODE_BW = 50e9  # assumed bytes/s one GPU sends across nodes (a 400 Gb/s NIC per GPU)
GPU_FLOPS = 400e12  # assumed achieved bf16 FLOP/s per GPU (about 40 % of an H100's peak)
_RECOMPUTE = ("materialised", "selective", "full")


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer: ``layers`` L, ``hidden`` h, ``heads`` a, ``vocab`` v.

    ``n_params`` is the real count when known (e.g. Llama's grouped-query attention and wider MLP);
    otherwise the Playbook's count ``h·v + L·(12h² + 13h) + 2h``.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = 0
    n_params: int | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads"):
            whole(f"Transformer.{name}", getattr(self, name), 1, "32")
        whole("Transformer.vocab", self.vocab, 0, "128256")
        if self.n_params is not None:
            whole("Transformer.n_params", self.n_params, 1, "8 * 10**9")

    @property
    def params(self) -> int:
        """Ψ, the number of parameters."""
        if self.n_params is not None:
            return self.n_params
        h, L = self.hidden, self.layers
        return h * self.vocab + L * (12 * h * h + 13 * h) + 2 * h


# Llama 3.1 shapes (Meta's model cards); the Playbook plans these three.
LLAMA_8B = Transformer("Llama 3.1 8B", 32, 4096, 32, 128_256, 8_030_000_000)
LLAMA_70B = Transformer("Llama 3.1 70B", 80, 8192, 64, 128_256, 70_600_000_000)
LLAMA_405B = Transformer("Llama 3.1 405B", 126, 16384, 128, 128_256, 405_000_000_000)
PRESETS = {m.name: m for m in (LLAMA_8B, LLAMA_70B, LLAMA_405B)}


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes, and how.

    ``global_batch`` sequences of ``seq_len`` s tokens per step, in micro-batches of ``micro_batch`` b:
    each of the ``dp`` data-parallel ranks runs m = global_batch / (dp·b) micro-batches. ``precision``
    and ``optimizer`` as in :func:`~mgpu_helpers.memory.predict_memory`; ``recompute``:
    ``"materialised"`` (attention scores stored: no recomputation, no FlashAttention), ``"selective"``
    (scores recomputed; FlashAttention/SDPA never store them) or ``"full"``.
    """

    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 64
    precision: str = "mixed"
    optimizer: str = "adam"
    fp32_grad_accumulation: bool = False
    recompute: str = "materialised"
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        whole("Workload.seq_len", self.seq_len, 1, "4096")
        whole("Workload.micro_batch", self.micro_batch, 1, "1")
        whole("Workload.global_batch", self.global_batch, 1, "64")
        if self.recompute not in _RECOMPUTE:
            raise ValueError(f"recompute must be one of {_RECOMPUTE}, not {self.recompute!r}")

    def n_micro(self, dp: int) -> int:
        """Micro-batches each data-parallel rank runs per step, global_batch / (dp·micro_batch)."""
        per_step = dp * self.micro_batch
        if self.global_batch % per_step:
            raise ValueError(
                f"global_batch={self.global_batch} sequences do not split into dp={dp} ranks × micro_batch="
                f"{self.micro_batch}: pass a dp dividing {self.global_batch // self.micro_batch} or a global "
                f"batch that is a multiple of {per_step}"
            )
        return self.global_batch // per_step

    @property
    def element_bytes(self) -> int:
        """Bytes of one activation (and, in mixed precision, of one weight or gradient) on the wire."""
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Layout:
    """``dp`` × ``tp`` × ``pp`` GPUs; ``zero`` the ZeRO stage over the ``dp`` data-parallel ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp"):
            whole(f"Layout.{name}", getattr(self, name), 1, "2")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be 0, 1, 2 or 3, not {self.zero!r}")
        if self.zero and self.dp == 1:
            raise ValueError("ZeRO shards over data-parallel ranks: with dp=1 pass zero=0")

    @property
    def n_gpus(self) -> int:
        """GPUs the layout uses, dp·tp·pp."""
        return self.dp * self.tp * self.pp

    @property
    def name(self) -> str:
        """E.g. ``"TP8 × PP2 × DP4 ZeRO-1"``; ``"1 GPU"`` when nothing is split."""
        parts = [f"TP{self.tp}"] * (self.tp > 1) + [f"PP{self.pp}"] * (self.pp > 1)
        if self.dp > 1:
            parts.append(f"DP{self.dp}" + (f" ZeRO-{self.zero}" if self.zero else ""))
        return " × ".join(parts) or "1 GPU"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def state_bytes(n_params: int, layout: Layout, work: Workload = Workload()) -> MemoryPrediction:
    """Weights, gradients and optimizer state on one GPU: :func:`predict_memory` of the Ψ/(t·p)
    parameters one TP×PP shard holds, ZeRO-sharded over ``layout.dp``."""
    shard = max(1, round(whole("n_params", n_params, 1, "8 * 10**9") / (layout.tp * layout.pp)))
    return predict_memory(
        shard,
        precision=work.precision,
        optimizer=work.optimizer,
        zero_stage=layout.zero,
        dp_size=layout.dp,
        fp32_grad_accumulation=work.fp32_grad_accumulation,
    )


def activation_bytes(model: Transformer, work: Workload, tp: int = 1) -> int:
    """Activation bytes of ONE layer and ONE micro-batch on one GPU of a ``tp``-way TP group (16-bit)."""
    s, b, h, a = work.seq_len, work.micro_batch, model.hidden, model.heads
    if work.recompute == "full":  # /t with sequence parallelism: the course's extension of table 2
        per = 2.0 / (tp if work.sequence_parallel else 1)
    else:
        attention = 0.0 if work.recompute == "selective" else 5 * a * s / (h * tp)
        per = (34 / tp if work.sequence_parallel else 10 + 24 / tp) + attention
    return round(s * b * h * per)


def communication_bytes(model: Transformer, work: Workload, layout: Layout) -> dict[str, int]:
    """Bytes one GPU sends per optimizer step, by kind: ``{"DP": …, "TP": …, "PP": …}``."""
    d, t, p, m, e = layout.dp, layout.tp, layout.pp, work.n_micro(layout.dp), work.element_bytes
    shard, ring = model.params / (t * p), (d - 1) / d  # shard: the parameters this GPU's DP group syncs
    dp = {0: 2 * ring, 1: 2 * ring, 2: (m + 1) * ring, 3: 3 * m * ring}[layout.zero] * shard * e
    bsh = work.micro_batch * work.seq_len * model.hidden * e
    all_reduces = 4 + 2 * (work.recompute == "full")
    tp_bytes = all_reduces * 2 * (t - 1) / t * bsh * (model.layers // p) * m
    pp_bytes = (0 if p == 1 else 1 if p == 2 else 2) * bsh * m  # a middle stage sends both ways
    return {"DP": round(dp), "TP": round(tp_bytes), "PP": round(pp_bytes)}


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
    if model.layers % layout.pp:
        ok = [p for p in _divisors(model.layers) if p > 1][:8]
        raise ValueError(f"pp={layout.pp} does not divide the {model.layers} layers: pass pp among {ok}")
    if not gpu_gib > 0:
        raise ValueError(f"gpu_gib must be > 0 (e.g. 80.0 for an 80 GB GPU), not {gpu_gib!r}")
    node = whole("gpus_per_node", gpus_per_node, 1, "8")
    d, t, p, m = layout.dp, layout.tp, layout.pp, work.n_micro(layout.dp)
    act = (model.layers // p) * min(p, m) * activation_bytes(model, work, t)  # 1F1B: ≤ p in flight
    comm = communication_bytes(model, work, layout)
    inside = {"TP": t <= node, "DP": t * d <= node, "PP": d * t * p <= node}  # TP, then DP, then PP
    flops = (8 if work.recompute == "full" else 6) * model.params * work.global_batch * work.seq_len
    intra = sum(v for k, v in comm.items() if inside[k])
    gpu, bubble, compute = round(gpu_gib * GIB), (p - 1) / (m + p - 1), flops / (layout.n_gpus * GPU_FLOPS)
    state = state_bytes(model.params, layout, work)
    return Plan(layout, state, act, comm, gpu, bubble, intra, sum(comm.values()) - intra, compute)


def plan_all(
    model: Transformer, work: Workload, n_gpus: int, gpu_gib: float = 80.0, *, gpus_per_node: int = 8
) -> list[Plan]:
    """Every layout of ``n_gpus``: TP within a node (tp ≤ ``gpus_per_node``, dividing the heads), any
    PP degree dividing the layers, DP the rest (if the global batch splits over it) with ZeRO stages
    0–3. Fitting plans first, fastest estimated step first; the others by memory."""
    n = whole("n_gpus", n_gpus, 1, "8")
    plans = []
    for t in _divisors(n):
        if t > gpus_per_node or model.heads % t or model.hidden % t:
            continue
        for p in _divisors(n // t):
            d = n // (t * p)
            if model.layers % p or work.global_batch % (d * work.micro_batch):
                continue  # unequal stages, or the global batch does not split over d ranks
            for z in (0, 1, 2, 3) if d > 1 else (0,):
                plans.append(plan(model, work, Layout(d, t, p, z), gpu_gib, gpus_per_node=gpus_per_node))
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


def gpu_memory_gib(default: float = 80.0) -> tuple[float, str]:
    """This machine's first GPU's memory in GiB (from NVML, without touching CUDA), or ``default``."""
    from .hardware import describe_node

    gpus = describe_node().gpus
    if gpus and gpus[0].memory_total_bytes:
        return gpus[0].memory_total_bytes / GIB, f"GPU 0 of this machine ({gpus[0].name})"
    return float(default), f'{default:g} GiB assumed (an H100 "80 GB"; no GPU here)'


def planner_form(n_gpus: int = 8, gpu_gib: float = 80.0, limit: int = 12) -> Any:
    """An ipywidgets form (core widgets: ipywidgets 7.7 and 8) that re-plans on every change, also while
    a number is being typed (``continuous_update``). Its rows fit an output area of about 800 px. A
    preset fills layers, hidden size and heads; other values plan a custom model (the Playbook's
    parameter count, Llama's vocabulary). ``form.fields`` maps each field's description to it."""
    import ipywidgets as w

    def box(kind: Any, value: Any, description: str, width: str = "250px", **kw: Any) -> Any:
        style = {"description_width": "100px"}
        return kind(value=value, description=description, style=style, layout=w.Layout(width=width), **kw)

    def number(kind: Any, value: Any, description: str) -> Any:  # re-plans while typing, not on Enter
        return box(kind, value, description, continuous_update=True)

    preset = box(w.Dropdown, LLAMA_8B.name, "preset", "380px", options=list(PRESETS))
    layers = number(w.IntText, LLAMA_8B.layers, "layers")
    hidden = number(w.IntText, LLAMA_8B.hidden, "hidden")
    heads = number(w.IntText, LLAMA_8B.heads, "heads")
    gpus = number(w.IntText, n_gpus, "GPUs")
    gpu_mem = number(w.FloatText, round(gpu_gib, 1), "GiB per GPU")
    seq = number(w.IntText, 4096, "seq length")
    mbs = number(w.IntText, 1, "micro-batch")
    global_batch = number(w.IntText, 64, "global batch")
    labels = ("none (scores stored, no FlashAttention)", "selective (= FlashAttention)", "full")
    options = list(zip(labels, _RECOMPUTE, strict=True))
    recompute = box(w.Dropdown, "materialised", "recompute", "520px", options=options)
    out = w.HTML()

    def use_preset(*_: Any) -> None:
        m = PRESETS[preset.value]
        layers.value, hidden.value, heads.value = m.layers, m.hidden, m.heads

    def refresh(*_: Any) -> None:
        try:
            m = PRESETS[preset.value]
            if (layers.value, hidden.value, heads.value) != (m.layers, m.hidden, m.heads):
                m = Transformer("custom", layers.value, hidden.value, heads.value, 128_256)
            work = Workload(seq.value, mbs.value, global_batch.value, recompute=recompute.value)
            plans = plan_all(m, work, gpus.value, gpu_mem.value)
            table = plans_html(plans, limit) if plans else f"<p>{no_layout_reason(m, work, gpus.value)}</p>"
            out.value = f"<p>{m.name}: {m.params / 1e9:,.2f} B parameters</p>{table}"
        except (TypeError, ValueError) as exc:
            out.value = f"<pre>{exc}</pre>"

    preset.observe(use_preset, names="value")
    fields = (layers, hidden, heads, gpus, gpu_mem, seq, mbs, global_batch, recompute)
    for f in fields:
        f.observe(refresh, names="value")
    refresh()
    rows = [[preset], [layers, hidden, heads], [gpus, gpu_mem], [seq, mbs, global_batch], [recompute]]
    form = w.VBox([*(w.HBox(row) for row in rows), out])  # rows of at most 3 × 250 px
    form.fields = {f.description: f for f in (preset, *fields)}
    return form
