"""A live memory panel for training loops, built from core ipywidgets only (works on 7.7 and 8).

The panel is driven by the loop itself — call :meth:`MemoryWidget.update` once per step — not by a
background thread, so it shows exactly the state between two steps and never races the loop.
It shows, per device, current and peak tracked bytes per category (from a
:class:`~mgpu_helpers.memory.MemoryTracker`), the process's resident memory (psutil), and each GPU's
used memory according to the driver (NVML) where there is one, plus a timeline image.

When there is no live front end (nbval, ``jupyter nbconvert --execute``), widgets simply render
nothing; :meth:`MemoryWidget.finish` therefore also prints a plain-text table and draws a static
figure, so a saved notebook shows the result without any widget state.
"""

from __future__ import annotations

import time
from typing import Any

from .memory import CATEGORIES, CATEGORY_LABELS, MemoryTracker, format_bytes
from .plotting import CATEGORY_COLORS, figure_to_png

__all__ = ["MemoryWidget"]


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
        tracker: the tracker whose numbers are shown.
        title: heading of the panel.
        plot_every_s: redraw the timeline image at most this often (the table updates every call).
    """

    def __init__(self, tracker: MemoryTracker, *, title: str = "Memory", plot_every_s: float = 1.0) -> None:
        import ipywidgets as w

        self.tracker = tracker
        self.title = title
        self.plot_every_s = plot_every_s
        self._last_plot = 0.0
        self.updates = 0
        self.header = w.HTML()
        self.table = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="720px"))
        self.box = w.VBox([self.header, self.table, self.image])

    def show(self) -> MemoryWidget:
        """Display the panel in the current cell's output and return ``self``."""
        from IPython.display import display

        self._render_table(step=None, metrics={})
        display(self.box)
        return self

    def update(self, step: int | None = None, **metrics: float) -> None:
        """Refresh from the tracker; call once per training step. ``metrics`` (e.g. loss) are shown too."""
        self.updates += 1
        self._render_table(step, metrics)
        now = time.monotonic()
        if now - self._last_plot >= self.plot_every_s:
            self._last_plot = now
            self._render_plot()

    def finish(self) -> None:
        """Final refresh, then print the summary as text and draw a static timeline."""
        import matplotlib.pyplot as plt

        self._render_table(None, {})
        self._render_plot()
        print(self.text_summary())
        self.tracker.plot(title=f"{self.title}: memory by category")
        plt.show()

    # ----------------------------------------------------------------- content
    def rows(self) -> list[tuple[str, dict[str, str]]]:
        """Table content: (row label, {column: text}); columns are devices plus "peak"."""
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
        from .hardware import nvml_memory

        for gpu in nvml_memory() or []:
            label = f"GPU {gpu['index']} used (NVML, all processes)"
            rows.append(
                (
                    label,
                    {devices[0]: f"{format_bytes(gpu['used'])} / {format_bytes(gpu['total'])}", "peak": ""},
                )
            )
        return rows

    def text_summary(self) -> str:
        """The table as aligned plain text."""
        rows = self.rows()
        columns = list(rows[0][1])
        width0 = max(len(r[0]) for r in rows)
        widths = [max(len(c), *(len(r[1].get(c, "")) for r in rows)) for c in columns]
        lines = [f"{self.title} — tracked tensor memory"]
        lines.append(
            "  ".join(["".ljust(width0)] + [c.rjust(w) for c, w in zip(columns, widths, strict=True)])
        )
        for label, cells in rows:
            lines.append(
                "  ".join(
                    [label.ljust(width0)]
                    + [cells.get(c, "").rjust(w) for c, w in zip(columns, widths, strict=True)]
                )
            )
        return "\n".join(lines)

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

        fig, ax = plt.subplots(figsize=(7, 2.6))
        try:
            self.tracker.plot(ax=ax, title=f"{self.title}: memory by category")
            self.image.value = figure_to_png(fig)
        finally:
            plt.close(fig)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """Plain-text fallback so that a saved notebook without widget state still says something."""
        return {"text/plain": self.text_summary()}
