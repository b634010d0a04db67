"""Pipeline schedules, simulated: GPipe, 1F1B and interleaved 1F1B on ``p`` stages with ``m`` micro-batches.

Pure Python (matplotlib and ipywidgets are imported only to draw). The simulator answers the questions
a pipeline schedule is judged by — how long is a step, how much of it is *bubble* (idle time), and how
many micro-batches' activations must a stage hold at once — without any hardware::

    >>> r = simulate("gpipe", p=4, m=8)
    >>> round(r.bubble_fraction, 4), round(gpipe_bubble(4, 8), 4)
    (0.2727, 0.2727)
    >>> r.peak_in_flight, simulate("1f1b", p=4, m=8).peak_in_flight
    ([8, 8, 8, 8], [4, 3, 2, 1])

How it works
------------
Each stage (device) executes its own *order* of actions — ``("F", microbatch, chunk)`` or
``("B", microbatch, chunk)``, given by :func:`stage_order` — one at a time, each as early as its
inputs allow: a forward needs the previous stage's forward of the same micro-batch, a backward needs
the next stage's backward (the last stage's backward needs its own forward). That is exactly how a
real pipeline runtime behaves (blocking on receives), so the same orders drive the real stage
processes in :mod:`mgpu_helpers.pipeline`.

Two definitions of "bubble" are in use, and this module offers both:

* :attr:`ScheduleResult.bubble_fraction` — idle share of the *total* step time; for GPipe and 1F1B it
  is ``(p - 1) / (m + p - 1)`` (:func:`gpipe_bubble`);
* :attr:`ScheduleResult.bubble_ratio` — idle time *relative to the ideal* (bubble-free) time; for
  GPipe and 1F1B ``(p - 1) / m``, for interleaved 1F1B with ``v`` chunks per device
  ``(p - 1) / (v · m)`` (:func:`bubble_relative_to_ideal`) — the form the Megatron-LM paper uses.

Numbers from here are *simulated* (uniform stage costs, free communication unless ``comm`` is set).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SCHEDULES",
    "KIND_COLORS",
    "Action",
    "ScheduleResult",
    "ScheduleSimulator",
    "Task",
    "bubble_relative_to_ideal",
    "gpipe_bubble",
    "pipeline_speedup",
    "plot_gantt",
    "plot_schedule",
    "simulate",
    "stage_order",
]

#: Schedules the simulator knows, with their display names.
SCHEDULES: dict[str, str] = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}
#: Bar colours in Gantt charts: forward and backward passes.
KIND_COLORS: dict[str, str] = {"F": "#4C72B0", "B": "#DD8452"}

#: One unit of work on a stage: (kind "F" or "B", micro-batch index, chunk index).
Action = tuple[str, int, int]


@dataclass(frozen=True)
class Task:
    """One forward or backward pass of one micro-batch on one stage, with its start and end time.

    Used for simulated schedules (times in units of one forward pass) and for measured timelines
    (times in seconds since the stages started together). Measured CPU tasks also carry ``cpu``: the
    CPU time the stage's thread got during the pass (less than ``duration`` when other programs
    compete for the core).
    """

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int = 0
    cpu: float | None = None

    @property
    def duration(self) -> float:
        """``end - start``."""
        return self.end - self.start


# ---------------------------------------------------------------------- formulas
def gpipe_bubble(p: int, m: int) -> float:
    """Idle share of the total step time for GPipe (and 1F1B): ``(p - 1) / (m + p - 1)``."""
    _check_pm(p, m)
    return (p - 1) / (m + p - 1)


def bubble_relative_to_ideal(p: int, m: int, v: int = 1) -> float:
    """Idle time divided by the ideal (bubble-free) time: ``(p - 1) / (v · m)``.

    ``v = 1`` gives GPipe and 1F1B; ``v > 1`` is interleaved 1F1B with ``v`` model chunks per device.
    """
    _check_pm(p, m)
    if v < 1:
        raise ValueError(f"v (chunks per device) must be at least 1, got {v}")
    return (p - 1) / (v * m)


def pipeline_speedup(p: int, m: int) -> float:
    """Speed-up of GPipe with ``m`` micro-batches over the naive split (``m = 1``): ``m·p / (m + p - 1)``."""
    _check_pm(p, m)
    return m * p / (m + p - 1)


def _check_pm(p: int, m: int) -> None:
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"p (pipeline stages) must be an integer >= 1, got {p!r}")
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"m (micro-batches) must be an integer >= 1, got {m!r}")


# ---------------------------------------------------------------------- orders
def stage_order(schedule: str, stage: int, p: int, m: int, v: int = 1) -> list[Action]:
    """The order in which ``stage`` (0-based, of ``p``) runs its forward and backward passes.

    * ``"gpipe"`` — all ``m`` forwards, then all ``m`` backwards (fill, then drain);
    * ``"1f1b"`` — ``p - stage - 1`` warm-up forwards, then one forward / one backward alternately,
      then the remaining backwards; a stage never holds more than ``p - stage`` micro-batches;
    * ``"interleaved"`` — each device holds ``v`` model chunks (virtual stage ``chunk·p + stage``);
      micro-batches go through in groups of ``p``, as in Megatron-LM, which needs ``m`` to be a
      multiple of ``p``.

    Returns a list of ``(kind, microbatch, chunk)``.
    """
    _check_pm(p, m)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in 0..{p - 1}, got {stage}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, not {schedule!r}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"v (chunks per device) applies to 'interleaved' only; {schedule!r} needs v=1")
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b":
        return _one_f_one_b([("F", i, 0) for i in range(m)], [("B", i, 0) for i in range(m)], p - stage - 1)
    if v < 1:
        raise ValueError(f"v (chunks per device) must be at least 1, got {v}")
    if m % p:
        raise ValueError(
            f"interleaved 1F1B sends micro-batches through in groups of p, so m must be a multiple of "
            f"p (Megatron-LM's rule): got p={p}, m={m}. Try m={m + p - m % p}."
        )

    def action(kind: str, k: int) -> Action:
        group, within = divmod(k, p * v)
        chunk = within // p
        return (kind, group * p + within % p, chunk if kind == "F" else v - 1 - chunk)

    n = m * v
    # Megatron-LM's warm-up; with one chunk per device it is plain 1F1B.
    warmup = p - stage - 1 if v == 1 else (p - stage - 1) * 2 + (v - 1) * p
    return _one_f_one_b([action("F", k) for k in range(n)], [action("B", k) for k in range(n)], warmup)


def _one_f_one_b(forwards: list[Action], backwards: list[Action], warmup: int) -> list[Action]:
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards, strict=False):
        order += [f, b]
    return order + backwards[len(forwards) - warmup :]


# ---------------------------------------------------------------------- simulation
class StageTimes:
    """Busy and idle time per stage, shared by simulated schedules and measured timelines.

    Subclasses provide ``tasks``, ``makespan`` and the number of stages.
    """

    tasks: list[Task]

    @property
    def makespan(self) -> float:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def _stage_count(self) -> int:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def busy(self, stage: int) -> float:
        """Time ``stage`` spends computing."""
        return sum(t.duration for t in self.tasks if t.stage == stage)

    def idle_fraction(self, stage: int) -> float:
        """Share of the step during which ``stage`` is idle."""
        return 1.0 - self.busy(stage) / self.makespan

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over stages (``(p-1)/(m+p-1)`` for GPipe and 1F1B)."""
        n = self._stage_count()
        return sum(self.idle_fraction(s) for s in range(n)) / n


