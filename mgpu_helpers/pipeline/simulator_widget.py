"""Used by notebook 02b (§3, the schedule simulator). :class:`ScheduleSimulator`: sliders for a
pipeline schedule, its Gantt chart and its bubble, from core ipywidgets (7.7 on Colab, and 8)."""

from __future__ import annotations

from typing import Any

from .._checks import choice, real, whole
from .schedule_plots import plot_schedule
from .schedules import SCHEDULES, ScheduleResult, simulate

__all__ = ["ScheduleSimulator"]

#: Slider ranges: (min, max) of stages, micro-batches, backward:forward ratio, chunks.
_P_RANGE, _M_RANGE, _RATIO_RANGE, _V_RANGE = (1, 8), (1, 32), (0.5, 4.0), (1, 4)


def _check_in(value: Any, name: str, bounds: tuple[Any, Any], what: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"{name} ({what}) must be in {low}..{high} (the slider's range), not {value}")


class ScheduleSimulator:
    """Interactive schedule simulator: sliders for p, m, F:B cost ratio and chunks; a Gantt chart and numbers.

    Built from core ipywidgets only (IntSlider, FloatSlider, Dropdown, HTML, Image, boxes), so it works
    with ipywidgets 7.7 (Colab) and 8. The chart is a PNG in an ``Image`` widget. ``show()`` displays the
    panel together with a static PNG of the current configuration as a fallback: a live front end shows
    the sliders, a headless run (nbval, nbconvert, a notebook viewed on GitHub) shows the static figure.

    Args:
        schedule: initial schedule, one of :data:`~mgpu_helpers.pipeline.SCHEDULES`.
        p: initial stages, 1..8.
        m: initial micro-batches, 1..32.
        ratio: initial backward:forward cost ratio, 0.5..4.
        v: initial chunks per device for the interleaved schedule, 1..4.
    """

    def __init__(
        self, schedule: str = "1f1b", p: int = 4, m: int = 8, ratio: float = 2.0, v: int = 2
    ) -> None:
        choice("schedule", schedule, SCHEDULES)
        _check_in(whole("p (pipeline stages)", p, 1), "p", _P_RANGE, "pipeline stages")
        _check_in(whole("m (micro-batches)", m, 1), "m", _M_RANGE, "micro-batches")
        ratio = real("ratio (backward : forward cost)", ratio, 0, open_low=True)
        _check_in(ratio, "ratio", _RATIO_RANGE, "backward : forward cost")
        _check_in(whole("v (chunks per device)", v, 1), "v", _V_RANGE, "chunks per device")
        import ipywidgets as w

        style = {"description_width": "150px"}
        layout = w.Layout(width="460px")
        self.schedule = w.Dropdown(
            options=[(name, key) for key, name in SCHEDULES.items()],
            value=schedule,
            description="schedule",
            style=style,
            layout=layout,
        )
        self.p = w.IntSlider(
            value=p, min=_P_RANGE[0], max=_P_RANGE[1], description="stages p", style=style, layout=layout
        )
        self.m = w.IntSlider(
            value=m,
            min=_M_RANGE[0],
            max=_M_RANGE[1],
            description="micro-batches m",
            style=style,
            layout=layout,
        )
        self.ratio = w.FloatSlider(
            value=ratio,
            min=_RATIO_RANGE[0],
            max=_RATIO_RANGE[1],
            step=0.5,
            description="backward : forward",
            style=style,
            layout=layout,
        )
        self.v = w.IntSlider(
            value=v,
            min=_V_RANGE[0],
            max=_V_RANGE[1],
            description="chunks v (interleaved)",
            style=style,
            layout=layout,
        )
        self.info = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="900px"))
        controls = w.VBox([self.schedule, self.p, self.m, self.ratio, self.v])
        self.box = w.VBox([controls, self.info, self.image])
        for widget in (self.schedule, self.p, self.m, self.ratio, self.v):
            widget.observe(self._on_change, names="value")
        self.result: ScheduleResult | None = None
        self.error: str | None = None
        self.refresh()

    def config(self) -> dict[str, Any]:
        """The configuration the sliders describe, as keyword arguments of :func:`simulate`."""
        interleaved = self.schedule.value == "interleaved"
        return {
            "schedule": self.schedule.value,
            "p": int(self.p.value),
            "m": int(self.m.value),
            "forward": 1.0,
            "backward": float(self.ratio.value),
            "v": int(self.v.value) if interleaved else 1,
        }

    def _on_change(self, _change: Any) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Re-simulate the current configuration and redraw the chart and the numbers."""
        self.v.disabled = self.schedule.value != "interleaved"
        try:
            self.result = simulate(**self.config())
            self.error = None
        except ValueError as exc:  # e.g. interleaved with m not a multiple of p: say so, keep the panel
            self.result, self.error = None, str(exc)
            self.info.value = f"<span style='color:#B22222'>{exc}</span>"
            self.image.value = b""  # no chart of an earlier configuration under the message
            self.image.layout.display = "none"
            return
        r = self.result
        self.info.value = (
            f"<b>bubble</b> {r.bubble_fraction:.1%} of the step · {r.bubble_ratio:.1%} of the ideal time · "
            f"<b>peak in flight</b> {max(r.peak_activations):g} micro-batches' activations (stage 0) · "
            f"step {r.makespan:g} vs ideal {r.ideal:g} <i>(simulated)</i>"
        )
        self.image.value = self.png()
        self.image.layout.display = None  # shown again after an error hid it

    def png(self) -> bytes:
        """The current chart as PNG bytes (ValueError, saying why, when the configuration cannot run)."""
        import matplotlib.pyplot as plt

        from ..figures import figure_to_png

        if self.result is None:
            raise ValueError(self.error or "nothing simulated yet: call refresh()")
        fig, ax = plt.subplots(figsize=(10, 0.5 * self.result.p + 1.5))
        try:
            plot_schedule(self.result, ax=ax)
            return figure_to_png(fig, dpi=80)
        finally:
            plt.close(fig)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """Widget view for live front ends, plus the chart as a PNG and a text summary for the rest."""
        import base64

        bundle: dict[str, Any] = {
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2,
                "version_minor": 0,
                "model_id": self.box.model_id,
            },
            "text/plain": self.result.summary() if self.result else (self.error or ""),
        }
        if self.result is not None:
            bundle["image/png"] = base64.b64encode(self.image.value).decode("ascii")  # drawn by refresh()
        return bundle

    def show(self) -> ScheduleSimulator:
        """Display the panel (static PNG fallback included, see the class docstring); return ``self``."""
        from IPython.display import display

        display(self)
        return self
