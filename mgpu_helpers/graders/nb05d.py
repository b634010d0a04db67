"""Used by notebook 05d's exercises: the largest micro-batch that fits a GPU for a given layout (05d.1),
graded against the planner's hidden estimate on many configurations; and a layout search ranked by the
estimated step time (05d.2), graded on scenarios against :func:`~mgpu_helpers.planner.plan_all` —
among them one where memory rules out the fastest layout and one where nothing fits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..exercises import Wrong, exercise

_FORBID = (
    "plan",
    "plan_all",
    "activation_bytes",
    "communication_bytes",
    "state_bytes",
    "predict_memory",
    "planner",
)


def _micro_batch_cases() -> list[tuple[Any, Any, Any, int]]:
    from ..planner import GIB, LLAMA_8B, LLAMA_70B, USABLE, Layout, Transformer, Workload

    small = Transformer("24 × 2048", 24, 2048, 16, 50_257)  # the Playbook's parameter count
    layouts = {
        small: [Layout(8), Layout(4, 2, zero=1), Layout(2, 1, 4, zero=2), Layout(1, 2, 4)],
        LLAMA_8B: [Layout(8, zero=3), Layout(4, 2, zero=1), Layout(2, 2, 2), Layout(1, 8, 4)],
        LLAMA_70B: [Layout(4, 8, zero=3), Layout(2, 8, 4, zero=1), Layout(1, 8, 8)],
    }
    cases = []
    for model, outs in layouts.items():
        for layout, (s, g), rc, sp, gib in itertools.product(
            outs, ((2048, 256), (8192, 64)), ("materialised", "selective", "full"), (False, True), (24, 80)
        ):
            work = Workload(s, 1, g, recompute=rc, sequence_parallel=sp and layout.tp > 1)
            cases.append((model, work, layout, round(USABLE * gib * GIB)))
    return cases


def _largest(model: Any, work: Any, layout: Any, budget: int) -> tuple[int | None, bool]:
    """The largest micro-batch that fits, and whether some candidate lies within 10⁻⁶ of the budget."""
    from ..planner import plan

    per_rank = work.global_batch // layout.dp
    best, close = None, False
    for b in (b for b in range(1, per_rank + 1) if per_rank % b == 0):
        memory = plan(model, replace(work, micro_batch=b), layout).memory
        close |= math.isclose(memory, budget, rel_tol=1e-6)
        best = b if memory <= budget else best
    return best, close


@exercise(
    "05d.1",
    "the largest micro-batch that fits a GPU",
    hint="the state does not depend on b; a micro-batch's activations grow with b, the first stage keeps "
    "min(p, m) of them under 1F1B with m = global_batch / (dp·b), and only a b that divides "
    "global_batch / dp is a valid micro-batch.",
    forbid=_FORBID,
)
def grade_micro_batch(largest_micro_batch: Callable[..., Any]) -> str:
    """Compare ``largest_micro_batch(model, work, layout, budget)`` with the planner's answer."""
    if not callable(largest_micro_batch):
        raise Wrong(f"pass your function itself, not {type(largest_micro_batch).__name__}.")
    n = none = 0
    for model, work, layout, budget in _micro_batch_cases():
        want, close = _largest(model, work, layout, budget)
        if close:
            continue  # too close to the budget to grade fairly
        call = (
            f"largest_micro_batch({model.name}, seq_len={work.seq_len}, global_batch={work.global_batch}, "
            f"recompute={work.recompute!r}, sequence_parallel={work.sequence_parallel}, {layout.name}, "
            f"budget={budget / 2**30:.1f} GiB)"
        )
        got = largest_micro_batch(model, replace(work, micro_batch=1), layout, budget)
        if got != want:
            raise Wrong(f"{call} returned {got!r}; the estimate allows {want!r}.")
        n, none = n + 1, none + (want is None)
    return f"equal to the estimate on {n} configurations ({none} where not even b = 1 fits)"


