"""Stage processes: send/recv pipelines match the unsplit model; timelines, memory, cleanup on failure."""

import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import psutil
import pytest
import torch
import torch.nn.functional as F

from mgpu_helpers.launcher import LaunchError, launch
from mgpu_helpers.pipeline import (
    PipelineRun,
    PipelineSpec,
    StageRecorder,
    Timeline,
    draw_alexnet_split,
    make_batch,
    make_stages,
    plot_activation_traces,
    plot_sweep,
    plot_timeline,
    run_order,
    run_pipeline,
)
from mgpu_helpers.schedules import Task, simulate, stage_order

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
    with pytest.raises(ValueError, match="no 'X' tasks"):
        tl.mean_duration("X")
    assert tl.cpu_share(0) is None  # not recorded
    shared = Timeline([Task(0, "F", 0, 0.0, 1.0, cpu=0.5), Task(0, "B", 0, 1.0, 3.0, cpu=2.0)])
    assert shared.cpu_share(0) == pytest.approx(2.5 / 3.0)


def test_make_stages_is_deterministic_and_splits_one_model():
    a, b = make_stages(3, 16, 2, out_features=4, seed=5), make_stages(3, 16, 2, out_features=4, seed=5)
    for sa, sb in zip(a, b, strict=True):
        for pa, pb in zip(sa.parameters(), sb.parameters(), strict=True):
            assert torch.equal(pa, pb)
    assert not torch.equal(a[0][0].weight, make_stages(3, 16, 2, seed=6)[0][0].weight)
    x = torch.randn(5, 16)
    assert a[0](x).shape == (5, 16) and a[2](a[1](a[0](x))).shape == (5, 4)
    with pytest.raises(ValueError, match="layers_per_stage"):
        make_stages(2, 16, 0)


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
            runs=[("naive", 1), ("gpipe", 4), ("1f1b", 4)],
            width=WIDTH,
            batch=BATCH,
            repeats=2,
            return_grads=True,
        ),
        stages=2,
    )
    ref_loss, ref_grads = reference(2)
    for run in runs:
        assert run.loss == pytest.approx(ref_loss, abs=1e-6)
        assert run.grads.keys() == ref_grads.keys()
        assert all(torch.allclose(run.grads[k], ref_grads[k], atol=1e-6) for k in ref_grads)
        schedule = "gpipe" if run.schedule == "naive" else run.schedule
        for s in range(2):
            assert run.timeline.order(s) == [(k, i) for k, i, _ in stage_order(schedule, s, 2, run.m)]
        assert run.peak_in_flight == simulate(schedule, 2, run.m).peak_in_flight
        assert len(run.timeline.tasks) == 2 * 2 * run.m and run.timeline.makespan > 0
    assert [r.timeline.label for r in runs] == ["naive split", "GPipe, m=4", "1F1B, m=4"]


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


def test_run_pipeline_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="interleaved"):
        run_pipeline(PipelineSpec(runs=[("interleaved", 4)]))
    with pytest.raises(ValueError, match="m=1"):
        run_pipeline(PipelineSpec(runs=[("naive", 4)]))
    with pytest.raises(ValueError, match="divide the batch"):
        run_pipeline(PipelineSpec(runs=[("gpipe", 3)], batch=16))


def stage_that_fails(rank, world_size):
    """Rank 1 dies after its first forward, while rank 0 is waiting for a gradient."""
    (module,) = make_stages(2, WIDTH, 1)[rank : rank + 1]
    x, y = make_batch(BATCH, WIDTH)
    order = stage_order("gpipe", rank, 2, 4)
    if rank == 1:
        order = order[:1] + [("F", 99, 0)]  # micro-batch 99 does not exist: IndexError
    run_order(module, order, rank, world_size, list(x.chunk(4)), list(y.chunk(4)))


def test_a_failing_stage_is_reported_and_every_process_is_gone():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(stage_that_fails, 2, collective_timeout_s=20)
    assert time.monotonic() - start < 15  # rank 0, blocked in recv, does not wait out the timeout
    message = str(err.value)
    assert message.startswith("rank 1 raised first") and "IndexError" in message and "run_order" in message
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
    untracked = PipelineRun("gpipe", 2, tl, [0.04], [1.0, 1.0], [2, 2], [None, None], [[], []])
    with pytest.raises(ValueError, match="track_memory"):
        plot_activation_traces([untracked])
    plt.close("all")
