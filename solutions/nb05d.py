"""Reference solutions of notebook 05d's exercises, typical wrong attempts and known shortcuts
(tests/test_solutions.py)."""

from dataclasses import replace

from mgpu_helpers.graders import nb05d as _grader
from mgpu_helpers.planner import communication_bytes as _ready_traffic
from mgpu_helpers.planner import plan as _estimate


def _state(psi, dp, tp, pp, zero):
    share = psi / (tp * pp)
    return (2 * share / (dp if zero >= 3 else 1) + 2 * share / (dp if zero >= 2 else 1)
            + 12 * share / (dp if zero >= 1 else 1))  # fmt: skip


def _per_layer(model, work, b, tp):
    sbh, sp = work.seq_len * b * model.hidden, work.sequence_parallel
    if work.recompute == "full":
        return 2 * sbh / (tp if sp else 1)
    attention = 0 if work.recompute == "selective" else 5 * model.heads * work.seq_len / (model.hidden * tp)
    return sbh * ((34 / tp if sp else 10 + 24 / tp) + attention)


def largest_micro_batch(model, work, layout, budget):
    state = _state(model.params, layout.dp, layout.tp, layout.pp, layout.zero)
    per_rank = work.global_batch // layout.dp
    best = None
    for b in range(1, per_rank + 1):
        if per_rank % b:
            continue  # not a whole number of micro-batches
        in_flight = min(layout.pp, per_rank // b)  # 1F1B: the first stage holds up to p micro-batches
        act = model.layers // layout.pp * in_flight * _per_layer(model, work, b, layout.tp)
        if state + act <= budget:
            best = b
    return best


def largest_micro_batch_one_in_flight(model, work, layout, budget):
    """Forgets that the first pipeline stage holds up to p micro-batches under 1F1B."""
    state = _state(model.params, layout.dp, layout.tp, layout.pp, layout.zero)
    per_rank = work.global_batch // layout.dp
    fitting = [
        b
        for b in range(1, per_rank + 1)
        if per_rank % b == 0
        and state + model.layers // layout.pp * _per_layer(model, work, b, layout.tp) <= budget
    ]
    return max(fitting, default=None)


def largest_micro_batch_from_aliased_planner(model, work, layout, budget):
    """Shortcut: the planner's own estimate under another name (``plan as _estimate``)."""
    per_rank = work.global_batch // layout.dp
    sizes = [b for b in range(1, per_rank + 1) if per_rank % b == 0]
    fits = [b for b in sizes if _estimate(model, replace(work, micro_batch=b), layout).memory <= budget]
    return max(fits, default=None)


def largest_micro_batch_from_the_grader(model, work, layout, budget):
    """Shortcut: the grader's own answer key, reached through the module."""
    return _grader._largest(model, work, layout, budget)[0]


def bytes_sent(model, work, layout):
    d, t, p, b = layout.dp, layout.tp, layout.pp, work.micro_batch
    m = work.global_batch // (d * b)  # micro-batches per data-parallel rank
    share, ring = model.params / (t * p), (d - 1) / d
    values = {0: 2 * ring, 1: 2 * ring, 2: (m + 1) * ring, 3: 3 * m * ring}[layout.zero] * share
    bsh = b * work.seq_len * model.hidden
    all_reduces = 6 if work.recompute == "full" else 4  # full recomputation repeats the forward's two
    tp_values = all_reduces * 2 * (t - 1) / t * bsh * (model.layers // p) * m
    pp_values = (0 if p == 1 else 1 if p == 2 else 2) * bsh * m  # a middle stage sends both ways
    return {"DP": 2 * values, "TP": 2 * tp_values, "PP": 2 * pp_values}  # bf16: 2 bytes per value


def bytes_sent_zero3_once_per_step(model, work, layout):
    """Counts ZeRO-3's gathers and reduce-scatter once per step, not once per micro-batch."""
    sent = bytes_sent(model, work, layout)
    if layout.zero == 3:
        sent["DP"] = 2 * 3 * (layout.dp - 1) / layout.dp * model.params / (layout.tp * layout.pp)
    return sent


def bytes_sent_from_aliased_planner(model, work, layout):
    """Shortcut: the planner's ``communication_bytes`` under another name."""
    return _ready_traffic(model, work, layout)


def bytes_sent_from_a_plan(model, work, layout):
    """Shortcut: the traffic a whole plan computes, ``plan(...).comm``, under another name."""
    return dict(_estimate(model, work, layout).comm)


SOLUTIONS = {"05d.1": (largest_micro_batch,), "05d.2": (bytes_sent,)}
WRONG = {"05d.1": (largest_micro_batch_one_in_flight,), "05d.2": (bytes_sent_zero3_once_per_step,)}
SHORTCUTS = {
    "05d.1": {
        "aliased planner": (largest_micro_batch_from_aliased_planner,),
        "grader's answer key": (largest_micro_batch_from_the_grader,),
    },
    "05d.2": {
        "aliased communication_bytes": (bytes_sent_from_aliased_planner,),
        "aliased plan().comm": (bytes_sent_from_a_plan,),
    },
}
