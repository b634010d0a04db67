"""mgpu_helpers.pipeline stage processes: send/recv pipelines match the unsplit model; timelines, memory,
cleanup on failure; bad arguments are refused with advice."""

import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import psutil
import pytest
import torch
import torch.nn.functional as F

from mgpu_helpers.launching import LaunchError, launch
from mgpu_helpers.pipeline import (
    PipelineRun,
    PipelineSpec,
    StageRecorder,
    Task,
    Timeline,
    draw_alexnet_split,
    make_batch,
    make_stages,
    plot_activation_traces,
    plot_sweep,
    plot_timeline,
    run_order,
    run_pipeline,
    simulate,
    stage_device,
    stage_order,
)

WIDTH, BATCH = 32, 16


def reference(p: int, layers: int = 2, width: int = WIDTH, batch: int = BATCH):
    """Loss and gradients of the unsplit model, named like the stages' ("<stage>.<layer>.weight")."""
    model = torch.nn.Sequential(*make_stages(p, width, layers))
    x, y = make_batch(batch, width)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {name: param.grad for name, param in model.named_parameters()}


def test_recorder_times_passes_in_order():
    rec = StageRecorder(stage=1)
    with pytest.raises(RuntimeError, match="start_clock"), rec.record("F", 0):
        pass
    rec.start_clock()  # no process group: no barrier
    with rec.record("F", 0):
        time.sleep(0.01)
    with rec.record("B", 0, chunk=1):
        pass
    (f, b) = rec.tasks
    assert (f.stage, f.kind, f.microbatch, b.kind, b.chunk) == (1, "F", 0, "B", 1)
    assert f.duration >= 0.009 and 0 <= f.start <= f.end <= b.start <= b.end
    assert f.cpu is not None and 0 <= f.cpu < f.duration  # sleeping takes no CPU time
    with pytest.raises(ValueError, match="'F'"), rec.record("W", 0):
        pass


def test_timeline_arithmetic():
    tl = Timeline.from_stages(
        [
            [Task(0, "F", 0, 0.0, 1.0), Task(0, "B", 0, 3.0, 5.0)],
            [Task(1, "F", 0, 1.0, 2.0), Task(1, "B", 0, 2.0, 3.0)],
        ],
        "toy",
    )
    assert tl.stages == 2 and tl.makespan == 5.0
    assert tl.busy(0) == 3.0 and tl.idle_fraction(0) == pytest.approx(0.4) and tl.idle_fraction(1) == 0.6
    assert tl.bubble_fraction == pytest.approx(0.5)
    assert tl.mean_duration("B") == 1.5 and tl.order(0) == [("F", 0), ("B", 0)]
    with pytest.raises(ValueError, match="no 'F' tasks"):
        Timeline([Task(0, "B", 0, 0.0, 1.0)]).mean_duration("F")
    assert tl.cpu_share(0) is None  # not recorded
    shared = Timeline([Task(0, "F", 0, 0.0, 1.0, cpu=0.5), Task(0, "B", 0, 1.0, 3.0, cpu=2.0)])
    assert shared.cpu_share(0) == pytest.approx(2.5 / 3.0)


def test_fairness_judges_waiting_core_share_and_steady_work():
    """02a §4's guard: waiting counts only time a pass could have run; each sign has its limit."""
    from mgpu_helpers.pipeline.fairness import MAX_WAITING, judge_fairness, waiting_share

    def step(stage1_forward_start: float, cpu: float = 1.0) -> Timeline:
        s = stage1_forward_start  # stage 1 may start at 1.0 (stage 0's forward ends there)
        return Timeline(
            [
                Task(0, "F", 0, 0.0, 1.0, cpu=cpu),
                Task(1, "F", 0, s, s + 1.0, cpu=1.0),
                Task(1, "B", 0, s + 1.0, s + 2.0, cpu=1.0),
                Task(0, "B", 0, s + 2.0, s + 3.0, cpu=cpu),
            ]
        )

    assert waiting_share(step(1.0)) == 0.0  # each pass starts when it can: idle is not waiting
    assert waiting_share(step(1.5)) == pytest.approx(0.5 / 4.5)  # stage 1 started 0.5 late
    fair = judge_fairness(step(1.0), step(1.0))
    assert fair.fair and fair.work == (1.0, 1.0) and fair.cpu_share == 1.0
    assert "waiting 0% of a step" in str(fair)
    late = step(3.0)  # stage 1 waits 2.0 of a 6.0 step
    assert waiting_share(late) > MAX_WAITING
    assert not judge_fairness(step(1.0), late).fair
    assert not judge_fairness(step(1.0), step(1.0, cpu=0.5)).fair  # a stage got half a core
    twice = [Task(t.stage, t.kind, 0, 2 * t.start, 2 * t.end, cpu=2 * t.duration) for t in step(1.0).tasks]
    slow = Timeline(twice)  # every pass twice as long: load changed between the two measurements
    assert judge_fairness(step(1.0), slow).work == (2.0, 2.0) and not judge_fairness(step(1.0), slow).fair
    with pytest.raises(ValueError, match="same pipeline"):
        judge_fairness(step(1.0), Timeline([Task(0, "F", 0, 0.0, 1.0)]))


