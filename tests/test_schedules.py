"""mgpu_helpers.pipeline: the schedule simulator against the textbook formulas, its orders, its drawing
and its widget; bad arguments are refused with advice."""

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from mgpu_helpers.pipeline import (
    ScheduleSimulator,
    Task,
    bubble_relative_to_ideal,
    gpipe_bubble,
    peaks_in_flight,
    pipeline_speedup,
    plot_gantt,
    plot_schedule,
    schedules,
    simulate,
    simulate_orders,
    stage_order,
)

GRID = list(itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4, 8, 12, 16), (0.5, 1.0, 2.0, 3.0)))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_match_the_formulas(schedule):
    for p, m, ratio in GRID:
        r = simulate(schedule, p, m, forward=1.0, backward=ratio)
        assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12), (p, m, ratio)
        assert r.bubble_ratio == pytest.approx((p - 1) / m, abs=1e-12), (p, m, ratio)
        assert r.makespan == pytest.approx((m + p - 1) * (1.0 + ratio))
        for s in range(p):  # with equal stages every stage idles the same time
            assert r.idle_fraction(s) == pytest.approx(gpipe_bubble(p, m))


def test_interleaved_bubble_is_divided_by_v():
    for p, m, ratio in GRID:
        if m % p:
            continue
        for v in (1, 2, 3, 4):
            r = simulate("interleaved", p, m, v=v, forward=1.0, backward=ratio)
            assert r.bubble_ratio == pytest.approx((p - 1) / (v * m), abs=1e-12), (p, m, v, ratio)
            assert r.bubble_ratio == pytest.approx(bubble_relative_to_ideal(p, m, v))
            assert r.ideal == pytest.approx(m * (1.0 + ratio))


def test_peak_in_flight_gpipe_holds_all_1f1b_at_most_p():
    for p, m, _ in GRID:
        assert simulate("gpipe", p, m).peak_in_flight == [m] * p
        one_f_one_b = simulate("1f1b", p, m)
        assert one_f_one_b.peak_in_flight == [min(p - s, m) for s in range(p)]
        assert max(one_f_one_b.peak_in_flight) <= p
        assert one_f_one_b.peak_activations == [float(n) for n in one_f_one_b.peak_in_flight]


def test_interleaved_holds_more_than_1f1b_but_less_than_gpipe():
    p, m = 4, 16
    one_f_one_b = max(simulate("1f1b", p, m).peak_activations)
    for v in (2, 4):
        held = max(simulate("interleaved", p, m, v=v).peak_activations)
        assert one_f_one_b < held < m
    # Megatron-LM's warm-up: device 0 holds 2(p-1) + (v-1)p + 1 chunks of 1/v micro-batch each
    assert max(simulate("interleaved", p, m, v=2).peak_activations) == pytest.approx((6 + 4 + 1) / 2)


def test_formula_helpers():
    assert gpipe_bubble(4, 6) == pytest.approx(1 / 3)
    assert gpipe_bubble(1, 5) == 0.0
    assert bubble_relative_to_ideal(4, 8) == pytest.approx(3 / 8)
    assert bubble_relative_to_ideal(4, 8, v=2) == pytest.approx(3 / 16)
    assert pipeline_speedup(2, 8) == pytest.approx(16 / 9)
    assert pipeline_speedup(4, 1) == 1.0
    # speed-up over the naive split, simulated with micro-batches 1/m as long as the whole batch
    for p, m in [(2, 8), (4, 8), (3, 5)]:
        naive = simulate("gpipe", p, 1, forward=1.0, backward=2.0)
        piped = simulate("gpipe", p, m, forward=1.0 / m, backward=2.0 / m)
        assert naive.makespan / piped.makespan == pytest.approx(pipeline_speedup(p, m))
    with pytest.raises(ValueError, match="micro-batches"):
        gpipe_bubble(2, 0)
    with pytest.raises(ValueError, match="stages"):
        pipeline_speedup(0, 4)
    with pytest.raises(ValueError, match="chunks"):
        bubble_relative_to_ideal(2, 4, v=0)


