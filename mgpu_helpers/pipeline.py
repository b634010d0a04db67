"""Pipeline stages as real processes: timed forward/backward passes, activations sent between stages.

Each stage of a split model runs in its own process (started with :func:`mgpu_helpers.launcher.launch`),
pinned to one thread (``torch.set_num_threads(1)``) so that two stages really run at the same time on two
CPU cores, and hands activations forward and gradients backward with ``dist.isend`` / ``dist.recv``
(gloo on CPUs; NCCL with a GPU per stage, where stage ``r`` runs on ``cuda:r``). Every forward and
backward of every micro-batch is timed on a clock shared by the stages, so a *measured* timeline can be
drawn as a Gantt chart and compared with the simulated one from :mod:`mgpu_helpers.schedules`.

The pieces, smallest first:

* :class:`StageRecorder` — ``with recorder.record("F", microbatch): ...`` notes start and end times;
* :func:`run_order` — runs one training step of one stage in a given order of actions (the orders of
  :func:`mgpu_helpers.schedules.stage_order`: GPipe, 1F1B), optionally under a
  :class:`~mgpu_helpers.memory.MemoryTracker` that measures the activations the stage holds;
* :func:`pipeline_worker` / :func:`run_pipeline` — a whole experiment (several schedules and
  micro-batch counts, repeated) in one launch; returns :class:`PipelineRun` objects with timelines;
* :func:`plot_timeline`, :func:`plot_sweep`, :func:`draw_alexnet_split` — the pictures.

Timings come from real processes and are labelled *measured*; on a shared machine they are noisy, so
compare numbers taken side by side in one run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .schedules import SCHEDULES, Action, StageTimes, Task, plot_gantt, stage_order

__all__ = [
    "PipelineRun",
    "PipelineSpec",
    "StageRecorder",
    "Timeline",
    "draw_alexnet_split",
    "make_batch",
    "make_stages",
    "pipeline_worker",
    "plot_activation_traces",
    "plot_sweep",
    "plot_timeline",
    "run_order",
    "run_pipeline",
    "stage_device",
]


def stage_device(rank: int) -> torch.device:
    """The device stage ``rank`` computes on: ``cuda:rank`` when the group uses NCCL, else the CPU."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", rank)
    return torch.device("cpu")


# ---------------------------------------------------------------------- recording
class StageRecorder:
    """Record the start and end of each forward / backward pass of one stage.

    Times are seconds since :meth:`start_clock`, which every stage calls right after a barrier, so the
    stages' timelines line up (to within the barrier's exit skew, well under a millisecond on one
    machine). On a GPU, the recorder synchronises the device around each pass so that the times cover
    the kernels, not just their launch.

    Example (inside a stage process)::

        rec = StageRecorder(stage=rank)
        rec.start_clock()
        with rec.record("F", 0):
            out = stage(x)
        rec.tasks  # [Task(stage=0, kind='F', microbatch=0, start=..., end=...)]
    """

    def __init__(self, stage: int, device: torch.device | str | None = None) -> None:
        self.stage = stage
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.tasks: list[Task] = []
        self._t0: float | None = None

    def start_clock(self, *, barrier: bool = True) -> None:
        """Wait for all stages (``dist.barrier()``, if a group exists), then start the clock at 0."""
        if barrier and dist.is_available() and dist.is_initialized():
            dist.barrier()
        self._sync()
        self._t0 = time.perf_counter()
        self.tasks = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def record(self, kind: str, microbatch: int, chunk: int = 0) -> Iterator[None]:
        """Time the block as pass ``kind`` ("F" or "B") of ``microbatch`` on this stage."""
        if kind not in ("F", "B"):
            raise ValueError(f"kind must be 'F' (forward) or 'B' (backward), not {kind!r}")
        if self._t0 is None:
            raise RuntimeError("call start_clock() first, on every stage, so that the timelines line up")
        self._sync()
        start, cpu = time.perf_counter() - self._t0, time.thread_time()
        yield
        self._sync()
        end, cpu = time.perf_counter() - self._t0, time.thread_time() - cpu
        self.tasks.append(Task(self.stage, kind, microbatch, start, end, chunk, cpu))


