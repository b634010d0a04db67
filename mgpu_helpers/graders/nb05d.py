"""Used by notebook 05d's exercises: activation memory per GPU under TP and PP (05d.1), graded against
the planner's hidden formula (Korthikanti et al.'s table 2, 1F1B's micro-batches in flight) on many
configurations; and a layout search (05d.2), graded on scenarios against
:func:`~mgpu_helpers.planner.plan_all` — among them one where only TP × PP layouts fit and one where
nothing fits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from ..exercises import Wrong, exercise

_FORBID = ("plan", "plan_all", "activation_bytes", "communication_bytes", "state_bytes", "planner")


@exercise(
    "05d.1",
    "activation memory per GPU under TP and PP",
    hint="per layer and micro-batch, TP splits the attention and MLP activations but not the layer norms "
    "and dropout masks (the 10·s·b·h part); a pipeline stage keeps its L/p layers for as many micro-batches "
    "as it has in flight.",
    forbid=_FORBID,
)
def grade_activations(activation_bytes_per_gpu: Callable[..., float]) -> str:
    """Compare ``activation_bytes_per_gpu(seq_len, micro_batch, hidden, heads, layers, tp, pp, n_micro,
    recompute)`` with the planner's estimate of the first pipeline stage."""
    if not callable(activation_bytes_per_gpu):
        raise Wrong(f"pass your function itself, not {type(activation_bytes_per_gpu).__name__}.")
    from ..planner import Layout, Transformer, Workload, plan

    shapes = [(4096, 1, 4096, 32, 32), (2048, 4, 8192, 64, 80), (8192, 2, 2048, 16, 24)]
    n = 0
    for (s, b, h, a, L), tp, pp, m, rc in itertools.product(
        shapes, (1, 2, 8), (1, 4), (1, 8), ("none", "selective", "full")
    ):
        model = Transformer("graded", L, h, a, n_params=10**9)
        want = plan(model, Workload(s, b, m * b, recompute=rc), Layout(tp=tp, pp=pp)).activations
        call = f"activation_bytes_per_gpu({s}, {b}, {h}, {a}, {L}, {tp}, {pp}, n_micro={m}, recompute={rc!r})"
        got = activation_bytes_per_gpu(s, b, h, a, L, tp, pp, m, rc)
        if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(got):
            raise Wrong(f"{call} returned {got!r}, not a number of bytes.")
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=2):
            raise Wrong(f"{call} gives {got / 1e9:,.3f} GB, {got / want:.3g}x the estimate.")
        n += 1
    return f"equal to the estimate on {n} configurations (3 shapes × TP 1/2/8 × PP 1/4 × m 1/8 × recompute)"


def _scenarios() -> list[tuple[str, Any, Any, int, float]]:
    from ..planner import LLAMA_8B, LLAMA_70B, LLAMA_405B, Workload

    return [
        (
            "Llama 8B on 8 × 80 GB, selective recomputation",
            LLAMA_8B,
            Workload(4096, 1, 64, recompute="selective"),
            8,
            80.0,
        ),
        ("Llama 8B on 8 × 24 GB", LLAMA_8B, Workload(4096, 1, 64, recompute="full"), 8, 24.0),
        ("Llama 70B on 32 × 80 GB", LLAMA_70B, Workload(4096, 1, 64, recompute="selective"), 32, 80.0),
        (
            "Llama 70B on 64 × 40 GB, global batch 2 (only TP × PP fits)",
            LLAMA_70B,
            Workload(4096, 1, 2),
            64,
            40.0,
        ),
        ("Llama 405B on 8 × 80 GB (nothing fits)", LLAMA_405B, Workload(4096, 1, 8), 8, 80.0),
    ]


@exercise(
    "05d.2",
    "search the layouts for the best one that fits",
    hint="try every combination: tp and pp together (and with dp), not one kind of parallelism at a time; "
    "respect tp ≤ 8 dividing the heads, pp dividing the layers, and ZeRO only where dp > 1.",
    forbid=_FORBID,
)
def grade_search(best_layout: Callable[..., Any]) -> str:
    """Run ``best_layout(n_gpus, heads, layers, gpu_bytes, estimate)`` on scenarios."""
    if not callable(best_layout):
        raise Wrong(f"pass your function best_layout itself, not {type(best_layout).__name__}.")
    from ..planner import GB, Layout, plan, plan_all

    seen = []
    for title, model, work, n, gb in _scenarios():

        def estimate(dp, tp, pp, zero, model=model, work=work, gb=gb, n=n, title=title):
            if dp * tp * pp != n:
                raise Wrong(f"{title}: estimate({dp}, {tp}, {pp}, {zero}) does not use all {n} GPUs.")
            if work.global_batch % (dp * work.micro_batch):
                return None  # the global batch does not split over dp ranks
            q = plan(model, work, Layout(dp, tp, pp, zero), gb)
            return {"memory": q.memory, "sent": q.comm_total, "bubble": q.bubble}

        got = best_layout(n, model.heads, model.layers, round(gb * GB), estimate)
        best = next((q for q in plan_all(model, work, n, gb) if q.fits), None)
        if best is None:
            if got is not None:
                raise Wrong(f"{title}: you return {got!r}, but no layout fits; return None.")
            seen.append("nothing fits → None")
            continue
        if got is None:
            raise Wrong(f"{title}: you return None, but some layout fits in {gb:g} GB.")
        try:
            dp, tp, pp, zero = got
            q = plan(model, work, Layout(dp, tp, pp, zero), gb)
        except (TypeError, ValueError) as exc:
            raise Wrong(f"{title}: {got!r} is not a valid (dp, tp, pp, zero) layout: {exc}") from None
        if dp * tp * pp != n or tp > 8:
            raise Wrong(f"{title}: {got!r} does not use exactly {n} GPUs with TP inside one node of 8.")
        if not q.fits:
            raise Wrong(
                f"{title}: {q.layout.name} needs {q.memory / GB:.0f} GB per GPU, more than {gb:g} GB."
            )
        if (q.bubble, q.comm_total) > (best.bubble, best.comm_total):
            raise Wrong(
                f"{title}: {q.layout.name} fits, but another layout has a pipeline bubble of "
                f"{best.bubble:.0%} (yours {q.bubble:.0%}) and sends {best.comm_total / GB:.1f} GB per step "
                f"(yours {q.comm_total / GB:.1f} GB)."
            )
        seen.append(q.layout.name)
    return "best layouts: " + "; ".join(seen)