def test_make_stages_is_deterministic_and_splits_one_model():
    a, b = make_stages(3, 16, 2, out_features=4, seed=5), make_stages(3, 16, 2, out_features=4, seed=5)
    for sa, sb in zip(a, b, strict=True):
        for pa, pb in zip(sa.parameters(), sb.parameters(), strict=True):
            assert torch.equal(pa, pb)
    assert not torch.equal(a[0][0].weight, make_stages(3, 16, 2, seed=6)[0][0].weight)
    x = torch.randn(5, 16)
    assert a[0](x).shape == (5, 16) and a[2](a[1](a[0](x))).shape == (5, 4)


@pytest.mark.parametrize("schedule, m", [("gpipe", 1), ("gpipe", 4), ("1f1b", 4)])
def test_run_order_in_one_process_gives_full_batch_gradients(schedule, m):
    """World size 1: the single stage is first and last; micro-batching must not change the gradient."""
    (module,) = make_stages(1, WIDTH, 2)
    x, y = make_batch(BATCH, WIDTH)
    step = run_order(module, stage_order(schedule, 0, 1, m), 0, 1, list(x.chunk(m)), list(y.chunk(m)))
    (full,) = make_stages(1, WIDTH, 2)
    loss = F.mse_loss(full(x), y)
    loss.backward()
    assert sum(step.losses) / m == pytest.approx(loss.item(), abs=1e-6)
    for p, q in zip(module.parameters(), full.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
    assert step.peak_in_flight == (m if schedule == "gpipe" else 1)


def test_two_stage_processes_match_the_unsplit_model_and_follow_their_schedules():
    runs = run_pipeline(
        PipelineSpec(
            runs=[("naive", 1), ("sequential", 4), ("gpipe", 4), ("1f1b", 4)],
            width=WIDTH,
            batch=BATCH,
            repeats=3,
            return_grads=True,
        ),
        stages=2,
    )
    ref_loss, ref_grads = reference(2)
    for run in runs:
        assert run.loss == pytest.approx(ref_loss, abs=1e-6)
        assert run.grads.keys() == ref_grads.keys()
        assert all(torch.allclose(run.grads[k], ref_grads[k], atol=1e-6) for k in ref_grads)
        if run.schedule == "sequential":  # the same micro-batches, one at a time: F then B of each
            for s in range(2):
                assert run.timeline.order(s) == [(k, i) for i in range(run.m) for k in "FB"]
            assert run.peak_in_flight == [1, 1]
            assert len(run.timeline.tasks) == 2 * 2 * run.m
            continue
        schedule = "gpipe" if run.schedule == "naive" else run.schedule
        for s in range(2):
            assert run.timeline.order(s) == [(k, i) for k, i, _ in stage_order(schedule, s, 2, run.m)]
        assert run.peak_in_flight == simulate(schedule, 2, run.m).peak_in_flight
        assert len(run.timeline.tasks) == 2 * 2 * run.m and run.timeline.makespan > 0
    assert [r.timeline.label for r in runs] == ["naive split", "sequential, m=4", "GPipe, m=4", "1F1B, m=4"]
    # the median of 3 timed steps is kept: its makespan lies between the others' (all stages agree on it)
    assert all(len(set(round(x, 9) for x in r.makespans)) == 1 for r in runs)


def test_three_stages_with_memory_tracking_hold_what_the_schedule_predicts():
    runs = run_pipeline(
        PipelineSpec(
            runs=[("gpipe", 6), ("1f1b", 6)],
            width=WIDTH,
            batch=12,
            repeats=1,
            warmup=0,
            track_memory=True,
            return_grads=True,
        ),
        stages=3,
    )
    ref_loss, ref_grads = reference(3, batch=12)
    gpipe, ofob = runs
    for run in runs:
        assert run.loss == pytest.approx(ref_loss, abs=1e-6)
        assert all(torch.allclose(run.grads[k], ref_grads[k], atol=1e-6) for k in ref_grads)
        assert run.peak_in_flight == simulate(run.schedule, 3, 6).peak_in_flight
        per_mb = run.activation_traces[0][0][1]  # stage 0 after its first forward
        assert per_mb == 2 * 2 * WIDTH * 4  # two ReLU outputs of (2 rows, WIDTH) float32
        assert run.peak_held_bytes[0] == run.peak_in_flight[0] * per_mb
        assert all(
            b is not None and b >= h
            for b, h in zip(run.peak_activation_bytes, run.peak_held_bytes, strict=True)
        )
        assert [label for label, _ in run.activation_traces[1]][:2] == ["F0", "F1"]
        assert all(trace[-1] == ("end", 0) for trace in run.activation_traces)  # all freed after the step
    assert gpipe.peak_in_flight == [6, 6, 6] and ofob.peak_in_flight == [3, 2, 1]
    assert gpipe.peak_held_bytes[0] == 2 * ofob.peak_held_bytes[0]


def loss_that_fails_on_the_second_micro_batch(out, target):
    """A loss function for the last stage that raises on its second call (module level: picklable)."""
    loss_that_fails_on_the_second_micro_batch.calls += 1
    if loss_that_fails_on_the_second_micro_batch.calls == 2:
        raise FloatingPointError("loss exploded on the second micro-batch")
    return F.mse_loss(out, target)


loss_that_fails_on_the_second_micro_batch.calls = 0


def stage_that_fails(rank, world_size):
    """Rank 1 dies in its second forward, while rank 0 waits for a gradient that never comes."""
    (module,) = make_stages(2, WIDTH, 1)[rank : rank + 1]
    x, y = make_batch(BATCH, WIDTH)
    order = stage_order("gpipe", rank, 2, 4)
    loss = loss_that_fails_on_the_second_micro_batch
    run_order(module, order, rank, world_size, list(x.chunk(4)), list(y.chunk(4)), loss_fn=loss)


def test_a_failing_stage_is_reported_and_every_process_is_gone():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # Rank 0 blocks in recv for a gradient; if launch waited for it instead of stopping it as soon as
    # rank 1 failed, the generous 90 s job deadline (shorter than the collective timeout) would fire
    # first and the message would say "timed out".
    with pytest.raises(LaunchError) as err:
        launch(stage_that_fails, 2, collective_timeout_s=600, timeout_s=90)
    message = str(err.value)
    assert message.startswith("rank 1 raised first"), message
    assert "FloatingPointError" in message and "run_order" in message
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in left), left


