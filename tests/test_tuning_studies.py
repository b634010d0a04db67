"""Tests of mgpu_helpers.tuning's equal-budget studies (Optuna, in this process) and of its plots."""

import matplotlib
import numpy as np
import pytest

from mgpu_helpers import tuning
from mgpu_helpers.tuning import Comparison, StudyTrace, ToyTask, asha_milestones, grid_design, run_study

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: A smaller task than the notebook's: the studies' bookkeeping does not depend on its size.
SMALL = ToyTask(n_samples=400, val_fraction=0.5)


@pytest.fixture(scope="module")
def asha_24():
    return run_study("asha", budget=24, seed=0, max_t=4, task=SMALL)


def test_grid_design_is_log_spaced_and_fits_the_budget():
    for n in (1, 4, 6, 9, 12, 16):
        grid = grid_design(n)
        assert 1 <= len(grid) <= n
        assert all(c["l1"] == c["l2"] and c["l1"] in tuning.WIDTHS for c in grid)
    lrs = sorted({c["lr"] for c in grid_design(6)})
    assert len(lrs) == 3 and np.allclose(np.diff(np.log10(lrs)), 1.0)  # one per decade, cell centres
    assert tuning.LR_RANGE[0] < lrs[0] and lrs[-1] < tuning.LR_RANGE[1]


@pytest.mark.parametrize("method", tuning.METHODS)
def test_run_study_spends_exactly_the_budget(method):
    trace = run_study(method, budget=12, seed=1, max_t=4, task=SMALL)
    assert trace.spent == 12 and len(trace.best_curve) == 12
    assert trace.best_curve == sorted(trace.best_curve)  # best so far never decreases
    assert sum(t.epochs for t in trace.trials) == 12
    assert trace.best == max(a for t in trace.trials for a in t.accuracies)
    if method.endswith("asha"):
        assert all(t.epochs in asha_milestones(4, 1, 2) or t.truncated for t in trace.trials)
    else:
        assert [t.epochs for t in trace.trials] == [4, 4, 4]


def test_grid_visits_its_points_and_asha_explores_more_than_random(asha_24):
    grid = run_study("grid", budget=24, seed=0, max_t=4, task=SMALL)
    assert sorted(tuple(t.config.items()) for t in grid.trials) == sorted(
        tuple(c.items()) for c in grid_design(6, batch_size=32)
    )
    random = run_study("random", budget=24, seed=0, max_t=4, task=SMALL)
    assert len(asha_24.trials) > len(random.trials) == 6
    assert any(t.pruned for t in asha_24.trials)


def test_same_seed_same_study(asha_24):
    again = run_study("asha", budget=24, seed=0, max_t=4, task=SMALL)
    assert again.best_curve == asha_24.best_curve
    assert [t.config for t in again.trials] == [t.config for t in asha_24.trials]


def _trace(method, seed, curve, budget=6):
    return StudyTrace(method, seed, budget, 2, [], curve, 0.0)


def test_comparison_epochs_to_target_and_censoring():
    comp = Comparison(
        [
            _trace("random", 0, [0.5, 0.7, 0.7, 0.9, 0.9, 0.9]),
            _trace("random", 1, [0.5, 0.5, 0.6, 0.6, 0.6, 0.6]),  # never reaches 0.89
            _trace("asha", 0, [0.6, 0.895, 0.9, 0.9, 0.9, 0.9]),
            _trace("asha", 1, [0.9, 0.9, 0.9, 0.9, 0.9, 0.9]),
        ]
    )
    assert comp.reference == 0.9
    assert comp.epochs_to_target("random", 0.01) == [4, None]
    assert comp.epochs_to_target("asha", 0.01) == [2, 1]
    assert comp.mean_epochs_to_target("random", 0.01) == (5.0, 1)  # the miss counts as the budget, 6
    assert comp.methods == ["random", "asha"]
    rows = {r["method"]: r for r in comp.table(0.01)}
    assert rows["asha"]["seeds reaching it"] == "2/2" and rows["random"]["seeds reaching it"] == "1/2"
    summary = tuning.method_summary(comp).splitlines()
    assert "epochs to best-1%" in summary[0] and len(summary) == 3
    assert comp.traces_of("asha")[1].best_after(100) == 0.9


def test_compare_methods_and_plots_draw(asha_24):
    comp = tuning.compare_methods(
        ("random", "asha"), budget=8, seeds=(0, 1), max_t=4, task=SMALL, progress=False
    )
    assert [(t.method, t.seed) for t in comp.traces] == [
        ("random", 0),
        ("asha", 0),
        ("random", 1),
        ("asha", 1),
    ]
    assert all(t.spent == 8 for t in comp.traces)
    axes = tuning.plot_best_vs_epochs(comp)
    assert len(axes) == 2 and len(axes[0].lines) == 3  # two methods and the target line
    pts = {"grid": np.array([[0.2, 0.2], [0.8, 0.8]]), "random": np.array([[0.1, 0.5], [0.3, 0.9]])}
    axes = tuning.plot_search_layouts(lambda x, y: x + y, pts, important=lambda x: x)
    assert "2 distinct" in axes[0].get_title() and len(axes) == 2
    plt.close("all")


# ------------------------------------------------------------------------------------------------
# Bad inputs: one table per module (no study runs: the checks come first)
# ------------------------------------------------------------------------------------------------