def test_stage_orders():
    assert stage_order("gpipe", 0, 2, 3) == [
        ("F", 0, 0),
        ("F", 1, 0),
        ("F", 2, 0),
        ("B", 0, 0),
        ("B", 1, 0),
        ("B", 2, 0),
    ]
    kinds = {s: "".join(k for k, _, _ in stage_order("1f1b", s, 2, 4)) for s in range(2)}
    assert kinds == {0: "FFBFBFBB", 1: "FBFBFBFB"}
    assert [a for a in stage_order("1f1b", 0, 4, 2)] == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("B", 1, 0)]
    for p, m, _ in GRID:
        for s in range(p):
            assert stage_order("interleaved", s, p, p * m, v=1) == stage_order("1f1b", s, p, p * m)
            for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
                mm = p * m if schedule == "interleaved" else m
                order = stage_order(schedule, s, p, mm, v=v)
                # every (micro-batch, chunk) has exactly one forward and one backward, forward first
                assert sorted(order) == sorted({(k, i, c) for k in "FB" for i in range(mm) for c in range(v)})
                for i, c in itertools.product(range(mm), range(v)):
                    assert order.index(("F", i, c)) < order.index(("B", i, c))


def test_stage_order_rejects_bad_arguments_with_advice():
    with pytest.raises(ValueError, match="multiple of p.*Try m=8"):
        stage_order("interleaved", 0, 4, 6, v=2)
    with pytest.raises(ValueError, match="one of"):
        stage_order("zero-bubble", 0, 2, 2)
    with pytest.raises(ValueError, match="stage must be in 0..1"):
        stage_order("gpipe", 2, 2, 2)
    with pytest.raises(ValueError, match="interleaved' only"):
        stage_order("gpipe", 0, 2, 2, v=2)
    with pytest.raises(ValueError, match="forward .* must be a finite number > 0"):
        simulate("gpipe", 2, 2, forward=0.0)


def test_simulated_tasks_respect_dependencies_and_never_overlap_on_a_stage():
    for schedule, p, m, v in [("gpipe", 3, 5, 1), ("1f1b", 4, 7, 1), ("interleaved", 3, 6, 2)]:
        r = simulate(schedule, p, m, v=v, comm=0.25)
        end = {(t.kind, t.chunk * p + t.stage, t.microbatch): t.end for t in r.tasks}
        last = p * v - 1
        for t in r.tasks:
            vs = t.chunk * p + t.stage
            if t.kind == "F" and vs > 0:
                assert t.start >= end[("F", vs - 1, t.microbatch)] + 0.25 - 1e-12
            if t.kind == "B":
                dep = ("F", vs, t.microbatch) if vs == last else ("B", vs + 1, t.microbatch)
                assert t.start >= end[dep] - 1e-12
        for s in range(p):
            mine = sorted((t for t in r.tasks if t.stage == s), key=lambda t: t.start)
            assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(mine))


def test_communication_time_lengthens_the_naive_step():
    assert simulate("gpipe", 2, 1, comm=0.5).makespan == pytest.approx(1 + 1 + 2 + 2 + 2 * 0.5)


def test_a_deadlocking_order_is_reported(monkeypatch):
    def backwards_first(schedule, stage, p, m, v=1):
        return [("B", 0, 0), ("F", 0, 0)]

    monkeypatch.setattr(schedules, "stage_order", backwards_first)
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate("gpipe", 2, 1)


def test_summary_and_plots():
    r = simulate("1f1b", 4, 8)
    assert (
        "1F1B p=4, m=8" in r.summary() and "27.3% of the step" in r.summary() and "simulated" in r.summary()
    )
    ax = plot_schedule(r)
    assert sum(len(c.get_paths()) for c in ax.collections) == len(r.tasks)  # one bar per pass
    assert "bubble 27%" in ax.get_title()
    ax = plot_gantt(simulate("interleaved", 2, 4, v=2).tasks, note="simulated")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "forward, chunk ≥ 1" in labels and "idle (bubble)" in labels
    with pytest.raises(ValueError, match="no tasks"):
        plot_gantt([])
    plt.close("all")