@dataclass
class Timeline(StageTimes):
    """The measured tasks of all stages in one training step."""

    tasks: list[Task]
    label: str = ""

    @classmethod
    def from_stages(cls, per_stage: Sequence[Sequence[Task]], label: str = "") -> Timeline:
        """Join the task lists returned by the stage processes."""
        return cls([t for tasks in per_stage for t in tasks], label)

    @property
    def stages(self) -> int:
        """Number of stages."""
        return 1 + max(t.stage for t in self.tasks)

    @property
    def start(self) -> float:
        """Start of the first task."""
        return min(t.start for t in self.tasks)

    @property
    def makespan(self) -> float:
        """From the first task's start to the last task's end, in seconds."""
        return max(t.end for t in self.tasks) - self.start

    def _stage_count(self) -> int:
        return self.stages

    def cpu_share(self, stage: int) -> float | None:
        """CPU time / wall time of ``stage``'s passes: about 1.0 when it had a core to itself, less when
        other programs took turns on it (CPU stages only; ``None`` when not recorded)."""
        mine = [t for t in self.tasks if t.stage == stage]
        if not mine or any(t.cpu is None for t in mine):
            return None
        return sum(t.cpu or 0.0 for t in mine) / sum(t.duration for t in mine)

    def mean_duration(self, kind: str) -> float:
        """Average duration of the "F" or "B" passes, in seconds."""
        durations = [t.duration for t in self.tasks if t.kind == kind]
        if not durations:
            raise ValueError(f"no {kind!r} tasks in this timeline")
        return sum(durations) / len(durations)

    def order(self, stage: int) -> list[tuple[str, int]]:
        """What ``stage`` did, in time order: ``[("F", 0), ("F", 1), ..., ("B", 0), ...]``."""
        return [(t.kind, t.microbatch) for t in sorted(self.tasks, key=lambda t: t.start) if t.stage == stage]


# ---------------------------------------------------------------------- model and data
def make_stages(
    p: int = 2,
    width: int = 256,
    layers_per_stage: int = 2,
    out_features: int = 8,
    seed: int = 0,
) -> list[nn.Sequential]:
    """A deterministic model split into ``p`` equal stages of ``layers_per_stage`` × (Linear + ReLU).

    The last stage ends with ``Linear(width, out_features)`` as the output layer (the lecture notes'
    ``fc`` on the second GPU). Every stage maps ``(batch, width)`` to ``(batch, width)`` except the last.
    The same ``seed`` gives the same weights in every process, so each stage process can build the
    whole list and keep its own part, and the unsplit model is ``nn.Sequential(*make_stages(...))``.
    """
    if p < 1 or layers_per_stage < 1:
        raise ValueError(
            f"need p >= 1 and layers_per_stage >= 1, got p={p}, layers_per_stage={layers_per_stage}"
        )
    gen = torch.Generator().manual_seed(seed)
    stages = []
    for s in range(p):
        layers: list[nn.Module] = []
        for _ in range(layers_per_stage):
            layers += [nn.Linear(width, width), nn.ReLU()]
        if s == p - 1:
            layers.append(nn.Linear(width, out_features))
        stage = nn.Sequential(*layers)
        with torch.no_grad():
            for param in stage.parameters():
                bound = 1.0 / param.shape[-1] ** 0.5
                param.uniform_(-bound, bound, generator=gen)
        stages.append(stage)
    return stages


def make_batch(
    batch: int, width: int = 256, out_features: int = 8, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random regression batch ``(x, y)`` of shapes ``(batch, width)`` and ``(batch, out_features)``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=gen), torch.randn(batch, out_features, generator=gen)


# ---------------------------------------------------------------------- one stage, one step
@dataclass
class StageStep:
    """What one stage did in one step: its tasks, the losses (last stage), activations held."""

    tasks: list[Task]
    losses: list[float]
    peak_in_flight: int
    activation_trace: list[tuple[str, int]] = field(default_factory=list)
    peak_activation_bytes: int | None = None

    @property
    def peak_held_bytes(self) -> int | None:
        """Most activation bytes held between two passes (the trace's maximum), when tracked."""
        return max((b for _, b in self.activation_trace), default=None)