def _scenarios() -> list[tuple[str, Any, Any, int, float]]:
    from ..planner import LLAMA_8B, LLAMA_70B, LLAMA_405B, Workload

    return [
        (
            "Llama 8B on 8 × 80 GiB, selective",
            LLAMA_8B,
            Workload(4096, 1, 64, recompute="selective"),
            8,
            80.0,
        ),
        (
            "Llama 8B on 8 × 24 GiB, full recomputation",
            LLAMA_8B,
            Workload(4096, 1, 64, recompute="full"),
            8,
            24.0,
        ),
        ("Llama 70B on 32 × 80 GiB", LLAMA_70B, Workload(4096, 1, 64, recompute="selective"), 32, 80.0),
        (
            "Llama 70B on 64 × 40 GiB (memory rules out the fastest layout)",
            LLAMA_70B,
            Workload(4096, 1, 256, recompute="full"),
            64,
            40.0,
        ),
        ("Llama 405B on 8 × 80 GiB (nothing fits)", LLAMA_405B, Workload(4096, 1, 8), 8, 80.0),
    ]


@exercise(
    "05d.2",
    "search the layouts for the fastest one that fits",
    hint="try every combination: tp and pp together (and with dp), not one kind of parallelism at a time; "
    "respect tp ≤ 8 dividing the heads, pp dividing the layers, ZeRO only where dp > 1, and count the "
    "bubble and both kinds of traffic in the time.",
    forbid=_FORBID,
)
def grade_search(best_layout: Callable[..., Any]) -> str:
    """Run ``best_layout(n_gpus, heads, layers, budget, estimate)`` on scenarios."""
    if not callable(best_layout):
        raise Wrong(f"pass your function best_layout itself, not {type(best_layout).__name__}.")
    from ..planner import GIB, USABLE, Layout, plan, plan_all

    seen = []
    for title, model, work, n, gib in _scenarios():

        def estimate(dp, tp, pp, zero, model=model, work=work, gib=gib, n=n, title=title):
            if dp * tp * pp != n:
                raise Wrong(f"{title}: estimate({dp}, {tp}, {pp}, {zero}) does not use all {n} GPUs.")
            if work.global_batch % (dp * work.micro_batch):
                return None  # the global batch does not split over dp ranks
            q = plan(model, work, Layout(dp, tp, pp, zero), gib)
            return {"memory": q.memory, "intra": q.intra, "inter": q.inter, "bubble": q.bubble,
                    "compute_s": q.compute_s}  # fmt: skip

        got = best_layout(n, model.heads, model.layers, USABLE * gib * GIB, estimate)
        best = next((q for q in plan_all(model, work, n, gib) if q.fits), None)
        if best is None:
            if got is not None:
                raise Wrong(f"{title}: you return {got!r}, but no layout fits; return None.")
            seen.append("nothing fits → None")
            continue
        if got is None:
            raise Wrong(f"{title}: you return None, but some layout fits in {USABLE:.0%} of {gib:g} GiB.")
        try:
            dp, tp, pp, zero = got
            q = plan(model, work, Layout(dp, tp, pp, zero), gib)
        except (TypeError, ValueError) as exc:
            raise Wrong(f"{title}: {got!r} is not a valid (dp, tp, pp, zero) layout: {exc}") from None
        if dp * tp * pp != n or tp > 8:
            raise Wrong(f"{title}: {got!r} does not use exactly {n} GPUs with TP inside one node of 8.")
        if not q.fits:
            raise Wrong(f"{title}: {q.layout.name} needs {q.memory / GIB:.0f} GiB per GPU, over the budget.")
        if q.seconds > best.seconds * (1 + 1e-9):
            raise Wrong(
                f"{title}: {q.layout.name} fits, but another layout's estimated step is {best.seconds:.2f} s "
                f"(yours {q.seconds:.2f} s: bubble {q.bubble:.0%}, {q.intra / 1e9:.0f} GB inside nodes, "
                f"{q.inter / 1e9:.0f} GB across)."
            )
        seen.append(f"{q.layout.name} ({q.seconds:.1f} s)")
    return "fastest layouts that fit: " + "; ".join(seen)
