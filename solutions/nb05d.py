"""Reference solutions of notebook 05d's exercises and typical wrong attempts (tests/test_solutions.py)."""


def activation_bytes_per_gpu(seq_len, micro_batch, hidden, heads, layers, tp, pp, n_micro, recompute):
    sbh = seq_len * micro_batch * hidden
    if recompute == "full":
        per_layer = 2 * sbh  # only each layer's input is kept
    else:
        attention = 0 if recompute == "selective" else 5 * heads * seq_len / (hidden * tp)
        per_layer = sbh * (10 + 24 / tp + attention)  # layer norms and dropout masks stay whole
    return layers // pp * min(pp, n_micro) * per_layer  # 1F1B: up to pp micro-batches in flight


def activation_bytes_all_divided_by_tp(
    seq_len, micro_batch, hidden, heads, layers, tp, pp, n_micro, recompute
):
    """Divides every activation by tp, as if sequence parallelism were on."""
    sbh = seq_len * micro_batch * hidden
    if recompute == "full":
        per_layer = 2 * sbh
    else:
        attention = 0 if recompute == "selective" else 5 * heads * seq_len / hidden
        per_layer = sbh * (34 + attention) / tp
    return layers // pp * min(pp, n_micro) * per_layer


def best_layout(n_gpus, heads, layers, gpu_bytes, estimate):
    best, best_key = None, None
    for tp in range(1, min(8, n_gpus) + 1):
        for pp in range(1, n_gpus // tp + 1):
            if n_gpus % (tp * pp) or heads % tp or layers % pp:
                continue
            dp = n_gpus // (tp * pp)
            for zero in (0, 1, 2, 3) if dp > 1 else (0,):
                cost = estimate(dp, tp, pp, zero)
                if cost is None or cost["memory"] > gpu_bytes:
                    continue
                key = (cost["bubble"], cost["sent"])
                if best_key is None or key < best_key:
                    best, best_key = (dp, tp, pp, zero), key
    return best


def best_layout_one_kind_at_a_time(n_gpus, heads, layers, gpu_bytes, estimate):
    """Tries pure DP/ZeRO, pure TP and pure PP, never a combination."""
    options = [(n_gpus, 1, 1, z) for z in (0, 1, 2, 3)]
    if n_gpus <= 8 and heads % n_gpus == 0:
        options.append((1, n_gpus, 1, 0))
    if layers % n_gpus == 0:
        options.append((1, 1, n_gpus, 0))
    best, best_key = None, None
    for layout in options:
        cost = estimate(*layout)
        if cost is not None and cost["memory"] <= gpu_bytes:
            key = (cost["bubble"], cost["sent"])
            if best_key is None or key < best_key:
                best, best_key = layout, key
    return best


SOLUTIONS = {"05d.1": (activation_bytes_per_gpu,), "05d.2": (best_layout,)}
WRONG = {"05d.1": (activation_bytes_all_divided_by_tp,), "05d.2": (best_layout_one_kind_at_a_time,)}