def run_order(
    module: nn.Module,
    order: Sequence[Action],
    rank: int,
    world_size: int,
    xs: Sequence[torch.Tensor],
    ys: Sequence[torch.Tensor],
    *,
    recorder: StageRecorder | None = None,
    tracker: Any = None,
    loss_fn: Any = nn.functional.mse_loss,
) -> StageStep:
    """Run one training step of stage ``rank`` (of ``world_size``) in the given order of actions.

    ``order`` is a list of ``("F" | "B", microbatch, chunk)`` as from :func:`stage_order` (chunk must be 0:
    one model piece per process). ``xs`` are the micro-batch inputs (used by the first stage), ``ys`` the
    targets (used by the last); the other stages read only the row counts of ``xs``, to size the
    activation they receive. A forward receives its input from stage ``rank - 1`` (blocking
    ``dist.recv``), runs, and sends its output to ``rank + 1`` without waiting (``dist.isend``); a backward
    receives the output gradient from ``rank + 1``, runs, and sends the input gradient to ``rank - 1``.
    The last stage's loss for each micro-batch is divided by the number of micro-batches, so gradients
    add up to those of the mean loss over the whole batch.

    With a ``tracker`` (a :class:`~mgpu_helpers.memory.MemoryTracker` of ``module``), the step runs under
    it and a mark is set after each action (labelled ``"F3"``, ``"B0"``, …) and once more at the end
    (``"end"``, after the last sends are done), so the activations held over time can be read back.
    """
    first, last = rank == 0, rank == world_size - 1
    m = len(xs)
    device = next(module.parameters()).device
    in_features = next(mod for mod in module.modules() if isinstance(mod, nn.Linear)).in_features
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    pending_fwd: dict[int, Any] = {}
    pending_grad: list[tuple[Any, torch.Tensor]] = []  # at most one in flight, for a deterministic memory log
    losses: list[float] = []
    held, peak = 0, 0
    trace: list[tuple[str, int]] = []
    timing = recorder.record if recorder is not None else _no_record
    with tracker if tracker is not None else contextlib.nullcontext():
        for kind, mb, chunk in order:
            if chunk:
                raise ValueError("run_order runs one model piece per process: chunk must be 0")
            if kind == "F":
                if first:
                    inp = xs[mb].to(device)
                else:
                    inp = torch.empty(xs[mb].shape[0], in_features, device=device)
                    dist.recv(inp, src=rank - 1)
                    inp.requires_grad_()
                with timing("F", mb):
                    out = module(inp)
                    if last:
                        out = loss_fn(out, ys[mb].to(device)) / m
                inputs[mb], outputs[mb] = inp, out
                held += 1
                peak = max(peak, held)
                if last:
                    losses.append(float(out.detach()) * m)
                else:
                    pending_fwd[mb] = dist.isend(out.detach(), dst=rank + 1)
            else:
                out = outputs.pop(mb)
                if last:
                    grad = None
                else:
                    pending_fwd.pop(mb).wait()  # long done: the next stage used it for this backward
                    grad = torch.empty_like(out)
                    dist.recv(grad, src=rank + 1)
                _drain(pending_grad)
                with timing("B", mb):
                    out.backward(grad)
                del out, grad
                inp = inputs.pop(mb)
                if not first:
                    pending_grad.append((dist.isend(inp.grad, dst=rank - 1), inp.grad))
                del inp
                held -= 1
            if tracker is not None:
                trace.append((f"{kind}{mb}", tracker.mark(f"{kind}{mb}").bytes["other"]))
        _drain(pending_grad)
        if tracker is not None:
            trace.append(("end", tracker.mark("end").bytes["other"]))
    return StageStep(
        tasks=list(recorder.tasks) if recorder is not None else [],
        losses=losses,
        peak_in_flight=peak,
        activation_trace=trace,
        peak_activation_bytes=tracker.peak["other"] if tracker is not None else None,
    )