def test_pictures():
    tl = Timeline(
        [Task(0, "F", 0, 0.0, 0.01), Task(1, "F", 0, 0.01, 0.02), Task(1, "B", 0, 0.02, 0.04)], "toy"
    )
    ax = plot_timeline(tl, note="measured on a test")
    assert "toy: 40 ms" in ax.get_title() and "stage 1 idle 25%" in ax.get_title() and ax.get_xlabel() == "ms"
    fig = plot_sweep([1, 2, 4, 8], [1.0, 1.3, 1.5, 1.6], [0.5, 0.35, 0.22, 0.15], p=2, note="measured")
    assert len(fig.axes) == 2 and fig.axes[0].get_xscale() == "log"
    ax = draw_alexnet_split()
    assert "AlexNet" in ax.get_title() and sum(t.get_text() == "C3" for t in ax.texts) == 2
    plt.close("all")


TOY = Timeline([Task(0, "F", 0, 0.0, 0.01), Task(1, "F", 0, 0.01, 0.02)], "toy")
STAGE = make_stages(1, 8, 1)[0]
XS, YS = list(torch.zeros(4, 8).chunk(2)), list(torch.zeros(4, 8).chunk(2))
GOOD_ORDER = [("F", 0, 0), ("B", 0, 0)]


def _run_order(**changes):
    kwargs = {"module": STAGE, "order": GOOD_ORDER, "rank": 0, "world_size": 1, "xs": XS, "ys": YS}
    kwargs.update(changes)
    return run_order(**kwargs)


