"""Used by notebook 02a (§4, GPipe against the same micro-batches one at a time): is a timed comparison of
two schedules on real stage processes fair enough to assert the speed-up the prose states?

Two measured :class:`~mgpu_helpers.pipeline.Timeline` objects are judged on three signs of an unfair run on
a shared machine, each with a limit taken from the worst *fair* cases seen in 20–30 runs on a loaded 2-core
machine (issue 22's flake study): each stage's passes got most of a core (CPU time / wall time), the same
passes took as long under both schedules (load was steady), and little of a step was lost between a pass
being able to start and starting (messages, Python, a busy core).
"""

from __future__ import annotations

from dataclasses import dataclass

from .stages import Timeline

__all__ = ["Fairness", "judge_fairness", "waiting_share"]

#: Limits of a fair comparison (see the module docstring for where they come from).
MIN_CPU_SHARE = 0.85  # a stage with a core to itself gets 0.95-1.0
WORK_RANGE = (0.87, 1.15)  # a stage's busy time under the pipelined schedule / under the baseline
MAX_WAITING = 0.2  # about 0.1 when the machine is quiet


def waiting_share(timeline: Timeline) -> float:
    """Share of ``timeline``'s step lost between a pass being *able* to start and starting.

    A pass can start when its stage's previous pass is done and its input is there: stage ``s``'s forward
    of micro-batch ``i`` needs stage ``s − 1``'s forward of ``i``, its backward needs stage ``s + 1``'s
    backward of ``i`` (the first stage's forwards and the last stage's backward need only their stage)."""
    end = {(t.stage, t.kind, t.microbatch): t.end for t in timeline.tasks}
    last = timeline.stages - 1
    lost = 0.0
    for stage in range(timeline.stages):
        previous = timeline.start
        for task in sorted((t for t in timeline.tasks if t.stage == stage), key=lambda t: t.start):
            source = stage - 1 if task.kind == "F" else stage + 1
            ready = previous
            if 0 <= source <= last:
                ready = max(previous, end.get((source, task.kind, task.microbatch), previous))
            lost += max(0.0, task.start - ready)
            previous = task.end
    return lost / timeline.makespan


@dataclass(frozen=True)
class Fairness:
    """What :func:`judge_fairness` saw; ``fair`` is True when every sign stayed within its limit."""

    cpu_share: float  # least CPU time / wall time of any stage under either schedule
    work: tuple[float, float]  # least and most busy-time ratio (pipelined / baseline) of a stage
    waiting: float  # most waiting_share of either schedule
    fair: bool

    def __str__(self) -> str:
        return (
            f"least share of a core while computing {self.cpu_share:.0%}; passes pipelined "
            f"{self.work[0]:.2f}-{self.work[1]:.2f}× as long; waiting {self.waiting:.0%} of a step"
        )


def judge_fairness(baseline: Timeline, pipelined: Timeline) -> Fairness:
    """Judge a side-by-side measurement of ``baseline`` and ``pipelined`` (same stages, same passes).

    A stage without recorded CPU times (a GPU stage) counts as having had its core."""
    if baseline.stages != pipelined.stages:
        raise ValueError(
            f"the timelines have {baseline.stages} and {pipelined.stages} stages: compare two schedules "
            "of the same pipeline"
        )
    stages = range(baseline.stages)
    share = min(tl.cpu_share(s) or 1.0 for tl in (baseline, pipelined) for s in stages)
    ratios = [pipelined.busy(s) / baseline.busy(s) for s in stages]
    work = (min(ratios), max(ratios))
    waiting = max(waiting_share(baseline), waiting_share(pipelined))
    steady = WORK_RANGE[0] <= work[0] and work[1] <= WORK_RANGE[1]
    fair = share >= MIN_CPU_SHARE and steady and waiting <= MAX_WAITING
    return Fairness(share, work, waiting, fair)