def _drain(pending: list[tuple[Any, torch.Tensor]]) -> None:
    """Wait for pending sends and drop every reference to them (loop variables would keep one alive)."""
    while pending:
        pending.pop()[0].wait()


@contextlib.contextmanager
def _no_record(kind: str, microbatch: int) -> Iterator[None]:
    yield


# ---------------------------------------------------------------------- a whole experiment
@dataclass
class PipelineSpec:
    """What :func:`pipeline_worker` runs: a model, a batch, and a list of (schedule, m) to time.

    ``schedule`` is ``"gpipe"`` or ``"1f1b"`` (``"naive"`` is GPipe with ``m = 1``). Each run is
    repeated ``repeats`` times (after ``warmup`` untimed steps) and the fastest step is kept; runs are
    interleaved round-robin so that a change in machine load affects them alike.
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


@dataclass
class PipelineRun:
    """One (schedule, m) of an experiment, merged over the stages."""

    schedule: str
    m: int
    timeline: Timeline
    makespans: list[float]
    losses: list[float]
    peak_in_flight: list[int]
    peak_activation_bytes: list[int | None]
    activation_traces: list[list[tuple[str, int]]]
    grads: dict[str, torch.Tensor] | None = None

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

    Returns, per run, this stage's fastest timed step (tasks, losses, peak in-flight micro-batches,
    activation bytes when tracked, and parameter gradients when asked).
    """
    torch.set_num_threads(spec.threads)  # one core per stage: the stages really run side by side
    device = stage_device(rank)
    module = make_stages(world_size, spec.width, spec.layers_per_stage, spec.out_features, spec.seed)[rank]
    module = module.to(device)
    x, y = make_batch(spec.batch, spec.width, spec.out_features, spec.seed + 1)
    best: dict[int, tuple[float, StageStep, dict[str, torch.Tensor] | None]] = {}
    recorder = StageRecorder(rank, device)
    for rep in range(spec.warmup + spec.repeats):
        for i, (schedule, m) in enumerate(spec.runs):
            order = stage_order("gpipe" if schedule == "naive" else schedule, rank, world_size, m)
            xs, ys = list(x.chunk(m)), list(y.chunk(m))
            tracker = None
            if spec.track_memory:
                from .memory import MemoryTracker

                tracker = MemoryTracker(module)
            module.zero_grad(set_to_none=True)
            recorder.start_clock()
            step = run_order(module, order, rank, world_size, xs, ys, recorder=recorder, tracker=tracker)
            if tracker is not None:
                tracker.close()
            # every stage must agree on which repetition was fastest: take the slowest stage's end
            end = torch.tensor([max(t.end for t in step.tasks)], device=device)  # NCCL needs it on the GPU
            dist.all_reduce(end, op=dist.ReduceOp.MAX)
            if rep < spec.warmup:
                continue
            if i not in best or end.item() < best[i][0]:
                grads = None
                if spec.return_grads:
                    grads = {
                        f"{rank}.{n}": p.grad.detach().cpu().clone() for n, p in module.named_parameters()
                    }
                best[i] = (end.item(), step, grads)
    return [{"makespan": best[i][0], "step": best[i][1], "grads": best[i][2]} for i in range(len(spec.runs))]


def run_pipeline(spec: PipelineSpec, stages: int = 2, *, timeout_s: float = 300.0) -> list[PipelineRun]:
    """Run ``spec`` on ``stages`` real processes (one stage each) and merge what they measured.

    Uses :func:`mgpu_helpers.launcher.launch`: gloo on CPUs, NCCL when there is a GPU per stage; every
    process is gone when this returns or raises.
    """
    from .launcher import launch

    for schedule, m in spec.runs:
        if schedule not in ("naive", *SCHEDULES) or schedule == "interleaved":
            raise ValueError(f"schedule must be 'naive', 'gpipe' or '1f1b' for real stages, not {schedule!r}")
        if schedule == "naive" and m != 1:
            raise ValueError(
                "'naive' means the whole batch at once: use m=1 (or 'gpipe' with m micro-batches)"
            )
        if m < 1 or spec.batch % m:
            raise ValueError(f"m={m} must divide the batch of {spec.batch} into equal micro-batches")
    if spec.track_memory:
        # The tracker's first use imports torch._dynamo (seconds). Import it here once: forked stage
        # processes inherit it instead of each paying for it.
        import torch._dynamo  # noqa: F401
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
        label = "naive split" if schedule == "naive" else f"{SCHEDULES[schedule]}, m={m}"
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