@pytest.mark.parametrize(
    "fn, args, kwargs, exc, message",
    [
        (stage_device, (-1,), {}, ValueError, r"rank .* must be >= 0, not -1"),
        (stage_device, ("0",), {}, TypeError, r"rank .* must be a whole number"),
        (StageRecorder, (-1,), {}, ValueError, r"stage .* must be >= 0"),
        (StageRecorder, (0,), {"device": 3}, TypeError, r"device must be a torch.device, a string"),
        (StageRecorder, (0,), {"device": "gpu0"}, ValueError, r"device must name a device such as 'cpu'"),
        (Timeline, ([],), {}, ValueError, r"at least one Task: record passes with StageRecorder"),
        (Timeline, ("tasks",), {}, TypeError, r"tasks must be a list of Task"),
        (Timeline, ([1.0],), {}, TypeError, r"Task objects only, found float"),
        (Timeline.from_stages, (TOY.tasks,), {}, TypeError, r"one list per stage\), not a flat list"),
        (TOY.mean_duration, ("X",), {}, ValueError, r"kind must be one of \['F', 'B'\], not 'X'"),
        (TOY.order, (2,), {}, ValueError, r"stage must be in 0..1, not 2"),
        (TOY.idle_fraction, (-1,), {}, ValueError, r"stage .* must be >= 0"),
        (Timeline([Task(0, "F", 0, 0.0, 0.0)]).idle_fraction, (0,), {}, ValueError, r"zero length"),
        (make_stages, (0,), {}, ValueError, r"p \(pipeline stages\) must be >= 1, not 0"),
        (make_stages, (2, 0), {}, ValueError, r"width .* must be >= 1, not 0"),
        (make_stages, (2, 16, 0), {}, ValueError, r"layers_per_stage .* must be >= 1"),
        (make_stages, (2, "16"), {}, TypeError, r"width .* must be a whole number >= 1"),
        (make_stages, (2,), {"out_features": 0}, ValueError, r"out_features .* must be >= 1"),
        (make_batch, (0,), {}, ValueError, r"batch \(rows\) must be >= 1, not 0"),
        (make_batch, (4,), {"width": 2.5}, TypeError, r"width .* must be a whole number"),
        (_run_order, (), {"module": "model"}, TypeError, r"module must be this stage's nn.Module"),
        (_run_order, (), {"module": torch.nn.ReLU()}, ValueError, r"module needs an nn.Linear"),
        (_run_order, (), {"rank": 1}, ValueError, r"rank must be in 0..0 \(world_size=1\), not 1"),
        (
            _run_order,
            (),
            {"world_size": 2},
            RuntimeError,
            r"needs a process group: run the stages with launch",
        ),
        (_run_order, (), {"xs": []}, TypeError, r"xs must be a non-empty list of tensors"),
        (_run_order, (), {"ys": YS[:1]}, ValueError, r"same number of micro-batches, got 2 and 1"),
        (_run_order, (), {"order": "FB"}, TypeError, r"order must be a list of actions from stage_order"),
        (_run_order, (), {"order": [("F", 0, 1)]}, ValueError, r"chunk must be 0 \(no 'interleaved'\)"),
        (_run_order, (), {"order": [("F", 5, 0)]}, ValueError, r"micro-batch 5 .* is not in 0..1"),
        (_run_order, (), {"order": [("B", 0, 0)]}, ValueError, r"backward before its forward"),
        (_run_order, (), {"order": [("X", 0, 0)]}, ValueError, r"action kind must be 'F' or 'B'"),
        (_run_order, (), {"recorder": "rec"}, TypeError, r"recorder must be a StageRecorder or None"),
        (_run_order, (), {"tracker": 3}, TypeError, r"tracker must be a MemoryTracker"),
        (_run_order, (), {"loss_fn": "mse"}, TypeError, r"loss_fn must be callable"),
    ],
)
def test_stages_reject_bad_arguments_with_advice(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


def _spec(**changes):
    return PipelineSpec(**{"runs": [("gpipe", 2)], **changes})


@pytest.mark.parametrize(
    "fn, args, kwargs, exc, message",
    [
        (_spec, (), {"runs": []}, ValueError, r"runs must be a non-empty list of \(schedule, m\)"),
        (_spec, (), {"runs": "gpipe"}, ValueError, r"runs must be a non-empty list"),
        (_spec, (), {"runs": [("gpipe",)]}, TypeError, r"each run must be a pair \(schedule, m\)"),
        (
            _spec,
            (),
            {"runs": [("gpipe", 0)]},
            ValueError,
            r"m \(micro-batches per step\) must be >= 1, not 0",
        ),
        (
            _spec,
            (),
            {"runs": [("interleaved", 4)]},
            ValueError,
            r"one of \['naive', 'sequential', 'gpipe', '1f1b'\]",
        ),
        (_spec, (), {"runs": [("naive", 4)]}, ValueError, r"use m=1 \(or 'gpipe' with m micro-batches\)"),
        (_spec, (), {"runs": [("gpipe", 3)], "batch": 16}, ValueError, r"m=3 must divide the batch of 16"),
        (_spec, (), {"width": 0}, ValueError, r"width .* must be >= 1"),
        (_spec, (), {"repeats": 0}, ValueError, r"repeats .* must be >= 1"),
        (_spec, (), {"warmup": -1}, ValueError, r"warmup .* must be >= 0"),
        (_spec, (), {"track_memory": "yes"}, TypeError, r"track_memory must be True or False"),
        (run_pipeline, (_spec(),), {"stages": 0}, ValueError, r"stages .* must be >= 2, not 0"),
        (run_pipeline, (_spec(),), {"stages": 1}, ValueError, r"for a single stage call run_order"),
        (run_pipeline, (_spec(),), {"stages": "2"}, TypeError, r"stages .* must be a whole number >= 2"),
        (run_pipeline, (_spec(),), {"timeout_s": -1}, ValueError, r"timeout_s .* finite number > 0"),
        (run_pipeline, ([("gpipe", 2)],), {}, TypeError, r"spec must be a PipelineSpec\(runs="),
        (PipelineRun, ("interleaved", 2, TOY, [], [1.0], [], [], []), {}, ValueError, r"schedule must be"),
        (PipelineRun, ("gpipe", 2, TOY.tasks, [], [1.0], [], [], []), {}, TypeError, r"timeline must be"),
    ],
)
def test_runner_rejects_bad_arguments_with_advice(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


def test_run_pipeline_revalidates_a_spec_changed_after_it_was_made():
    spec = _spec()
    spec.runs = [("gpipe", 3)]  # 256 rows do not split into 3
    with pytest.raises(ValueError, match="must divide the batch"):
        run_pipeline(spec)


UNTRACKED = PipelineRun("gpipe", 2, TOY, [0.02], [1.0, 1.0], [2, 2], [None, None], [[], []])


@pytest.mark.parametrize(
    "fn, args, kwargs, exc, message",
    [
        (plot_timeline, ("timeline",), {}, TypeError, r"timeline must be a Timeline or a list of Task"),
        (plot_timeline, ([],), {}, ValueError, r"at least one Task"),
        (plot_timeline, (TOY,), {"ax": 1}, TypeError, r"ax must be a matplotlib Axes"),
        (plot_sweep, ([], [], [], 2), {}, TypeError, r"ms must be a non-empty list of micro-batch counts"),
        (plot_sweep, ([1, 2], [1.0], [0.5, 0.3], 2), {}, ValueError, r"speedups must hold one value per m"),
        (plot_sweep, ([0, 2], [1.0, 1.2], [0.5, 0.3], 2), {}, ValueError, r"each m in ms .* must be >= 1"),
        (
            plot_sweep,
            ([1, 2], ["a", 1.2], [0.5, 0.3], 2),
            {},
            TypeError,
            r"each of speedups must be a number",
        ),
        (
            plot_sweep,
            ([1, 2], [1.0, 1.2], [0.5, 0.3], 0),
            {},
            ValueError,
            r"p \(pipeline stages\) must be >= 1",
        ),
        (plot_activation_traces, ([],), {}, TypeError, r"runs must be a non-empty list of PipelineRun"),
        (plot_activation_traces, ([TOY],), {}, TypeError, r"PipelineRun objects .*, not Timeline"),
        (plot_activation_traces, ([UNTRACKED],), {"unit": "GB"}, ValueError, r"unit must be one of"),
        (plot_activation_traces, ([UNTRACKED],), {}, ValueError, r"PipelineSpec\(track_memory=True\)"),
        (draw_alexnet_split, ("ax",), {}, TypeError, r"ax must be a matplotlib Axes"),
    ],
)
def test_plots_reject_bad_arguments_with_advice(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)
    plt.close("all")
