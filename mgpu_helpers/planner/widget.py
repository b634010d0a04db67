"""Used by notebook 05d through :mod:`mgpu_helpers.planner`: the planner form (ipywidgets), whose
"measure this layout" button runs the scale lab's dry run (:func:`mgpu_helpers.scale.dry_run`), and the
GPU memory of this machine."""

from __future__ import annotations

from typing import Any

from .formulas import _RECOMPUTE, GIB, LLAMA_8B, PRESETS, Transformer, Workload
from .plans import no_layout_reason, plan_all, plans_html


def gpu_memory_gib(default: float = 80.0) -> tuple[float, str]:
    """This machine's first GPU's memory in GiB (from NVML, without touching CUDA), or ``default``."""
    from ..hardware import describe_node

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
    which = box(w.Dropdown, None, "measure", "520px", options=[])
    measure = w.Button(description="measure this layout", layout=w.Layout(width="250px"))
    shown = ""  # the planner's table, kept so that a measurement can be shown below it

    def use_preset(*_: Any) -> None:
        m = PRESETS[preset.value]
        layers.value, hidden.value, heads.value = m.layers, m.hidden, m.heads

    def refresh(*_: Any) -> None:
        from ..scale.dryrun import unmeasurable  # here, not above: mgpu_helpers.scale imports the planner

        nonlocal shown
        try:
            m = PRESETS[preset.value]
            if (layers.value, hidden.value, heads.value) != (m.layers, m.hidden, m.heads):
                m = Transformer("custom", layers.value, hidden.value, heads.value, 128_256)
            work = Workload(seq.value, mbs.value, global_batch.value, recompute=recompute.value)
            plans = plan_all(m, work, gpus.value, gpu_mem.value)
            table = plans_html(plans, limit) if plans else f"<p>{no_layout_reason(m, work, gpus.value)}</p>"
            which.options = [(q.layout.name, q.layout) for q in plans[:limit] if not unmeasurable(q.layout)]
            shown = f"<p>{m.name}: {m.params / 1e9:,.2f} B parameters</p>{table}"
        except (TypeError, ValueError) as exc:
            which.options, shown = [], f"<pre>{exc}</pre>"
        out.value = shown

    def measure_layout(*_: Any) -> None:  # the scale lab's dry run (05g): one block, rank 0 of the layout
        from ..scale.dryrun import dry_run

        m = PRESETS[preset.value]
        if (layers.value, hidden.value, heads.value) != (m.layers, m.hidden, m.heads) or which.value is None:
            out.value = shown + "<p>Measuring needs a preset's Llama shape and a layout in the list.</p>"
            return
        out.value = shown + f"<p>measuring {which.value.name} (one block, rank 0)…</p>"
        try:
            out.value = shown + dry_run(m, which.value).html()
        except (MemoryError, ValueError) as exc:
            out.value = shown + f"<p>Not measured: {exc}</p>"

    preset.observe(use_preset, names="value")
    fields = (layers, hidden, heads, gpus, gpu_mem, seq, mbs, global_batch, recompute)
    for f in fields:
        f.observe(refresh, names="value")
    measure.on_click(measure_layout)
    refresh()
    rows = [[preset], [layers, hidden, heads], [gpus, gpu_mem], [seq, mbs, global_batch], [recompute]]
    rows.append([which, measure])
    form = w.VBox([*(w.HBox(row) for row in rows), out])  # rows of at most 3 × 250 px
    form.fields = {f.description: f for f in (preset, *fields, which)}
    form.measure = measure  # the button (tests click it)
    return form
