"""Reference solutions of notebook 05d's exercises and typical wrong attempts (tests/test_solutions.py)."""

from mgpu_helpers.planner import INTER_NODE_BW, INTRA_NODE_BW


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


def _seconds(cost):
    return (
        cost["compute_s"] / (1 - cost["bubble"])
        + cost["intra"] / INTRA_NODE_BW
        + cost["inter"] / INTER_NODE_BW
    )


def best_layout(n_gpus, heads, layers, budget, estimate):
    best, best_time = None, None
    for tp in range(1, min(8, n_gpus) + 1):
        for pp in range(1, n_gpus // tp + 1):
            if n_gpus % (tp * pp) or heads % tp or layers % pp:
                continue
            dp = n_gpus // (tp * pp)
            for zero in (0, 1, 2, 3) if dp > 1 else (0,):
                cost = estimate(dp, tp, pp, zero)
                if cost is None or cost["memory"] > budget:
                    continue
                if best_time is None or _seconds(cost) < best_time:
                    best, best_time = (dp, tp, pp, zero), _seconds(cost)
    return best


def best_layout_one_kind_at_a_time(n_gpus, heads, layers, budget, estimate):
    """Tries pure DP/ZeRO, pure TP and pure PP, never a combination."""
    options = [(n_gpus, 1, 1, z) for z in (0, 1, 2, 3)]
    if n_gpus <= 8 and heads % n_gpus == 0:
        options.append((1, n_gpus, 1, 0))
    if layers % n_gpus == 0:
        options.append((1, 1, n_gpus, 0))
    best, best_time = None, None
    for layout in options:
        cost = estimate(*layout)
        if (
            cost is not None
            and cost["memory"] <= budget
            and (best_time is None or _seconds(cost) < best_time)
        ):
            best, best_time = layout, _seconds(cost)
    return best


SOLUTIONS = {"05d.1": (largest_micro_batch,), "05d.2": (best_layout,)}
WRONG = {"05d.1": (largest_micro_batch_one_in_flight,), "05d.2": (best_layout_one_kind_at_a_time,)}
