"""Used by notebook 05d (and its graders): a parallelism planner. Given a transformer, a workload and a
cluster, it lists which layouts — data parallel (DP), ZeRO-1/2/3, tensor parallel (TP), pipeline
parallel (PP) and their combinations — fit in one GPU's memory, and what each sends over the network
per optimizer step.

Every number is *estimated* from published formulas (the notebook checks the memory column against
:class:`~mgpu_helpers.memory.MemoryTracker` on real sharded runs):

* **state** (weights, gradients, optimizer) — the course's one estimator,
  :func:`mgpu_helpers.memory.predict_memory` (mixed precision: 2Ψ + 2Ψ + 12Ψ, ZeRO-k dividing by the DP
  size), applied to the Ψ/(t·p) parameters one TP×PP shard holds (Hugging Face's *Ultra-Scale
  Playbook*, after Rajbhandari et al., ZeRO, arXiv 1910.02054);
* **activations** per layer and micro-batch, 16-bit (Korthikanti et al., arXiv 2205.05198, table 2):
  ``s·b·h·(34 + 5·a·s/h)`` unsplit; with TP ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` (layer norms and
  dropout stay whole), with sequence parallelism everything ``/t``; selective recomputation drops the
  ``5·a·s/h`` attention term, full recomputation keeps only each layer's input, ``2·s·b·h``. A pipeline
  stage holds ``L/p`` layers, and under 1F1B the first stage keeps ``min(p, m)`` micro-batches in flight;
* **communication**, bytes one GPU *sends* per optimizer step of ``m`` micro-batches (ring collectives:
  an all-reduce sends ``2(n−1)/n`` of the buffer, a reduce-scatter or all-gather ``(n−1)/n``):
  DP and ZeRO-1 one gradient all-reduce (≈ 2Ψ); ZeRO-2 a reduce-scatter per micro-batch plus one
  all-gather of weights; ZeRO-3 two weight all-gathers and a reduce-scatter per micro-batch (≈ 3Ψ); TP
  four all-reduces of ``b·s·h`` per layer and micro-batch (two forward, two backward; full
  recomputation repeats the forward two); PP one ``b·s·h`` activation forward and one gradient backward
  per micro-batch and stage boundary (Megatron-LM, Shoeybi et al., arXiv 1909.08053; Narayanan et al.,
  arXiv 2104.04473).

Simplifications, said once: embeddings and the output layer are spread evenly like the other weights,
logits and the CUDA context are not counted, and bytes are compared, not link speeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._checks import whole
from .memory import MemoryPrediction, predict_memory

__all__ = [
    "LLAMA_8B",
    "LLAMA_70B",
    "LLAMA_405B",
    "Layout",
    "Plan",
    "Transformer",
    "Workload",
    "activation_bytes",
    "communication_bytes",
    "gpu_memory_gb",
    "make_layout",
    "plan",
    "plan_all",
    "plans_html",
    "planner_form",
    "state_bytes",
]

GB = 10**9  # the Playbook counts in 10⁹ bytes
_RECOMPUTE = ("none", "selective", "full")


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
    each of the ``dp`` data-parallel ranks runs m = global_batch / (dp·b) micro-batches (gradient
    accumulation, and the pipeline's micro-batches). ``precision`` and ``optimizer`` as in
    :func:`~mgpu_helpers.memory.predict_memory`; ``recompute`` "none", "selective" or "full".
    """

    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 64
    precision: str = "mixed"
    optimizer: str = "adam"
    fp32_grad_accumulation: bool = False
    recompute: str = "none"
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
            ok = [
                d for d in range(1, self.global_batch + 1) if self.global_batch % (d * self.micro_batch) == 0
            ]
            raise ValueError(
                f"global_batch={self.global_batch} sequences do not split into dp={dp} ranks × "
                f"micro_batch={self.micro_batch}: pass a dp among {ok[:8]} or a global batch that is a "
                f"multiple of {per_step}"
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


def make_layout(n_gpus: int, *, tp: int = 1, pp: int = 1, zero: int = 0) -> Layout:
    """The layout that uses all ``n_gpus`` with these TP and PP degrees (DP takes the rest).

    Raises:
        ValueError: ``tp·pp`` does not divide ``n_gpus``; the message lists degrees that do.
    """
    n = whole("n_gpus", n_gpus, 1, "8")
    whole("tp", tp, 1, "2")
    whole("pp", pp, 1, "2")
    if n % (tp * pp):
        ok = [f"tp={t}, pp={p}" for t in _divisors(n) for p in _divisors(n // t) if t * p > 1][:6]
        raise ValueError(
            f"tp={tp} × pp={pp} = {tp * pp} does not divide {n} GPUs, so the data-parallel size "
            f"dp = {n}/{tp * pp} is not whole. Pass degrees whose product divides {n}, e.g. "
            f"{'; '.join(ok) or 'tp=1, pp=1'}."
        )
    return Layout(n // (tp * pp), tp, pp, zero)


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
    sbh = s * b * h
    if work.recompute == "full":
        per = 2.0 / (tp if work.sequence_parallel else 1)
    else:
        attention = 0.0 if work.recompute == "selective" else 5 * a * s / (h * tp)
        per = (34 / tp if work.sequence_parallel else 10 + 24 / tp) + attention
    return round(sbh * per)


def communication_bytes(model: Transformer, work: Workload, layout: Layout) -> dict[str, int]:
    """Bytes one GPU sends per optimizer step, by kind: ``{"DP": …, "TP": …, "PP": …}``."""
    d, t, p, m = layout.dp, layout.tp, layout.pp, work.n_micro(layout.dp)
    e = work.element_bytes
    shard = model.params / (t * p)  # the parameters this GPU's DP group synchronises
    ring = (d - 1) / d
    dp = {0: 2 * ring, 1: 2 * ring, 2: (m + 1) * ring, 3: 3 * m * ring}[layout.zero] * shard * e
    bsh = work.micro_batch * work.seq_len * model.hidden * e
    layers_here = model.layers // p
    all_reduces = 4 + 2 * (work.recompute == "full")
    tp_bytes = all_reduces * 2 * (t - 1) / t * bsh * layers_here * m
    pp_bytes = (0 if p == 1 else 1 if p == 2 else 2) * bsh * m  # a middle stage sends both ways
    return {"DP": round(dp), "TP": round(tp_bytes), "PP": round(pp_bytes)}


@dataclass(frozen=True)
class Plan:
    """One layout's estimated bytes per GPU and its communication per step."""

    layout: Layout
    state: MemoryPrediction
    activations: int
    comm: dict[str, int] = field(default_factory=dict)
    gpu_memory: int = 80 * GB
    #: Share of the step a pipeline stage idles, (p − 1)/(m + p − 1) (notebook 02a); 0 without PP.
    bubble: float = 0.0

    @property
    def memory(self) -> int:
        """Weights + gradients + optimizer state + activations on the busiest GPU, bytes."""
        return self.state.parameters + self.state.gradients + self.state.optimizer + self.activations

    @property
    def fits(self) -> bool:
        """Whether :attr:`memory` is within the GPU's memory."""
        return self.memory <= self.gpu_memory

    @property
    def comm_total(self) -> int:
        """Bytes one GPU sends per step, all kinds together."""
        return sum(self.comm.values())

    def row(self) -> dict[str, Any]:
        """The plan as one table row (GB = 10⁹ bytes)."""
        s = self.state
        return {
            "layout": self.layout.name,
            "weights GB": s.parameters / GB,
            "grads GB": s.gradients / GB,
            "optimizer GB": s.optimizer / GB,
            "activations GB": self.activations / GB,
            "total GB": self.memory / GB,
            "fits": self.fits,
            "sent GB/step": self.comm_total / GB,
            "bubble %": 100 * self.bubble,
        }


def plan(model: Transformer, work: Workload, layout: Layout, gpu_memory_gb: float = 80.0) -> Plan:
    """Estimate one layout: memory on its busiest GPU (the first pipeline stage) and bytes sent per step."""
    if not isinstance(model, Transformer) or not isinstance(work, Workload) or not isinstance(layout, Layout):
        raise TypeError("pass plan(Transformer(...), Workload(...), Layout(...) or make_layout(...), gpu_gb)")
    if model.heads % layout.tp or model.hidden % layout.tp:
        raise ValueError(
            f"tp={layout.tp} must divide the {model.heads} heads and the hidden size {model.hidden}"
        )
    if model.layers % layout.pp:
        ok = [p for p in _divisors(model.layers) if p > 1][:8]
        raise ValueError(f"pp={layout.pp} does not divide the {model.layers} layers: pass pp among {ok}")
    if not gpu_memory_gb > 0:
        raise ValueError(f"gpu_memory_gb must be > 0 (e.g. 80.0 for an 80 GB GPU), not {gpu_memory_gb!r}")
    m = work.n_micro(layout.dp)
    in_flight = min(layout.pp, m)  # 1F1B: the first stage holds up to p micro-batches
    act = (model.layers // layout.pp) * in_flight * activation_bytes(model, work, layout.tp)
    return Plan(
        layout,
        state_bytes(model.params, layout, work),
        act,
        communication_bytes(model, work, layout),
        round(gpu_memory_gb * GB),
        (layout.pp - 1) / (m + layout.pp - 1),
    )


def plan_all(
    model: Transformer, work: Workload, n_gpus: int, gpu_memory_gb: float = 80.0, *, gpus_per_node: int = 8
) -> list[Plan]:
    """Every layout of ``n_gpus``: TP within a node (tp ≤ ``gpus_per_node``, dividing the heads), any
    PP degree dividing the layers, DP the rest (if the global batch splits over it) with ZeRO stages
    0–3. Fitting plans first: the least
    pipeline bubble (PP only where needed), then the fewest bytes sent per step; the others by memory."""
    n = whole("n_gpus", n_gpus, 1, "8")
    plans = []
    for t in _divisors(n):
        if t > gpus_per_node or model.heads % t or model.hidden % t:
            continue
        for p in _divisors(n // t):
            if model.layers % p:
                continue  # stages of equal depth
            d = n // (t * p)
            if work.global_batch % (d * work.micro_batch):
                continue  # the global batch does not split over d ranks
            for z in (0, 1, 2, 3) if d > 1 else (0,):
                plans.append(plan(model, work, Layout(d, t, p, z), gpu_memory_gb))
    return sorted(plans, key=lambda q: (not q.fits, *((q.bubble, q.comm_total) if q.fits else ()), q.memory))


def plans_html(plans: list[Plan], limit: int = 12) -> str:
    """An HTML table of the first ``limit`` plans (a static picture that any viewer shows)."""
    rows = [q.row() for q in plans[:limit]]
    if not rows:
        return "<p>no layout</p>"
    head = "".join(f"<th>{k}</th>" for k in rows[0])
    body = ""
    for r in rows:
        cells = "".join(
            f"<td>{'✅' if v else '❌'}</td>"
            if isinstance(v, bool)
            else f"<td>{v:,.1f}</td>"
            if isinstance(v, float)
            else f"<td>{v}</td>"
            for v in r.values()
        )
        body += f"<tr>{cells}</tr>"
    more = f"<p>… and {len(plans) - limit} more layouts</p>" if len(plans) > limit else ""
    fitting = sum(q.fits for q in plans)
    return (
        f"<p>{fitting} of {len(plans)} layouts fit (estimated: Playbook / Korthikanti formulas)</p>"
        f"<table><tr>{head}</tr>{body}</table>{more}"
    )


def gpu_memory_gb(default: float = 80.0) -> tuple[float, str]:
    """This machine's first GPU's memory in GB (from NVML, without touching CUDA), or ``default``."""
    from .hardware import describe_node

    gpus = describe_node().gpus
    if gpus and gpus[0].memory_total_bytes:
        return gpus[0].memory_total_bytes / GB, f"GPU 0 of this machine ({gpus[0].name})"
    return float(default), f"{default:g} GB assumed (an H100's; no GPU here)"


def planner_form(n_gpus: int = 8, gpu_gb: float = 80.0, limit: int = 12) -> Any:
    """An ipywidgets form (core widgets only: ipywidgets 7.7 and 8) that re-plans on every change."""
    import ipywidgets as w

    model = w.Dropdown(options=list(PRESETS), value=LLAMA_8B.name, description="model")
    gpus = w.IntText(value=n_gpus, description="GPUs")
    gpu_mem = w.FloatText(value=round(gpu_gb, 1), description="GB per GPU")
    seq = w.IntText(value=4096, description="seq length")
    mbs = w.IntText(value=1, description="micro-batch")
    n_micro = w.IntText(value=64, description="global batch")
    recompute = w.Dropdown(options=list(_RECOMPUTE), value="none", description="recompute")
    out = w.HTML()

    def refresh(*_: Any) -> None:
        try:
            work = Workload(seq.value, mbs.value, n_micro.value, recompute=recompute.value)
            out.value = plans_html(plan_all(PRESETS[model.value], work, gpus.value, gpu_mem.value), limit)
        except (TypeError, ValueError) as exc:
            out.value = f"<pre>{exc}</pre>"

    for f in (model, gpus, gpu_mem, seq, mbs, n_micro, recompute):
        f.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HBox([model, gpus, gpu_mem]), w.HBox([seq, mbs, n_micro, recompute]), out])
