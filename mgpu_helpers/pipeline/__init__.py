"""Used by notebooks 02a (model parallel by hand) and 02b (torch.distributed.pipelining), their graders,
and ``benchmarks/pipeline.py``. Pipeline parallelism: schedules simulated, stages run as real processes,
timelines measured and drawn.

* :mod:`.schedules` — the simulator (pure Python): :func:`stage_order`, :func:`simulate`,
  :class:`ScheduleResult`, :class:`Task`, :class:`StageTimes`, and the bubble formulas
  :func:`gpipe_bubble`, :func:`bubble_relative_to_ideal`, :func:`pipeline_speedup`
* :mod:`.orders` — any hand-written per-stage orders: :func:`simulate_orders`, :func:`peaks_in_flight`
* :mod:`.schedule_plots` — Gantt charts: :func:`plot_gantt`, :func:`plot_schedule`
* :mod:`.simulator_widget` — :class:`ScheduleSimulator` (core ipywidgets; a static PNG when headless)
* :mod:`.stages` — one stage in a process: :func:`stage_device`, :class:`StageRecorder`,
  :class:`Timeline`, :func:`make_stages`, :func:`make_batch`, :func:`run_order`
* :mod:`.fairness` — :func:`judge_fairness`: is a timed comparison of two schedules fair to assert on?
* :mod:`.runner` — a whole experiment on N stage processes: :class:`PipelineSpec`, :func:`run_pipeline`
* :mod:`.plots` — :func:`plot_timeline`, :func:`plot_sweep`, :func:`plot_activation_traces`,
  :func:`draw_alexnet_split`

matplotlib and ipywidgets are imported only when something is drawn or a widget is made.
"""

from .fairness import Fairness, judge_fairness, waiting_share
from .orders import peaks_in_flight, simulate_orders
from .plots import draw_alexnet_split, plot_activation_traces, plot_sweep, plot_timeline
from .runner import PipelineRun, PipelineSpec, pipeline_worker, run_pipeline
from .schedule_plots import plot_gantt, plot_schedule
from .schedules import (
    SCHEDULES,
    Action,
    ScheduleResult,
    StageTimes,
    Task,
    bubble_relative_to_ideal,
    gpipe_bubble,
    pipeline_speedup,
    simulate,
    stage_order,
)
from .simulator_widget import ScheduleSimulator
from .stages import StageRecorder, StageStep, Timeline, make_batch, make_stages, run_order, stage_device

__all__ = [
    "SCHEDULES",
    "Action",
    "Fairness",
    "PipelineRun",
    "PipelineSpec",
    "ScheduleResult",
    "ScheduleSimulator",
    "StageRecorder",
    "StageStep",
    "StageTimes",
    "Task",
    "Timeline",
    "bubble_relative_to_ideal",
    "draw_alexnet_split",
    "gpipe_bubble",
    "judge_fairness",
    "make_batch",
    "make_stages",
    "peaks_in_flight",
    "pipeline_speedup",
    "pipeline_worker",
    "plot_activation_traces",
    "plot_gantt",
    "plot_schedule",
    "plot_sweep",
    "plot_timeline",
    "run_order",
    "run_pipeline",
    "simulate",
    "simulate_orders",
    "stage_device",
    "stage_order",
    "waiting_share",
]
