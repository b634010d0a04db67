"""Used by notebook 02b (``stage_order`` in §1, the simulator of §3, the 1F1B exercise's grader), by
:mod:`.runner` and ``benchmarks/pipeline.py`` (02a writes its orders and bubble formula in cells).
Pipeline schedules, simulated: GPipe, 1F1B and interleaved 1F1B on ``p`` stages with ``m``
micro-batches (any per-stage orders: :mod:`.orders`).

Pure Python (drawing lives in :mod:`.schedule_plots`). The simulator answers the questions a pipeline
schedule is judged by — how long is a step, how much of it is *bubble* (idle time), and how many
micro-batches' activations must a stage hold at once — without any hardware::

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
processes in :mod:`.stages`.

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

from .._checks import choice, real, whole

__all__ = [
    "SCHEDULES",
    "Action",
    "ScheduleResult",
    "StageTimes",
    "Task",
    "bubble_relative_to_ideal",
    "gpipe_bubble",
    "pipeline_speedup",
    "simulate",
    "stage_order",
]

#: Schedules the simulator knows, with their display names.
SCHEDULES: dict[str, str] = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}

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

    def __post_init__(self) -> None:
        whole("stage (0-based stage index)", self.stage, 0)
        if self.kind not in ("F", "B"):
            raise ValueError(f"kind must be 'F' (forward) or 'B' (backward), not {self.kind!r}")
        whole("microbatch (0-based index)", self.microbatch, 0)
        whole("chunk (0-based model chunk index)", self.chunk, 0)
        start = real("start", self.start, 0)
        end = real("end", self.end, 0)
        if end < start:
            raise ValueError(f"a task must end after it starts: start={start}, end={end}")
        if self.cpu is not None:
            real("cpu (CPU seconds, or None)", self.cpu, 0)

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
    whole("v (model chunks per device)", v, 1)
    return (p - 1) / (v * m)


def pipeline_speedup(p: int, m: int) -> float:
    """Speed-up of GPipe with ``m`` micro-batches over the naive split (``m = 1``): ``m·p / (m + p - 1)``."""
    _check_pm(p, m)
    return m * p / (m + p - 1)


def _check_pm(p: int, m: int) -> None:
    whole("p (pipeline stages)", p, 1)
    whole("m (micro-batches per step)", m, 1)


def _check_schedule(schedule: str, p: int, m: int, v: int) -> None:
    choice("schedule", schedule, SCHEDULES)
    _check_pm(p, m)
    whole("v (model chunks per device)", v, 1)
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"v (chunks per device) applies to 'interleaved' only; {schedule!r} needs v=1")
    if schedule == "interleaved" and m % p:
        raise ValueError(
            f"interleaved 1F1B sends micro-batches through in groups of p, so m must be a multiple of "
            f"p (Megatron-LM's rule): got p={p}, m={m}. Try m={m + p - m % p}."
        )


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
    _check_schedule(schedule, p, m, v)
    whole("stage (0-based stage index)", stage, 0)
    if stage >= p:
        raise ValueError(f"stage must be in 0..{p - 1} (p={p} stages), not {stage}")
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b":
        return _one_f_one_b([("F", i, 0) for i in range(m)], [("B", i, 0) for i in range(m)], p - stage - 1)

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

    def _check_stage(self, stage: int) -> int:
        whole("stage (0-based stage index)", stage, 0)
        if stage >= self._stage_count():
            raise ValueError(f"stage must be in 0..{self._stage_count() - 1}, not {stage}")
        return stage

    def busy(self, stage: int) -> float:
        """Time ``stage`` spends computing."""
        self._check_stage(stage)
        return sum(t.duration for t in self.tasks if t.stage == stage)

    def idle_fraction(self, stage: int) -> float:
        """Share of the step during which ``stage`` is idle."""
        busy, span = self.busy(stage), self.makespan
        if span <= 0:
            raise ValueError("the step has zero length: record tasks that take time to get idle shares")
        return 1.0 - busy / span

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over stages (``(p-1)/(m+p-1)`` for GPipe and 1F1B)."""
        n = self._stage_count()
        return sum(self.idle_fraction(s) for s in range(n)) / n


@dataclass
class ScheduleResult(StageTimes):
    """A simulated schedule (made by :func:`simulate`): every task's times, and what they add up to."""

    schedule: str
    p: int
    m: int
    v: int
    forward: float
    backward: float
    tasks: list[Task] = field(repr=False)

    def __post_init__(self) -> None:
        _check_schedule(self.schedule, self.p, self.m, self.v)
        if not self.tasks or not all(isinstance(t, Task) for t in self.tasks):
            raise ValueError("tasks must be a non-empty list of Task; make results with simulate(...)")

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
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"`` (the keys of :data:`SCHEDULES`).
        p: pipeline stages (devices), at least 1.
        m: micro-batches per step, at least 1 (a multiple of ``p`` for ``"interleaved"``).
        forward: time of one micro-batch's forward pass through one whole stage (> 0).
        backward: same for the backward pass (about twice the forward in practice).
        v: model chunks per device (interleaved only; each chunk costs ``1/v`` of a stage).
        comm: time to hand an activation or gradient to the next device (>= 0).

    Returns:
        A :class:`ScheduleResult`.
    """
    _check_schedule(schedule, p, m, v)
    forward = real("forward (cost of one forward pass)", forward, 0, open_low=True)
    backward = real("backward (cost of one backward pass)", backward, 0, open_low=True)
    comm = real("comm (time to hand data to the next stage)", comm, 0)
    orders = [stage_order(schedule, s, p, m, v) for s in range(p)]
    tasks = _run(orders, v, forward, backward, comm, schedule)
    return ScheduleResult(schedule, p, m, v, forward, backward, tasks)


def _run(
    orders: Sequence[Sequence[Action]], v: int, forward: float, backward: float, comm: float, name: str
) -> list[Task]:
    """Run per-device orders on idealised devices: each action as early as its input allows."""
    p = len(orders)
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
            raise RuntimeError(f"schedule {name!r} deadlocks: every stage waits; next actions {waiting}")
    return tasks
