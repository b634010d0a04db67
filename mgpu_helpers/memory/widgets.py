"""Used by notebooks 01 and 07a (:class:`MemoryWidget`, a live memory panel for training loops) and 05b
(:func:`predictor_form`, a form around :func:`~mgpu_helpers.memory.predict_memory`).

Both are built from core ipywidgets only, so they work on ipywidgets 7.7 (Colab) and 8; ipywidgets and
matplotlib are imported when a widget is made, not when this module is imported.

The panel is driven by the loop itself — call :meth:`MemoryWidget.update` once per step — not by a
background thread, so it shows exactly the state between two steps and never races the loop. It shows,
per device, current and peak tracked bytes per category (from a
:class:`~mgpu_helpers.memory.MemoryTracker`), the process's resident memory (psutil), and each GPU's
used memory according to the driver (NVML) where there is one, plus a timeline image.

When there is no live front end (nbval, ``jupyter nbconvert --execute``), widgets simply render
nothing; :meth:`MemoryWidget.finish` therefore replaces the live panel (through its display id) with a
static copy: the final table as text and the timeline as an image, shown once, which a saved notebook
keeps without any widget state. Without :meth:`~MemoryWidget.show` (outside IPython) it prints the table
and draws the figure instead.
"""

from __future__ import annotations

import base64
import html
import math
import numbers
import time
from typing import Any

from .categories import CATEGORIES, CATEGORY_LABELS, _text_table, format_bytes
from .estimate import predict_memory
from .plots import CATEGORY_COLORS
from .tracker import MemoryTracker

__all__ = ["MemoryWidget", "predictor_form"]


def _process_rss() -> int | None:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil missing or not permitted: the panel just omits the row
        return None


class MemoryWidget:
    """Live per-category, per-device memory panel fed from a training loop.

    Example::

        tracker = MemoryTracker(model, optimizer)
        panel = MemoryWidget(tracker, title="MLP, Adam").show()
        with tracker:
            for step in range(20):
                ...  # forward, backward, step
                panel.update(step=step, loss=loss.item())
        panel.finish()

    Args:
        tracker: the :class:`~mgpu_helpers.memory.MemoryTracker` whose numbers are shown.
        title: heading of the panel.
        plot_every_s: redraw the timeline image at most this often, seconds >= 0 (the table updates
            every call).
    """

    def __init__(self, tracker: MemoryTracker, *, title: str = "Memory", plot_every_s: float = 1.0) -> None:
        if not isinstance(tracker, MemoryTracker):
            raise TypeError(
                "MemoryWidget needs a MemoryTracker, e.g. MemoryWidget(MemoryTracker(model, optimizer)), "
                f"not {type(tracker).__name__}"
            )
        if not isinstance(title, str):
            raise TypeError(f"title must be a string such as 'MLP, Adam', not {title!r}")
        if isinstance(plot_every_s, bool) or not isinstance(plot_every_s, numbers.Real):
            raise TypeError(f"plot_every_s must be a number of seconds such as 1.0, not {plot_every_s!r}")
        if not 0 <= plot_every_s < math.inf:
            raise ValueError(
                f"plot_every_s must be >= 0 seconds (0: redraw every update), not {plot_every_s}"
            )
        import ipywidgets as w

        self.tracker = tracker
        self.title = title
        self.plot_every_s = float(plot_every_s)
        self._last_plot = 0.0
        self.updates = 0
        self._handle: Any = None  # the display handle of show(), which finish() updates in place
        self.header = w.HTML()
        self.table = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="720px"))
        self.box = w.VBox([self.header, self.table, self.image])

    def show(self) -> MemoryWidget:
        """Display the panel in the current cell's output and return ``self``."""
        from IPython.display import display

        self._render_table(step=None, metrics={})
        self._handle = display(self.box, display_id=True)  # None outside IPython
        return self

    def update(self, step: int | None = None, **metrics: float) -> None:
        """Refresh from the tracker; call once per training step. ``metrics`` (e.g. loss) are shown too."""
        if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
            raise TypeError(f"step must be a whole number (the step index) or None, not {step!r}")
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"metric {name} must be a number (e.g. loss.item()), not {type(value).__name__}"
                )
        self.updates += 1
        self._render_table(step, metrics)
        now = time.monotonic()
        if now - self._last_plot >= self.plot_every_s:
            self._last_plot = now
            self._render_plot()

    def finish(self) -> None:
        """Final refresh: the live panel is replaced by a static table and timeline image, shown once.

        After :meth:`show` the panel's output is updated in place (a saved notebook keeps the static
        copy); without it (outside IPython) the table is printed and the timeline drawn.
        """
        import matplotlib.pyplot as plt

        self._render_table(None, {})
        self._render_plot()
        self._final_summary = self.text_summary()  # what a saved notebook shows (the RSS moves on)
        if self._handle is not None:
            self._handle.update(_Static(self._final_summary, self.image.value))
            return
        print(self._final_summary)
        self.tracker.plot(title=f"{self.title}: memory by category")
        plt.show()

    # ----------------------------------------------------------------- content
    def rows(self) -> list[tuple[str, dict[str, str]]]:
        """Table content: (row label, {column: text}); columns are devices plus "peak"."""
        from ..hardware import nvml_memory

        tr = self.tracker
        devices = sorted(tr.current_by_device) or ["cpu"]
        rows: list[tuple[str, dict[str, str]]] = []
        for cat in CATEGORIES:
            cells = {d: format_bytes(tr.current_by_device.get(d, {}).get(cat, 0)) for d in devices}
            cells["peak"] = format_bytes(tr.peak[cat])
            rows.append((CATEGORY_LABELS[cat], cells))
        totals = {d: format_bytes(sum(tr.current_by_device.get(d, {}).values())) for d in devices}
        totals["peak"] = format_bytes(tr.peak_total)
        rows.append(("tracked total", totals))
        peaks = {d: format_bytes(tr.peak_by_device.get(d, 0)) for d in devices}
        rows.append(("device peak", {**peaks, "peak": ""}))
        rss = _process_rss()
        if rss is not None:
            rows.append(("process RSS (psutil)", {devices[0]: format_bytes(rss), "peak": ""}))
        for gpu in nvml_memory() or []:
            used = f"{format_bytes(gpu['used'])} / {format_bytes(gpu['total'])}"
            rows.append((f"GPU {gpu['index']} used (NVML, all processes)", {devices[0]: used, "peak": ""}))
        return rows

    def text_summary(self) -> str:
        """The table as aligned plain text."""
        rows = self.rows()
        columns = list(rows[0][1])
        table = [("", *columns)] + [(label, *(cells.get(c, "") for c in columns)) for label, cells in rows]
        return f"{self.title} — tracked tensor memory\n" + _text_table(table)

    def _render_table(self, step: int | None, metrics: dict[str, float]) -> None:
        rows = self.rows()
        columns = list(rows[0][1])
        extra = "".join(f" · {k} {v:.4g}" for k, v in metrics.items())
        where = "" if step is None else f" · step {step}"
        self.header.value = f"<b>{self.title}</b>{where}{extra}"
        head = "".join(f"<th style='text-align:right;padding:0 8px'>{c}</th>" for c in columns)
        body = []
        for label, cells in rows:
            cat = next((c for c in CATEGORIES if CATEGORY_LABELS[c] == label), None)
            swatch = (
                f"<span style='display:inline-block;width:10px;height:10px;background:{CATEGORY_COLORS[cat]};"
                "margin-right:6px'></span>"
                if cat
                else ""
            )
            tds = "".join(
                f"<td style='text-align:right;padding:0 8px'>{cells.get(c, '')}</td>" for c in columns
            )
            body.append(f"<tr><td>{swatch}{label}</td>{tds}</tr>")
        self.table.value = (
            "<table style='font-family:monospace;font-size:12px'>"
            f"<tr><th></th>{head}</tr>{''.join(body)}</table>"
        )

    def _render_plot(self) -> None:
        import matplotlib.pyplot as plt

        from ..figures import figure_to_png

        fig, ax = plt.subplots(figsize=(7, 2.6))
        try:
            self.tracker.plot(ax=ax, title=f"{self.title}: memory by category")
            self.image.value = figure_to_png(fig)
        finally:
            plt.close(fig)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """Plain-text fallback so that a saved notebook without widget state still says something."""
        return {"text/plain": getattr(self, "_final_summary", None) or self.text_summary()}