# ---------------------------------------------------------------------- pictures
def plot_timeline(
    timeline: Timeline | Sequence[Task],
    *,
    ax: Any = None,
    title: str | None = None,
    note: str | None = None,
    stage_names: Sequence[str] | None = None,
) -> Any:
    """Gantt chart of a measured timeline in milliseconds; idle stages show as white space.

    ``note`` should say where it was measured (e.g. ``"measured on " + hardware_label()``).
    """
    tl = timeline if isinstance(timeline, Timeline) else Timeline(list(timeline))
    if title is None:
        idle = ", ".join(f"stage {s} idle {tl.idle_fraction(s):.0%}" for s in range(tl.stages))
        title = f"{tl.label or 'measured step'}: {tl.makespan * 1e3:.0f} ms — {idle}"
    return plot_gantt(
        tl.tasks, ax=ax, title=title, time_unit="ms", scale=1e3, note=note, stage_names=stage_names
    )


def plot_sweep(
    ms: Sequence[int],
    speedups: Sequence[float],
    bubbles: Sequence[float],
    p: int,
    *,
    note: str | None = None,
) -> Any:
    """Two panels: measured speed-up vs ``m·p/(m+p-1)``, measured idle share vs ``(p-1)/(m+p-1)``."""
    import matplotlib.pyplot as plt

    from .schedules import gpipe_bubble, pipeline_speedup

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    fine = [1 + i * (max(ms) - 1) / 100 for i in range(101)]
    a.plot(fine, [f * p / (f + p - 1) for f in fine], color="#999999", label="theory m·p/(m+p−1)")
    a.plot(ms, [pipeline_speedup(p, m) for m in ms], "o", color="#999999")
    a.plot(ms, speedups, "o-", color="#4C72B0", label="measured")
    a.axhline(p, ls=":", color="black", lw=0.8)
    a.text(ms[0], p, f" limit p = {p}", va="bottom", fontsize=8)
    a.set(
        xlabel="micro-batches m",
        ylabel="speed-up over naive split",
        title="Speed-up",
        xscale="log",
        ylim=(0, p * 1.1),
    )
    a.minorticks_off()
    a.set_xticks(list(ms), [str(m) for m in ms])
    a.legend(fontsize=8)
    b.plot(fine, [(p - 1) / (f + p - 1) for f in fine], color="#999999", label="theory (p−1)/(m+p−1)")
    b.plot(ms, [gpipe_bubble(p, m) for m in ms], "o", color="#999999")
    b.plot(ms, bubbles, "o-", color="#DD8452", label="measured idle share")
    b.set(
        xlabel="micro-batches m",
        ylabel="bubble: idle share of the step",
        title="Bubble",
        xscale="log",
        ylim=(0, 1),
    )
    b.minorticks_off()
    b.set_xticks(list(ms), [str(m) for m in ms])
    b.legend(fontsize=8)
    if note:
        fig.suptitle(note, fontsize=8, style="italic")
    fig.tight_layout()
    return fig


