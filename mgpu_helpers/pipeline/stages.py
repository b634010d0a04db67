"""Used by notebooks 02a (``StageRecorder``, ``Timeline``, ``make_stages``, ``make_batch``,
``stage_device``: its stage loops are written in cells) and 02b (the split model and its data), by their
graders (``run_order`` runs 02b.1's hand-written orders) and by :mod:`.runner`. Pipeline stages as real
processes: the split model, its data, timed passes, and one training step of one stage in a given order.

Each stage of a split model runs in its own process (see :mod:`.runner`), pinned to one thread so that
two stages really run at the same time on two CPU cores, and hands activations forward and gradients
backward with ``dist.isend`` / ``dist.recv`` (gloo on CPUs; NCCL with a GPU per stage, where stage ``r``
runs on ``cuda:r``). Every forward and backward of every micro-batch is timed on a clock shared by the
stages, so a *measured* timeline can be drawn as a Gantt chart and compared with the simulated one.

* :class:`StageRecorder` — ``with recorder.record("F", microbatch): ...`` notes start and end times;
* :class:`Timeline` — the measured tasks of all stages, with busy / idle time per stage;
* :func:`make_stages`, :func:`make_batch` — a deterministic split model and a batch for it;
* :func:`run_order` — one training step of one stage in an order of actions from
  :func:`~mgpu_helpers.pipeline.stage_order` (GPipe, 1F1B), optionally under a memory tracker.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._checks import choice, whole
from .schedules import Action, StageTimes, Task

__all__ = [
    "StageRecorder",
    "StageStep",
    "Timeline",
    "make_batch",
    "make_stages",
    "run_order",
    "stage_device",
]


def stage_device(rank: int) -> torch.device:
    """The device stage ``rank`` computes on: ``cuda:rank`` when the group uses NCCL, else the CPU."""
    whole("rank (this stage's 0-based rank)", rank, 0)
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        if rank >= torch.cuda.device_count():
            raise ValueError(
                f"rank {rank} has no GPU of its own (this machine has {torch.cuda.device_count()}); "
                "run at most one NCCL stage per GPU, or use gloo on CPUs"
            )
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
        self.stage = whole("stage (this stage's 0-based index)", stage, 0)
        if device is not None and not isinstance(device, (str, torch.device)):
            raise TypeError(f"device must be a torch.device, a string like 'cpu' or None, not {device!r}")
        try:
            self.device = torch.device(device) if device is not None else torch.device("cpu")
        except RuntimeError as exc:
            raise ValueError(f"device must name a device such as 'cpu' or 'cuda:0', not {device!r}") from exc
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
        whole("microbatch (0-based index)", microbatch, 0)
        whole("chunk (0-based model chunk index)", chunk, 0)
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
    """The measured tasks of all stages in one training step (a non-empty list of :class:`Task`)."""

    tasks: list[Task]
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.tasks, (str, bytes)) or not isinstance(self.tasks, Sequence):
            raise TypeError(f"tasks must be a list of Task, not {type(self.tasks).__name__}")
        if not self.tasks:
            raise ValueError("a timeline needs at least one Task: record passes with StageRecorder")
        bad = next((t for t in self.tasks if not isinstance(t, Task)), None)
        if bad is not None:
            raise TypeError(f"tasks must contain Task objects only, found {type(bad).__name__}")
        if not isinstance(self.label, str):
            raise TypeError(f"label must be a string, not {type(self.label).__name__}")
        self.tasks = list(self.tasks)

    @classmethod
    def from_stages(cls, per_stage: Sequence[Sequence[Task]], label: str = "") -> Timeline:
        """Join the task lists returned by the stage processes (one list per stage)."""
        if isinstance(per_stage, (str, bytes)) or not isinstance(per_stage, Sequence):
            raise TypeError(f"per_stage must be a list of task lists, one per stage, not {per_stage!r}")
        if any(isinstance(tasks, Task) or not isinstance(tasks, Sequence) for tasks in per_stage):
            raise TypeError("per_stage must be a list of task lists (one list per stage), not a flat list")
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
        self._check_stage(stage)
        mine = [t for t in self.tasks if t.stage == stage]
        if not mine or any(t.cpu is None for t in mine):
            return None
        wall = sum(t.duration for t in mine)
        return sum(t.cpu or 0.0 for t in mine) / wall if wall > 0 else None

    def mean_duration(self, kind: str) -> float:
        """Average duration of the "F" or "B" passes, in seconds."""
        choice("kind", kind, ("F", "B"))
        durations = [t.duration for t in self.tasks if t.kind == kind]
        if not durations:
            raise ValueError(f"no {kind!r} tasks in this timeline")
        return sum(durations) / len(durations)

    def order(self, stage: int) -> list[tuple[str, int]]:
        """What ``stage`` did, in time order: ``[("F", 0), ("F", 1), ..., ("B", 0), ...]``."""
        self._check_stage(stage)
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
    whole("p (pipeline stages)", p, 1)
    whole("width (features of every hidden layer)", width, 1)
    whole("layers_per_stage (Linear+ReLU layers per stage)", layers_per_stage, 1)
    whole("out_features (outputs of the last layer)", out_features, 1)
    whole("seed", seed, 0)
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
    whole("batch (rows)", batch, 1)
    whole("width (input features)", width, 1)
    whole("out_features (target features)", out_features, 1)
    whole("seed", seed, 0)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=gen), torch.randn(batch, out_features, generator=gen)


# ---------------------------------------------------------------------- one stage, one step
@dataclass
class StageStep:
    """What one stage did in one step (returned by :func:`run_order`): tasks, losses, activations held."""

    tasks: list[Task]
    losses: list[float]
    peak_in_flight: int
    activation_trace: list[tuple[str, int]] = field(default_factory=list)
    peak_activation_bytes: int | None = None

    @property
    def peak_held_bytes(self) -> int | None:
        """Most activation bytes held between two passes (the trace's maximum), when tracked."""
        return max((b for _, b in self.activation_trace), default=None)


def _check_run_order(module, order, rank, world_size, xs, ys, recorder, tracker, loss_fn) -> None:
    """The checks of :func:`run_order`, before anything is sent or received."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be this stage's nn.Module (make_stages(...)[rank]), not {module!r}")
    if not any(isinstance(mod, nn.Linear) for mod in module.modules()):
        raise ValueError("module needs an nn.Linear: its first one sizes the activation the stage receives")
    whole("world_size (number of stages)", world_size, 1)
    whole("rank (this stage's 0-based rank)", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1} (world_size={world_size}), not {rank}")
    if world_size > 1 and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"world_size={world_size} needs a process group: run the stages with launch(...)")
    if world_size > 1 and dist.get_world_size() != world_size:
        raise ValueError(f"world_size={world_size}, but the process group has {dist.get_world_size()} ranks")
    for name, seq in (("xs", xs), ("ys", ys)):
        if not isinstance(seq, Sequence) or not seq or not all(isinstance(t, torch.Tensor) for t in seq):
            raise TypeError(f"{name} must be a non-empty list of tensors, one per micro-batch (x.chunk(m))")
    if len(ys) != len(xs):
        raise ValueError(f"xs and ys must hold the same number of micro-batches, got {len(xs)} and {len(ys)}")
    if recorder is not None and not isinstance(recorder, StageRecorder):
        raise TypeError(f"recorder must be a StageRecorder or None, not {type(recorder).__name__}")
    if tracker is not None and not hasattr(tracker, "mark"):
        raise TypeError(f"tracker must be a MemoryTracker of module, or None; not {type(tracker).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable like F.mse_loss(output, target), not {loss_fn!r}")
    if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
        raise TypeError(f"order must be a list of actions from stage_order(...), not {type(order).__name__}")
    forwarded: set[int] = set()
    backwarded: set[int] = set()
    for action in order:
        if not isinstance(action, tuple) or len(action) != 3:
            raise TypeError(f"each action must be a tuple (kind, microbatch, chunk), not {action!r}")
        kind, mb, chunk = action
        if kind not in ("F", "B"):
            raise ValueError(f"action kind must be 'F' or 'B', not {kind!r} in {action}")
        if isinstance(mb, bool) or not isinstance(mb, int) or not 0 <= mb < len(xs):
            raise ValueError(f"micro-batch {mb!r} in {action} is not in 0..{len(xs) - 1} ({len(xs)} given)")
        if chunk != 0:
            raise ValueError("run_order runs one model piece per process: chunk must be 0 (no 'interleaved')")
        done, needs = (forwarded, None) if kind == "F" else (backwarded, forwarded)
        if mb in done or (needs is not None and mb not in needs):
            raise ValueError(f"{action} repeats a pass or runs a backward before its forward")
        done.add(mb)


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
    loss_fn: Callable[..., torch.Tensor] = nn.functional.mse_loss,
) -> StageStep:
    """Run one training step of stage ``rank`` (of ``world_size``) in the given order of actions.

    ``order`` is a list of ``("F" | "B", microbatch, chunk)`` as from ``stage_order`` (chunk must be 0:
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
    _check_run_order(module, order, rank, world_size, xs, ys, recorder, tracker, loss_fn)
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
        for kind, mb, _ in order:
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