def test_simulator_widget_follows_its_sliders_and_renders_headless():
    sim = ScheduleSimulator(schedule="1f1b", p=4, m=8)
    assert sim.result is not None and sim.result.schedule == "1f1b"
    assert sim.v.disabled  # chunks only matter for interleaved
    assert "27.3% of the step" in sim.info.value
    sim.schedule.value = "interleaved"
    assert not sim.v.disabled and sim.result.v == 2
    assert sim.result.bubble_ratio == pytest.approx(3 / 16)
    sim.m.value = 6  # not a multiple of p: explained, not raised
    assert sim.result is None and "multiple of p" in sim.info.value
    sim.m.value = 12
    sim.ratio.value = 3.0
    assert sim.result.m == 12 and sim.result.backward == 3.0
    bundle = sim._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == sim.box.model_id
    assert bundle["image/png"] and "interleaved 1F1B p=4, m=12" in bundle["text/plain"]
    assert sim.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    plt.close("all")


def test_simulator_widget_clears_the_chart_while_it_shows_an_error():
    sim = ScheduleSimulator(schedule="interleaved", p=4, m=8, v=2)
    assert sim.image.value and sim.image.layout.display is None
    sim.m.value = 6  # not a multiple of p
    assert "multiple of p" in sim.info.value
    assert sim.image.value == b"" and sim.image.layout.display == "none"  # no stale chart under the message
    bundle = sim._repr_mimebundle_()
    assert "image/png" not in bundle and "multiple of p" in bundle["text/plain"]
    sim.m.value = 12  # valid again: a fresh chart, shown
    assert sim.image.value[:8] == b"\x89PNG\r\n\x1a\n" and sim.image.layout.display is None
    plt.close("all")


def test_simulator_uses_only_widgets_that_exist_in_ipywidgets_7():
    import inspect

    source = inspect.getsource(ScheduleSimulator)
    used = set(__import__("re").findall(r"\bw\.([A-Z]\w+)", source))
    assert used <= {"Dropdown", "IntSlider", "FloatSlider", "HTML", "Image", "VBox", "HBox", "Layout"}


