"""Used by notebook 05d's exercises: the largest micro-batch that fits a GPU for a given layout (05d.1)
and the bytes one GPU sends per optimizer step (05d.2), both graded against the planner's hidden
estimate on many configurations.

The student writes the formulas: work that calls the planner's or the memory module's estimators, or
this module's answer key, is rejected — by name (``forbid``) and, for aliases (``from
mgpu_helpers.planner import plan as p``), by watching which functions run while the work runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..exercises import Wrong, exercise, run_refusing

_FORBID = (
    "plan",
    "plan_all",
    "activation_bytes",
    "communication_bytes",
    "state_bytes",
    "predict_memory",
    "transformer_activation_bytes",
    "planner",
    "_largest",
    "_micro_batch_cases",
    "_traffic_cases",
)


def _answer_keys() -> dict[Any, str]:
    """Code objects whose running means the work used a ready-made estimate, with their names."""
    from .. import memory, planner

    keys = {
        "plan": planner.plan,
        "plan_all": planner.plan_all,
        "activation_bytes": planner.activation_bytes,
        "communication_bytes": planner.communication_bytes,
        "state_bytes": planner.state_bytes,
        "predict_memory": memory.predict_memory,
        "transformer_activation_bytes": memory.transformer_activation_bytes,
        "the grader's own answer": _largest,
        "the grader's own cases": _micro_batch_cases,
        "the grader's own traffic cases": _traffic_cases,
    }
    return {f.__code__: name for name, f in keys.items()}


def _run_watched(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)``, refused if it ran one of :func:`_answer_keys` (under any name)."""
    return run_refusing(work, _answer_keys(), *args)


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
    task="`largest_micro_batch(model, work, layout, budget)` → the largest valid micro-batch whose busiest "
    "GPU needs at most `budget` bytes, or `None`. Compared exactly with the planner's hidden answer on 264 "
    "configurations (three models, 11 layouts, 2 sequence lengths, 3 recomputation modes, sequence "
    "parallelism on and off, 24 and 80 GiB; cases within 10⁻⁶ of the budget skipped). The planner's and the "
    "memory module's estimators are refused, under any name.",
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
        got = _run_watched(largest_micro_batch, model, replace(work, micro_batch=1), layout, budget)
        if got != want:
            raise Wrong(f"{call} returned {got!r}; the estimate allows {want!r}.")
        n, none = n + 1, none + (want is None)
    return f"equal to the estimate on {n} configurations ({none} where not even b = 1 fits)"


def _traffic_cases() -> list[tuple[Any, Any, Any]]:
    from ..planner import LLAMA_8B, LLAMA_70B, Layout, Transformer, Workload

    small = Transformer("24 × 2048", 24, 2048, 16, 50_257)
    layouts = {
        small: [
            Layout(8),
            Layout(4, 2, zero=2),
            Layout(2, 1, 4, zero=3),
            Layout(1, 4, 2),
            Layout(2, 2, 2, zero=1),
        ],
        LLAMA_8B: [Layout(8, zero=3), Layout(4, 2, zero=1), Layout(2, 2, 2, zero=2), Layout(1, 8, 4)],
        LLAMA_70B: [Layout(4, 8, zero=3), Layout(2, 8, 4, zero=1), Layout(1, 8, 8), Layout(16, 4, 2, zero=2)],
    }
    cases = []
    for model, outs in layouts.items():
        for layout, (s, b, g), rc in itertools.product(
            outs, ((2048, 1, 256), (4096, 2, 64), (8192, 1, 32)), ("selective", "full")
        ):
            cases.append((model, Workload(s, b, g, recompute=rc), layout))
    return cases


@exercise(
    "05d.2",
    "the bytes one GPU sends per step",
    task='`bytes_sent(model, work, layout)` → `{"DP": …, "TP": …, "PP": …}`, the bytes one GPU sends '
    "per optimizer step as section 2 models it, with exact ring factors. Compared kind by kind with the "
    "planner's hidden estimate (to 10⁻⁶) on 78 configurations: three models, ZeRO 0–3, TP, PP and their "
    "mixes, three batch shapes, selective and full recomputation. The planner's estimators are refused, "
    "under any name.",
    hint="work from section 2's bullets and the by-hand cell under them: for each kind, which group does "
    "its collective run over (so what is n), which buffer does it move, and how often per step — once, or "
    "once per micro-batch? Then replace each ≈ by the exact ring factor; your function should reproduce "
    "the four by-hand numbers before the graded cases.",
    forbid=_FORBID,
)
def grade_traffic(bytes_sent: Callable[..., Any]) -> str:
    """Compare ``bytes_sent(model, work, layout)`` with the planner's estimate, kind by kind."""
    if not callable(bytes_sent):
        raise Wrong(f"pass your function bytes_sent itself, not {type(bytes_sent).__name__}.")
    from ..planner import communication_bytes

    cases = _traffic_cases()
    for model, work, layout in cases:
        want = communication_bytes(model, work, layout)
        call = (
            f"bytes_sent({model.name}, seq_len={work.seq_len}, micro_batch={work.micro_batch}, "
            f"global_batch={work.global_batch}, recompute={work.recompute!r}, {layout.name})"
        )
        got = _run_watched(bytes_sent, model, work, layout)
        if not isinstance(got, dict) or set(got) != set(want):
            raise Wrong(f"{call} returned {got!r}; return a dict with the keys 'DP', 'TP' and 'PP'.")
        for kind in ("DP", "TP", "PP"):
            try:
                value = float(got[kind])
            except (TypeError, ValueError):
                raise Wrong(f"{call}[{kind!r}] is {got[kind]!r}, not a number of bytes.") from None
            if not math.isclose(value, want[kind], rel_tol=1e-6, abs_tol=1):
                if want[kind] == 0:
                    raise Wrong(
                        f"{call}[{kind!r}] is {value:,.0f} bytes, but this layout sends nothing for {kind}."
                    )
                raise Wrong(f"{call}[{kind!r}] is {value / want[kind]:.3g} × the estimate.")
    return f"equal to the estimate, kind by kind, in {len(cases)} cases (ZeRO 0–3, TP, PP, recomputation)"