class _Static:
    """The finished panel: its text table and timeline PNG as one output (HTML, with a text fallback)."""

    def __init__(self, summary: str, png: bytes) -> None:
        self.summary, self.png = summary, png

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        image = base64.b64encode(self.png).decode("ascii")
        page = (
            f"<pre>{html.escape(self.summary)}</pre>"
            f"<img src='data:image/png;base64,{image}' style='max-width:720px'>"
        )
        return {"text/plain": self.summary, "text/html": page}


def predictor_form(default_params_millions: float = 7000.0) -> Any:
    """An ipywidgets form around :func:`~mgpu_helpers.memory.predict_memory` (core widgets only).

    Args:
        default_params_millions: the model size shown first, in millions of parameters (> 0).

    Returns:
        The form (display it); changing any field recomputes the table below it. A field value the
        predictor rejects shows the predictor's message instead of a table.
    """
    if isinstance(default_params_millions, bool) or not isinstance(default_params_millions, numbers.Real):
        raise TypeError(
            f"default_params_millions must be a number such as 7000.0 (7B), not {default_params_millions!r}"
        )
    if not 0 < default_params_millions < math.inf:
        raise ValueError(
            f"default_params_millions must be > 0 (e.g. 7000.0 for 7B), not {default_params_millions}"
        )
    import ipywidgets as w

    params = w.FloatText(value=float(default_params_millions), description="params (M)")
    precision = w.Dropdown(options=["mixed", "autocast", "fp32"], value="mixed", description="precision")
    optimizer = w.Dropdown(options=["adam", "sgd_momentum", "sgd"], value="adam", description="optimizer")
    zero = w.Dropdown(options=[0, 1, 2, 3], value=0, description="ZeRO stage")
    dp = w.IntText(value=1, description="DP size N")
    accum = w.Checkbox(value=False, description="fp32 grad accumulation")
    out = w.HTML()

    def refresh(*_: Any) -> None:
        try:
            pred = predict_memory(
                round(params.value * 1e6),
                precision=precision.value,
                optimizer=optimizer.value,
                zero_stage=zero.value,
                dp_size=dp.value,
                fp32_grad_accumulation=accum.value and precision.value == "mixed",
            )
            out.value = f"<pre>{pred.table()}\n  bytes per parameter: {pred.bytes_per_parameter:.2f}</pre>"
        except (TypeError, ValueError) as exc:
            out.value = f"<pre>{exc}</pre>"

    for field in (params, precision, optimizer, zero, dp, accum):
        field.observe(refresh, names="value")
    refresh()
    return w.VBox([w.HBox([params, precision, optimizer]), w.HBox([zero, dp, accum]), out])