def test_importing_the_package_imports_neither_matplotlib_nor_ipywidgets():
    import subprocess
    import sys

    code = (
        "import sys, mgpu_helpers.pipeline as p; p.simulate('1f1b', 2, 4); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'ipywidgets', 'IPython'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


TASKS = [Task(0, "F", 0, 0.0, 1.0), Task(1, "F", 0, 1.0, 2.0)]


def _busy_of_missing_stage():
    return simulate("gpipe", 4, 8).busy(4)


@pytest.mark.parametrize(
    "fn, args, kwargs, exc, message",
    [
        (simulate, ("gpipe",), {"p": 0, "m": 8}, ValueError, r"p \(pipeline stages\) must be >= 1, not 0"),
        (simulate, ("gpipe", 4, 0), {}, ValueError, r"m \(micro-batches per step\) must be >= 1, not 0"),
        (simulate, ("gpipe", "4", 8), {}, TypeError, r"p .* must be a whole number >= 1, not '4'"),
        (simulate, ("gpipe", 4.0, 8), {}, TypeError, r"p .* must be a whole number"),
        (simulate, ("gpipe", True, 8), {}, TypeError, r"p .* must be a whole number"),
        (
            simulate,
            ("interleaved", 4, 8),
            {"v": 0},
            ValueError,
            r"v \(model chunks per device\) must be >= 1",
        ),
        (simulate, ("1f1b", 4, 8), {"v": 2}, ValueError, r"applies to 'interleaved' only; '1f1b' needs v=1"),
        (simulate, ("interleaved", 4, 6), {"v": 2}, ValueError, r"multiple of p.*Try m=8"),
        (simulate, ("pipedream", 4, 8), {}, ValueError, r"one of \['gpipe', '1f1b', 'interleaved'\]"),
        (simulate, (None, 4, 8), {}, ValueError, r"schedule must be one of"),
        (simulate, ("gpipe", 4, 8), {"backward": -1}, ValueError, r"backward .* finite number > 0, not -1"),
        (simulate, ("gpipe", 4, 8), {"forward": "1"}, TypeError, r"forward .* must be a number"),
        (simulate, ("gpipe", 4, 8), {"comm": -0.5}, ValueError, r"comm .* finite number >= 0, not -0.5"),
        (simulate, ("gpipe", 4, 8), {"comm": float("nan")}, ValueError, r"comm .* finite number >= 0"),
        (stage_order, ("gpipe", 4, 4, 8), {}, ValueError, r"stage must be in 0..3 \(p=4 stages\), not 4"),
        (stage_order, ("gpipe", -1, 4, 8), {}, ValueError, r"stage .* must be >= 0, not -1"),
        (stage_order, ("1f1b", 0, 0, 8), {}, ValueError, r"p \(pipeline stages\) must be >= 1"),
        (gpipe_bubble, (0, 4), {}, ValueError, r"p \(pipeline stages\) must be >= 1, not 0"),
        (gpipe_bubble, (4, 2.5), {}, TypeError, r"m .* must be a whole number >= 1"),
        (
            bubble_relative_to_ideal,
            (4, 8),
            {"v": 0},
            ValueError,
            r"v \(model chunks per device\) must be >= 1",
        ),
        (pipeline_speedup, (4, -1), {}, ValueError, r"m \(micro-batches per step\) must be >= 1, not -1"),
        (pipeline_speedup, ("2", 8), {}, TypeError, r"p .* must be a whole number"),
        (Task, (0, "X", 0, 0.0, 1.0), {}, ValueError, r"kind must be 'F' \(forward\) or 'B'"),
        (Task, (0, "F", 0, 2.0, 1.0), {}, ValueError, r"must end after it starts"),
        (Task, (-1, "F", 0, 0.0, 1.0), {}, ValueError, r"stage .* must be >= 0"),
        (_busy_of_missing_stage, (), {}, ValueError, r"stage must be in 0..3, not 4"),
    ],
)
def test_schedules_reject_bad_arguments_with_advice(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


@pytest.mark.parametrize(
    "fn, args, kwargs, exc, message",
    [
        (plot_gantt, ("not tasks",), {}, TypeError, r"tasks must be a list of Task \(e.g. simulate"),
        (plot_gantt, ([],), {}, ValueError, r"no tasks to draw: pass a non-empty list of Task"),
        (plot_gantt, ([1, 2],), {}, TypeError, r"Task objects only, found int"),
        (plot_gantt, (TASKS,), {"ax": "axes"}, TypeError, r"ax must be a matplotlib Axes .* or None"),
        (plot_gantt, (TASKS,), {"scale": 0}, ValueError, r"scale .* must be a finite number > 0"),
        (plot_gantt, (TASKS,), {"stage_names": ["only one"]}, ValueError, r"at least 2 names"),
        (plot_schedule, (TASKS,), {}, TypeError, r"ScheduleResult from simulate\(...\), not list"),
    ],
)
def test_schedule_plots_reject_bad_arguments_with_advice(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)
    plt.close("all")


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (
            {"schedule": "pipedream"},
            ValueError,
            r"schedule must be one of \['gpipe', '1f1b', 'interleaved'\]",
        ),
        ({"p": 0}, ValueError, r"p \(pipeline stages\) must be >= 1, not 0"),
        ({"p": 9}, ValueError, r"p \(pipeline stages\) must be in 1..8 \(the slider's range\)"),
        ({"m": 33}, ValueError, r"m \(micro-batches\) must be in 1..32"),
        ({"m": "8"}, TypeError, r"m .* must be a whole number"),
        ({"ratio": 0}, ValueError, r"ratio .* must be a finite number > 0"),
        ({"ratio": 5.0}, ValueError, r"ratio .* must be in 0.5..4.0"),
        ({"v": 5}, ValueError, r"v \(chunks per device\) must be in 1..4"),
    ],
)
def test_simulator_widget_rejects_bad_defaults_with_advice(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        ScheduleSimulator(**kwargs)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_hand_written_orders_simulate_like_the_named_schedules(schedule):
    for p, m in [(1, 3), (2, 4), (3, 2), (4, 8)]:
        orders = [[(k, i) for k, i, _ in stage_order(schedule, s, p, m)] for s in range(p)]
        tasks = simulate_orders(orders)
        named = simulate(schedule, p, m)
        assert max(t.end for t in tasks) == named.makespan
        assert peaks_in_flight(tasks, p) == named.peak_in_flight


def test_hand_written_orders_are_checked():
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate_orders([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="exactly once"):
        simulate_orders([[("F", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match=r"\('F', i\) or \('B', i\)"):
        simulate_orders([[("X", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="same micro-batches"):
        simulate_orders([[("F", 0), ("B", 0)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]])
    with pytest.raises(TypeError, match="one list of"):
        simulate_orders("FB")
    sequential = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)]] * 2
    assert peaks_in_flight(simulate_orders(sequential), 2) == [1, 1]