@dataclass
class ScheduleResult(StageTimes):
    """A simulated schedule: every task's times, and what they add up to."""

    schedule: str
    p: int
    m: int
    v: int
    forward: float
    backward: float
    tasks: list[Task] = field(repr=False)

    @property
    def makespan(self) -> float:
        """Time from the first forward's start to the last backward's end."""
        return max(t.end for t in self.tasks) - min(t.start for t in self.tasks)

    @property
    def ideal(self) -> float:
        """Bubble-free time: the work of one stage, ``m · (forward + backward)``."""
        return self.m * (self.forward + self.backward)

    def _stage_count(self) -> int:
        return self.p

    @property
    def bubble_ratio(self) -> float:
        """Idle time relative to the ideal time: ``(p-1)/m`` (GPipe, 1F1B), ``(p-1)/(v·m)`` (interleaved)."""
        return self.makespan / self.ideal - 1.0

    @property
    def peak_in_flight(self) -> list[int]:
        """Per stage: most micro-batches whose activations are held at once (forward done, backward not)."""
        return [max(_in_flight(self.tasks, s, self.v, distinct=True), default=0) for s in range(self.p)]

    @property
    def peak_activations(self) -> list[float]:
        """Per stage: most activations held at once, in units of one micro-batch's activations for a
        whole stage (a chunk of an interleaved stage counts ``1/v``)."""
        return [max(_in_flight(self.tasks, s, self.v, distinct=False), default=0.0) for s in range(self.p)]

    def summary(self) -> str:
        """One line: schedule, makespan, both bubble measures, peak in-flight micro-batches."""
        chunks = f", v={self.v}" if self.schedule == "interleaved" else ""
        peak = max(self.peak_activations)
        return (
            f"{SCHEDULES[self.schedule]} p={self.p}, m={self.m}{chunks}, "
            f"F:B = {self.forward:g}:{self.backward:g} — step {self.makespan:g} (ideal {self.ideal:g}), "
            f"bubble {self.bubble_fraction:.1%} of the step = {self.bubble_ratio:.1%} of ideal, "
            f"peak in flight {peak:g} micro-batches (simulated)"
        )