def plot_activation_traces(runs: Sequence[PipelineRun], *, unit: str = "MiB", note: str | None = None) -> Any:
    """One panel per stage: activation bytes held after each pass, one line per run (e.g. GPipe vs 1F1B).

    Needs runs made with ``track_memory=True``.
    """
    import matplotlib.pyplot as plt

    scale = {"KiB": 1024, "MiB": 1024**2}[unit]
    stages = len(runs[0].activation_traces)
    if not runs[0].activation_traces[0]:
        raise ValueError("these runs have no memory traces: run them with PipelineSpec(track_memory=True)")
    fig, axes = plt.subplots(1, stages, figsize=(5 * stages, 3.2), sharey=True, squeeze=False)
    for s, ax in enumerate(axes[0]):
        for run, color in zip(runs, ("#C44E52", "#4C72B0", "#55A868", "#8172B3"), strict=False):
            trace = [(label, b) for label, b in run.activation_traces[s] if label != "end"]
            ax.step(
                range(len(trace) + 1),
                [0.0] + [b / scale for _, b in trace],
                where="post",
                color=color,
                label=f"{run.timeline.label}: holds at most {run.peak_in_flight[s]} micro-batch(es)",
            )
        ax.set(title=f"stage {s}", xlabel="passes done on this stage (F and B)")
        ax.legend(fontsize=8, loc="upper right")
    axes[0][0].set_ylabel(f"activations held ({unit})")
    fig.suptitle(note or "Activations held between passes", fontsize=9)
    fig.tight_layout()
    return fig


def draw_alexnet_split(ax: Any = None) -> Any:
    """AlexNet (2012) as trained on two GPUs: each GPU holds half of every layer's kernels.

    Most layers only see the half on their own GPU; the two halves exchange activations only where
    arrows cross: into conv3 (from both halves of conv2) and into each fully connected layer.
    Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.4))
    layers = ["input", "C1", "C2", "C3", "C4", "C5", "FC6", "FC7", "FC8"]
    cross_into = {"C3", "FC6", "FC7", "FC8"}  # layers that read both GPUs' halves
    xs = {name: i * 1.25 for i, name in enumerate(layers)}
    rows = {0: 1.6, 1: 0.3}
    colors = {0: "#76B900", 1: "#4C9A2A"}
    w, h = 0.8, 0.6
    for gpu, y in rows.items():
        ax.text(-0.6, y + h / 2, f"GPU {gpu}", ha="right", va="center", fontsize=10, weight="bold")
        for name in layers[1:]:
            ax.add_patch(
                FancyBboxPatch((xs[name], y), w, h, boxstyle="round,pad=0.03", fc=colors[gpu], ec="none")
            )
            ax.text(
                xs[name] + w / 2,
                y + h / 2,
                name,
                ha="center",
                va="center",
                color="white",
                fontsize=9,
                weight="bold",
            )
    ax.add_patch(
        FancyBboxPatch((xs["input"], 0.55), w, 1.1, boxstyle="round,pad=0.03", fc="#9DB4D8", ec="none")
    )
    ax.text(xs["input"] + w / 2, 1.1, "image", ha="center", va="center", fontsize=9)

    def arrow(x0: float, y0: float, x1: float, y1: float, color: str, lw: float = 1.2) -> None:
        ax.add_patch(
            FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=9, color=color, lw=lw)
        )

    for y in rows.values():
        arrow(xs["input"] + w, 1.1, xs["C1"], y + h / 2, "#555555")
    for prev, name in zip(layers[1:-1], layers[2:], strict=True):
        for gpu, y in rows.items():
            arrow(xs[prev] + w, y + h / 2, xs[name], y + h / 2, "#555555")
            if name in cross_into:
                other = rows[1 - gpu]
                arrow(xs[prev] + w, y + h / 2, xs[name], other + h / 2, "#B22222", 1.6)
    mid = (xs["C2"] + w + xs["C3"]) / 2
    ax.annotate(
        "halves exchange activations\n(C2 → C3 and into every FC layer)",
        (mid, 1.25),
        xytext=(mid + 0.9, 2.55),
        fontsize=8,
        color="#B22222",
        ha="left",
        arrowprops={"arrowstyle": "-", "color": "#B22222", "lw": 0.8},
    )
    ax.set_xlim(-1.6, xs["FC8"] + 1.2)
    ax.set_ylim(0.0, 2.9)
    ax.axis("off")
    ax.set_title("AlexNet split over two GPUs (Krizhevsky et al., 2012) — drawn, not measured", fontsize=10)
    return ax