_COMP = Comparison([_trace("random", 0, [0.5, 0.9])])

STUDIES_BAD_INPUTS = [
    (grid_design, (0,), {}, ValueError, r"n_points \(grid points\) must be >= 1"),
    (grid_design, (4.0,), {}, TypeError, r"n_points \(grid points\) must be a whole number"),
    (grid_design, (4,), {"batch_size": 0}, ValueError, r"batch_size must be >= 1"),
    (run_study, ("bohb",), {"budget": 8}, ValueError, r"unknown method 'bohb'; choose one of"),
    (run_study, ("random",), {"budget": 0}, ValueError, r"budget \(training epochs\) must be >= 1"),
    (run_study, ("random",), {"budget": -5}, ValueError, r"budget \(training epochs\) must be >= 1"),
    (run_study, ("random",), {"budget": 8, "max_t": 0}, ValueError, r"max_t .* must be >= 1"),
    (
        run_study,
        ("asha",),
        {"budget": 8, "reduction_factor": 1},
        ValueError,
        r"reduction_factor must be >= 2",
    ),
    (run_study, ("random",), {"budget": 8, "batch_sizes": []}, ValueError, r"batch_sizes must not be empty"),
    (run_study, ("random",), {"budget": 8, "task": {"noise": 1}}, TypeError, r"task must be a ToyTask"),
    (tuning.compare_methods, (["random", "nope"],), {"budget": 8}, ValueError, r"unknown method 'nope'"),
    (tuning.compare_methods, ("random",), {"budget": 8}, ValueError, r"methods must be a non-empty list"),
    (tuning.compare_methods, ((),), {"budget": 8}, ValueError, r"methods must be a non-empty list"),
    (tuning.compare_methods, (), {"budget": 8, "seeds": []}, ValueError, r"seeds must not be empty"),
    (
        tuning.compare_methods,
        (),
        {"budget": 8, "progress": "no"},
        TypeError,
        r"progress must be True or False",
    ),
    (Comparison, ([],), {}, ValueError, r"non-empty list of StudyTrace"),
    (Comparison, (["trace"],), {}, TypeError, r"Comparison takes StudyTrace objects"),
    (
        _COMP.traces_of,
        ("asha",),
        {},
        ValueError,
        r"'asha' is not in this comparison; choose one of \['random'\]",
    ),
    (
        _COMP.epochs_to_target,
        ("random",),
        {"tolerance": -0.1},
        ValueError,
        r"tolerance must be a finite number",
    ),
    (tuning.method_summary, ([],), {}, TypeError, r"comparison must be a Comparison"),
    (StudyTrace, ("sgd", 0, 8, 2, [], [], 0.0), {}, ValueError, r"unknown method 'sgd'"),
]

PLOTS_BAD_INPUTS = [
    (tuning.plot_best_vs_epochs, ({"random": []},), {}, TypeError, r"comparison must be a Comparison"),
    (
        tuning.plot_best_vs_epochs,
        (_COMP,),
        {"tolerance": 2},
        ValueError,
        r"tolerance must be a finite number",
    ),
    (tuning.plot_search_layouts, ("f", {"a": [[0, 0]]}), {}, TypeError, r"must be functions of arrays"),
    (tuning.plot_search_layouts, (np.add, {}), {}, TypeError, r"layouts must be a non-empty dict"),
    (tuning.plot_search_layouts, (np.add, {"a": [0.1, 0.2]}), {}, ValueError, r"shape \(n, 2\)"),
    (
        tuning.plot_search_layouts,
        (np.add, {"a": [[0, 0]]}),
        {"extent": (1, 0, 0, 1)},
        ValueError,
        r"x_min < x_max",
    ),
    (
        tuning.plot_search_layouts,
        (np.add, {"a": [[0, 0]]}),
        {"axes": [1, 2]},
        ValueError,
        r"one axis per layout",
    ),
    (tuning.plot_learning_curves, ("results",), {}, TypeError, r"results must be a ResultGrid"),
    (tuning.plot_learning_curves, ([1, 2],), {}, TypeError, r"results must hold Ray Tune Results"),
    (
        tuning.plot_learning_curves,
        ([],),
        {"milestones": [0]},
        ValueError,
        r"every entry of milestones must be >= 1",
    ),
    (tuning.plot_learning_curves, ([],), {"metric": 3}, TypeError, r"metric must be a non-empty string"),
    (tuning.results_table, ({"a": 1},), {}, TypeError, r"results must be a ResultGrid"),
    (tuning.results_table, ([],), {"columns": "loss"}, TypeError, r"columns must be metric names"),
    (tuning.epoch_progress, (0,), {}, ValueError, r"total \(epochs, or None\) must be >= 1"),
    (tuning.epoch_progress, (), {"desc": None}, TypeError, r"desc must be a non-empty string"),
]


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    STUDIES_BAD_INPUTS,
    ids=[f"{getattr(f, '__name__', 'f')}-{i}" for i, (f, *_) in enumerate(STUDIES_BAD_INPUTS)],
)
def test_studies_reject_bad_inputs(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    PLOTS_BAD_INPUTS,
    ids=[f"{f.__name__}-{i}" for i, (f, *_) in enumerate(PLOTS_BAD_INPUTS)],
)
def test_plots_reject_bad_inputs(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)
    plt.close("all")