def _in_flight(tasks: Sequence[Task], stage: int, v: int, *, distinct: bool) -> list[float]:
    """Activations held on ``stage`` after each change: +1 as a forward starts, -1 as its backward ends."""
    changes = []
    for t in tasks:
        if t.stage == stage:
            changes.append((t.start, 1, t) if t.kind == "F" else (t.end, -1, t))
    changes.sort(key=lambda c: (c[0], c[1]))  # at equal times, free before allocate
    held: dict[tuple[int, int], None] = {}
    levels: list[float] = []
    for _, delta, t in changes:
        key = (t.microbatch, t.chunk)
        if delta > 0:
            held[key] = None
        else:
            held.pop(key, None)
        levels.append(len({mb for mb, _ in held}) if distinct else len(held) / v)
    return levels


def simulate(
    schedule: str,
    p: int,
    m: int,
    *,
    forward: float = 1.0,
    backward: float = 2.0,
    v: int = 1,
    comm: float = 0.0,
) -> ScheduleResult:
    """Simulate one training step of ``schedule`` on ``p`` stages with ``m`` micro-batches.

    Args:
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        p: pipeline stages (devices).
        m: micro-batches per step.
        forward: time of one micro-batch's forward pass through one whole stage.
        backward: same for the backward pass (about twice the forward in practice).
        v: model chunks per device (interleaved only; each chunk costs ``1/v`` of a stage).
        comm: time to hand an activation or gradient to the next device.

    Returns:
        A :class:`ScheduleResult`.
    """
    if forward <= 0 or backward <= 0:
        raise ValueError(f"forward and backward costs must be positive, got {forward} and {backward}")
    if comm < 0:
        raise ValueError(f"comm must be >= 0, got {comm}")
    orders = [stage_order(schedule, s, p, m, v) for s in range(p)]
    stages_total = p * v  # virtual stages: chunk c of device d is virtual stage c·p + d
    cost = {"F": forward / v, "B": backward / v}
    done: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, microbatch) -> end time
    free = [0.0] * p
    nxt = [0] * p
    tasks: list[Task] = []

    def ready(kind: str, vs: int, mb: int) -> float | None:
        """Earliest start allowed by the data dependency, or None if the input is not there yet."""
        if kind == "F":
            dep = None if vs == 0 else ("F", vs - 1, mb)
        else:
            dep = ("F", vs, mb) if vs == stages_total - 1 else ("B", vs + 1, mb)
        if dep is None:
            return 0.0
        if dep not in done:
            return None
        crosses = dep[1] % p != vs % p
        return done[dep] + (comm if crosses else 0.0)

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d in range(p):
            while nxt[d] < len(orders[d]):
                kind, mb, chunk = orders[d][nxt[d]]
                vs = chunk * p + d
                at = ready(kind, vs, mb)
                if at is None:
                    break
                start = max(free[d], at)
                end = start + cost[kind]
                done[(kind, vs, mb)] = end
                free[d] = end
                tasks.append(Task(d, kind, mb, start, end, chunk))
                nxt[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = {d: orders[d][nxt[d]] for d in range(p) if nxt[d] < len(orders[d])}
            raise RuntimeError(f"schedule {schedule!r} deadlocks: every stage waits; next actions {waiting}")
    return ScheduleResult(schedule, p, m, v, forward, backward, tasks)


# ---------------------------------------------------------------------- drawing
def plot_gantt(
    tasks: Sequence[Task],
    *,
    ax: Any = None,
    title: str | None = None,
    time_unit: str = "time",
    scale: float = 1.0,
    note: str | None = None,
    stage_names: Sequence[str] | None = None,
    label_microbatches: bool = True,
) -> Any:
    """Draw a Gantt chart: one row per stage (stage 0 on top), a bar per forward (blue) / backward (orange).

    White space in a row is idle time — the pipeline *bubble*. Bars of chunk > 0 (interleaved
    schedules) are drawn lighter. ``scale`` multiplies times (e.g. 1000 to show seconds as ms). ``note``
    is written under the title (e.g. "measured on …" or "simulated"). Returns the axes.
    """
    from matplotlib.patches import Patch

    if ax is None:
        import matplotlib.pyplot as plt

        stages = 1 + max((t.stage for t in tasks), default=0)
        _, ax = plt.subplots(figsize=(10, 0.55 * stages + 1.4))
    if not tasks:
        raise ValueError("no tasks to draw")
    stages = 1 + max(t.stage for t in tasks)
    t0 = min(t.start for t in tasks)
    span = (max(t.end for t in tasks) - t0) * scale
    groups: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    for t in tasks:  # one bar collection per stage, kind and chunk shade: fast to draw
        x, w = (t.start - t0) * scale, t.duration * scale
        groups.setdefault((t.stage, t.kind, t.chunk > 0), []).append((x, w))
        if label_microbatches and w > span / 60:
            ax.text(
                x + w / 2, t.stage, str(t.microbatch), ha="center", va="center", fontsize=7, color="white"
            )
    for (stage, kind, later_chunk), bars in groups.items():
        ax.broken_barh(
            bars,
            (stage - 0.4, 0.8),
            facecolors=_lighter(KIND_COLORS.get(kind, "#999999"), 0.45 if later_chunk else 0.0),
            edgecolors="white",
            linewidth=0.6,
        )
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels(list(stage_names) if stage_names else [f"stage {s}" for s in range(stages)])
    ax.set_xlim(0, span * 1.01 if span > 0 else 1)
    ax.set_xlabel(time_unit)
    ax.set_title(title or "Pipeline schedule", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    handles = [
        Patch(color=KIND_COLORS["F"], label="forward"),
        Patch(color=KIND_COLORS["B"], label="backward"),
    ]
    if any(t.chunk for t in tasks):
        handles.append(Patch(color=_lighter(KIND_COLORS["F"], 0.45), label="forward, chunk ≥ 1"))
        handles.append(Patch(color=_lighter(KIND_COLORS["B"], 0.45), label="backward, chunk ≥ 1"))
    handles.append(Patch(facecolor="white", edgecolor="#BBBBBB", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax


def _lighter(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` blended with white: ``amount`` 0 keeps it, 1 gives white."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1.0 - c) * amount for c in to_rgb(color))  # type: ignore[return-value]


def plot_schedule(result: ScheduleResult, *, ax: Any = None) -> Any:
    """Gantt chart of a simulated schedule, titled with its bubble and peak in-flight micro-batches."""
    title = (
        f"{SCHEDULES[result.schedule]}: p={result.p}, m={result.m}"
        + (f", v={result.v}" if result.schedule == "interleaved" else "")
        + f" — bubble {result.bubble_fraction:.0%} of the step ({result.bubble_ratio:.0%} of ideal),"
        f" peak in flight {max(result.peak_activations):g}"
    )
    return plot_gantt(
        result.tasks,
        ax=ax,
        title=title,
        time_unit=f"time (one forward pass of a stage = 1; backward = {result.backward / result.forward:g})",
        note="simulated: uniform stages, free communication",
        label_microbatches=result.m * result.v <= 32,
    )


class ScheduleSimulator:
    """Interactive schedule simulator: sliders for p, m, F:B cost ratio and chunks; a Gantt chart and numbers.

    Built from core ipywidgets only (IntSlider, FloatSlider, Dropdown, HTML, Image, boxes), so it works
    with ipywidgets 7.7 (Colab) and 8. The chart is a PNG in an ``Image`` widget. ``show()`` displays the
    panel together with a static PNG of the current configuration as a fallback: a live front end shows
    the sliders, a headless run (nbval, nbconvert, a notebook viewed on GitHub) shows the static figure.

    Args:
        schedule: initial schedule, one of :data:`SCHEDULES`.
        p, m, ratio, v: initial stages, micro-batches, backward:forward cost ratio, interleaved chunks.
    """

    def __init__(
        self, schedule: str = "1f1b", p: int = 4, m: int = 8, ratio: float = 2.0, v: int = 2
    ) -> None:
        import ipywidgets as w

        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, not {schedule!r}")
        style = {"description_width": "150px"}
        layout = w.Layout(width="460px")
        self.schedule = w.Dropdown(
            options=[(name, key) for key, name in SCHEDULES.items()],
            value=schedule,
            description="schedule",
            style=style,
            layout=layout,
        )
        self.p = w.IntSlider(value=p, min=1, max=8, description="stages p", style=style, layout=layout)
        self.m = w.IntSlider(
            value=m, min=1, max=32, description="micro-batches m", style=style, layout=layout
        )
        self.ratio = w.FloatSlider(
            value=ratio,
            min=0.5,
            max=4.0,
            step=0.5,
            description="backward : forward",
            style=style,
            layout=layout,
        )
        self.v = w.IntSlider(
            value=v, min=1, max=4, description="chunks v (interleaved)", style=style, layout=layout
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
            return
        r = self.result
        self.info.value = (
            f"<b>bubble</b> {r.bubble_fraction:.1%} of the step · {r.bubble_ratio:.1%} of the ideal time · "
            f"<b>peak in flight</b> {max(r.peak_activations):g} micro-batches' activations (stage 0) · "
            f"step {r.makespan:g} vs ideal {r.ideal:g} <i>(simulated)</i>"
        )
        self.image.value = self.png()

    def png(self) -> bytes:
        """The current chart as PNG bytes."""
        import matplotlib.pyplot as plt

        from .plotting import figure_to_png

        if self.result is None:
            raise ValueError(self.error or "nothing simulated yet")
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
