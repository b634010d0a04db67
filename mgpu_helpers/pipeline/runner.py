"""Used by ``benchmarks/pipeline.py`` (the longer version of notebook 02a §4's measurement; the notebooks
write their stage loops in cells). A whole pipeline experiment — several schedules and micro-batch
counts, repeated — on real stage processes in one launch.

:func:`run_pipeline` starts one process per stage (:func:`mgpu_helpers.launching.launch`: gloo on CPUs,
NCCL when every stage has a GPU); each runs :func:`pipeline_worker`, which times every (schedule, m) of
a :class:`PipelineSpec` with :func:`~mgpu_helpers.pipeline.run_order`. The stages' results come back
merged into :class:`PipelineRun` objects with measured timelines. Timings from real processes are noisy
on a shared machine: compare numbers taken side by side in one run (runs are interleaved round-robin).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .._checks import choice, real, whole
from .schedules import SCHEDULES, stage_order
from .stages import StageRecorder, StageStep, Timeline, make_batch, make_stages, run_order, stage_device

__all__ = ["PipelineRun", "PipelineSpec", "pipeline_worker", "run_pipeline"]

#: Schedules real stages can run (one model piece per process: no interleaving). "sequential" runs the
#: same micro-batches as GPipe one at a time through all stages (F then B of micro-batch 0, then of 1, …):
#: the like-with-like baseline for GPipe's speed-up.
_RUNNABLE = ("naive", "sequential", "gpipe", "1f1b")


@dataclass
class PipelineSpec:
    """What :func:`pipeline_worker` runs: a model, a batch, and a list of (schedule, m) to time.

    ``schedule`` is ``"gpipe"``, ``"1f1b"`` or ``"sequential"`` (the same ``m`` micro-batches one at a
    time, no overlap); ``"naive"`` is GPipe with ``m = 1``. Every ``m`` must
    split ``batch`` into equal micro-batches. Each run is repeated ``repeats`` times (after ``warmup``
    untimed steps) and the median step is kept; runs are interleaved round-robin so that a change in
    machine load affects them alike.
    """

    runs: list[tuple[str, int]]
    width: int = 256
    layers_per_stage: int = 2
    batch: int = 256
    out_features: int = 8
    repeats: int = 3
    warmup: int = 1
    track_memory: bool = False
    return_grads: bool = False
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        for name, what in (
            ("width", "features per layer"),
            ("layers_per_stage", "Linear+ReLU layers per stage"),
            ("batch", "rows per step"),
            ("out_features", "outputs of the last layer"),
            ("repeats", "timed steps per run"),
            ("threads", "torch threads per stage process"),
        ):
            whole(f"{name} ({what})", getattr(self, name), 1)
        whole("warmup (untimed steps first)", self.warmup, 0)
        whole("seed", self.seed, 0)
        for name in ("track_memory", "return_grads"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, not {getattr(self, name)!r}")
        if isinstance(self.runs, (str, bytes)) or not isinstance(self.runs, (list, tuple)) or not self.runs:
            raise ValueError(
                f"runs must be a non-empty list of (schedule, m), e.g. [('naive', 1), ('gpipe', 8)], "
                f"not {self.runs!r}"
            )
        runs = []
        for run in self.runs:
            if not isinstance(run, (tuple, list)) or len(run) != 2:
                raise TypeError(f"each run must be a pair (schedule, m) such as ('gpipe', 8), not {run!r}")
            schedule, m = run
            choice("schedule (real stages run one model piece each)", schedule, _RUNNABLE)
            whole("m (micro-batches per step)", m, 1)
            if schedule == "naive" and m != 1:
                raise ValueError(
                    "'naive' means the whole batch at once: use m=1 (or 'gpipe' with m micro-batches)"
                )
            if self.batch % m:
                raise ValueError(
                    f"m={m} must divide the batch of {self.batch} into equal micro-batches; "
                    f"pick m among the divisors of {self.batch} or change batch"
                )
            runs.append((schedule, m))
        self.runs = runs


@dataclass
class PipelineRun:
    """One (schedule, m) of an experiment, merged over the stages (made by :func:`run_pipeline`)."""

    schedule: str
    m: int
    timeline: Timeline
    makespans: list[float]
    losses: list[float]
    peak_in_flight: list[int]
    peak_activation_bytes: list[int | None]
    activation_traces: list[list[tuple[str, int]]]
    grads: dict[str, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        choice("schedule", self.schedule, _RUNNABLE)
        whole("m (micro-batches per step)", self.m, 1)
        if not isinstance(self.timeline, Timeline):
            raise TypeError(f"timeline must be a Timeline, not {type(self.timeline).__name__}")
        if not self.losses:
            raise ValueError("losses must hold the last stage's loss per micro-batch (non-empty)")

    @property
    def peak_held_bytes(self) -> list[int | None]:
        """Per stage: most activation bytes held between two passes (measured when tracking memory)."""
        return [max((b for _, b in trace), default=None) for trace in self.activation_traces]

    @property
    def loss(self) -> float:
        """Mean loss over the micro-batches (= the loss of the whole batch)."""
        return sum(self.losses) / len(self.losses)


def pipeline_worker(rank: int, world_size: int, spec: PipelineSpec) -> list[dict[str, Any]]:
    """Stage process body for :func:`run_pipeline`: build this rank's stage, run every (schedule, m).

    Returns, per run, this stage's median timed step (tasks, losses, peak in-flight micro-batches,
    activation bytes when tracked, and parameter gradients when asked).
    """
    if not isinstance(spec, PipelineSpec):
        raise TypeError(f"spec must be a PipelineSpec, not {type(spec).__name__}")
    torch.set_num_threads(spec.threads)  # one core per stage: the stages really run side by side
    device = stage_device(rank)
    module = make_stages(world_size, spec.width, spec.layers_per_stage, spec.out_features, spec.seed)[rank]
    module = module.to(device)
    x, y = make_batch(spec.batch, spec.width, spec.out_features, spec.seed + 1)
    timed: dict[int, list[tuple[float, StageStep, dict[str, torch.Tensor] | None]]] = {}
    recorder = StageRecorder(rank, device)
    for rep in range(spec.warmup + spec.repeats):
        for i, (schedule, m) in enumerate(spec.runs):
            if schedule == "sequential":
                order = [(kind, mb, 0) for mb in range(m) for kind in "FB"]
            else:
                order = stage_order("gpipe" if schedule == "naive" else schedule, rank, world_size, m)
            xs, ys = list(x.chunk(m)), list(y.chunk(m))
            tracker = None
            if spec.track_memory:
                from ..memory import MemoryTracker

                tracker = MemoryTracker(module)
            module.zero_grad(set_to_none=True)
            recorder.start_clock()
            step = run_order(module, order, rank, world_size, xs, ys, recorder=recorder, tracker=tracker)
            if tracker is not None:
                tracker.close()
            # every stage must agree on which repetition is the median: take the slowest stage's end
            end = torch.tensor([max(t.end for t in step.tasks)], device=device)  # NCCL needs it on the GPU
            dist.all_reduce(end, op=dist.ReduceOp.MAX)
            if rep < spec.warmup:
                continue
            grads = None
            if spec.return_grads:
                grads = {f"{rank}.{n}": p.grad.detach().cpu().clone() for n, p in module.named_parameters()}
            timed.setdefault(i, []).append((end.item(), step, grads))
    out = []
    for i in range(len(spec.runs)):
        # the same sort on every stage (ties broken by repetition), so all stages keep the same step
        ranked = sorted(range(len(timed[i])), key=lambda k: (timed[i][k][0], k))
        end, step, grads = timed[i][ranked[(len(ranked) - 1) // 2]]
        out.append({"makespan": end, "step": step, "grads": grads})
    return out


def run_pipeline(spec: PipelineSpec, stages: int = 2, *, timeout_s: float = 300.0) -> list[PipelineRun]:
    """Run ``spec`` on ``stages`` real processes (one stage each) and merge what they measured.

    Args:
        spec: what to run (:class:`PipelineSpec`).
        stages: number of stage processes, at least 2 (for one stage, call ``run_order`` directly).
        timeout_s: stop every process and raise if the experiment takes longer than this (> 0).

    Uses :func:`mgpu_helpers.launching.launch`: gloo on CPUs, NCCL when there is a GPU per stage; every
    process is gone when this returns or raises.
    """
    if not isinstance(spec, PipelineSpec):
        raise TypeError(f"spec must be a PipelineSpec(runs=[('gpipe', 8), ...]), not {type(spec).__name__}")
    whole("stages (stage processes; for a single stage call run_order directly)", stages, 2)
    real("timeout_s (seconds before the whole experiment is stopped)", timeout_s, 0, open_low=True)
    spec._validate()  # fields may have changed since it was made
    from ..launching import launch

    per_rank = launch(
        pipeline_worker, stages, args=(spec,), threads_per_process=spec.threads, timeout_s=timeout_s
    )
    runs = []
    for i, (schedule, m) in enumerate(spec.runs):
        steps = [per_rank[r][i]["step"] for r in range(stages)]
        grads = None
        if spec.return_grads:
            grads = {}
            for r in range(stages):
                grads.update(per_rank[r][i]["grads"])
        name = {"naive": "naive split", "sequential": "sequential"}.get(schedule, SCHEDULES.get(schedule))
        label = name if schedule == "naive" else f"{name}, m={m}"
        runs.append(
            PipelineRun(
                schedule=schedule,
                m=m,
                timeline=Timeline.from_stages([s.tasks for s in steps], label),
                makespans=[per_rank[r][i]["makespan"] for r in range(stages)],
                losses=steps[-1].losses,
                peak_in_flight=[s.peak_in_flight for s in steps],
                peak_activation_bytes=[s.peak_activation_bytes for s in steps],
                activation_traces=[s.activation_trace for s in steps],
                grads=grads,
            )
        )
    return runs
