"""Tests of mgpu_helpers.tuning's task and trainables: training, checkpoints, search spaces, ASHA rungs.

No Ray start-up here (some tests import Ray's scheduler and search-space classes, nothing more).
"""

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mgpu_helpers import tuning
from mgpu_helpers.tuning import ToyTask, TrialRun, asha_milestones

CONFIG = {"l1": 32, "l2": 16, "lr": 0.03, "batch_size": 32}
METRICS = {"epoch", "loss", "accuracy", "train_loss"}


def test_trial_run_reports_metrics_and_learns():
    run = TrialRun(CONFIG, seed=0)
    history = [run.step() for _ in range(4)]
    assert all(set(h) == METRICS for h in history)
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert all(0.0 <= h["accuracy"] <= 1.0 and math.isfinite(h["loss"]) for h in history)
    assert history[-1]["accuracy"] > 0.6 > history[0]["accuracy"] - 0.2  # it learns
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_trial_run_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = tuning.train_locally(CONFIG, 2, seed=5)
    assert torch.equal(torch.rand(3), expected_next), "building a trial must not consume the global RNG"
    assert a == tuning.train_locally(CONFIG, 2, seed=5)
    assert a != tuning.train_locally(CONFIG, 2, seed=6)


def test_state_dict_resumes_bit_for_bit():
    straight = tuning.train_locally(CONFIG, 5, seed=3)
    first = TrialRun(CONFIG, seed=3)
    head = [first.step() for _ in range(3)]
    with tempfile.TemporaryDirectory() as d:
        torch.save(first.state_dict(), Path(d) / "s.pt")
        second = TrialRun(CONFIG, seed=99)  # a different seed: everything must come from the checkpoint
        second.load_state_dict(torch.load(Path(d) / "s.pt"))
    tail = [second.step() for _ in range(2)]
    assert head + tail == straight


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trial_run_on_a_gpu_resumes_from_a_checkpoint_loaded_on_the_cpu():
    # train_mlp loads checkpoints with map_location="cpu" (the shuffling RNG must stay there)
    straight = TrialRun(CONFIG, seed=3, device="cuda")
    expected = [straight.step() for _ in range(4)]
    first = TrialRun(CONFIG, seed=3, device="cuda")
    head = [first.step() for _ in range(2)]
    with tempfile.TemporaryDirectory() as d:
        torch.save(first.state_dict(), Path(d) / "s.pt")
        second = TrialRun(CONFIG, seed=99, device="cuda")
        second.load_state_dict(torch.load(Path(d) / "s.pt", map_location="cpu"))
    tail = [second.step() for _ in range(2)]
    assert next(second.model.parameters()).is_cuda
    assert [m["epoch"] for m in head + tail] == [1, 2, 3, 4]
    for got, want in zip(head + tail, expected, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-3)


def test_build_model_is_the_notes_network():
    model = tuning.build_model({"l1": 8, "l2": 4})
    assert model(torch.randn(5, 20)).shape == (5, 4)
    assert [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)] == [8, 4, 4]
    wide = tuning.build_model({"l1": np.int64(16), "l2": 2}, ToyTask(n_features=3, n_classes=2))
    assert wide(torch.randn(2, 3)).shape == (2, 2)  # NumPy ints (from tune.sample_from) are fine


def test_diverging_learning_rate_reports_a_finite_loss():
    metrics = tuning.train_locally({"l1": 256, "l2": 256, "lr": 50.0, "batch_size": 16}, 2)
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert any(m["loss"] == tuning.DIVERGED_LOSS for m in metrics)


def test_label_noise_changes_only_training_labels():
    clean, dirty = ToyTask().tensors(), ToyTask(label_noise=0.3).tensors()
    assert (
        torch.equal(clean[0], dirty[0])
        and torch.equal(clean[2], dirty[2])
        and torch.equal(clean[3], dirty[3])
    )
    changed = (clean[1] != dirty[1]).float().mean().item()
    assert 0.15 < changed < 0.3  # 30 % redrawn, a quarter of those land on the right label again
    assert len(clean[0]) == 256 and len(clean[2]) == 1024


def test_asha_milestones_match_rays_scheduler():
    from ray.tune.schedulers import ASHAScheduler

    for max_t, grace, rf in [(8, 1, 2), (27, 1, 3), (100, 2, 4), (16, 2, 2), (5, 5, 2), (1000, 1, 10)]:
        sched = ASHAScheduler(metric="loss", mode="min", max_t=max_t, grace_period=grace, reduction_factor=rf)
        ray_rungs = sorted(m for m, _ in sched._brackets[0]._rungs)
        assert asha_milestones(max_t, grace, rf) == ray_rungs, (max_t, grace, rf)


def test_notes_space_samples_powers_of_two_and_optuna_needs_the_translated_space():
    from ray.tune.search.optuna import OptunaSearch

    space = tuning.notes_search_space()
    np.random.seed(0)
    widths = {space["l1"].func(None) for _ in range(200)}
    assert widths == set(tuning.WIDTHS)
    lrs = [space["lr"].sample() for _ in range(200)]
    low, high = tuning.LR_RANGE
    assert all(low <= v <= high for v in lrs) and min(lrs) < 1e-3 < max(lrs)
    assert space["batch_size"].categories == list(tuning.NOTES_BATCH_SIZES) == [2, 4, 8, 16]
    with pytest.raises(ValueError, match="Function"):
        OptunaSearch.convert_search_space(space)
    converted = OptunaSearch.convert_search_space(tuning.optuna_search_space(batch_sizes=[8, 16]))
    assert set(converted) == {"l1", "l2", "lr", "batch_size"}
    assert list(converted["batch_size"].choices) == [8, 16]


def test_bohb_reason_matches_installed_packages():
    import importlib.util

    installed = all(importlib.util.find_spec(p) for p in ("hpbandster", "ConfigSpace"))
    reason = tuning.bohb_unavailable_reason()
    assert (reason is None) == installed
    if reason is not None:
        assert "HpBandSter" in reason or "hpbandster" in reason.lower()


def test_crash_plan_counts_attempts_in_its_folder():
    from mgpu_helpers.tuning.trainables import _crash_plan, _maybe_crash

    with tempfile.TemporaryDirectory() as d:
        plan = _crash_plan({"crash_at": [2, 2], "crash_dir": d})
        _maybe_crash(plan, d, 1, "t0")  # epoch 1 is not in the plan
        for attempt in (1, 2):
            with pytest.raises(tuning.SimulatedCrash, match=f"attempt {attempt}"):
                _maybe_crash(plan, d, 2, "t0")
        _maybe_crash(plan, d, 2, "t0")  # the third attempt goes through
        assert sorted(p.name for p in Path(d).iterdir()) == ["t0-epoch2-0", "t0-epoch2-1"]


# ------------------------------------------------------------------------------------------------
# Bad inputs: one table per module, each error says what to pass instead (no Ray start-up)
# ------------------------------------------------------------------------------------------------

TASK_BAD_INPUTS = [
    (tuning.train_locally, (CONFIG, -1), {}, ValueError, r"epochs must be >= 1"),
    (tuning.train_locally, (CONFIG, 0), {}, ValueError, r"epochs must be >= 1"),
    (tuning.train_locally, (CONFIG, "3"), {}, TypeError, r"epochs must be a whole number"),
    (tuning.train_locally, (CONFIG, 2.5), {}, TypeError, r"epochs must be a whole number"),
    (tuning.train_locally, (CONFIG, 1), {"task": "blobs"}, TypeError, r"task must be a ToyTask"),
    (tuning.build_model, ({"l1": 0, "l2": 4},), {}, ValueError, r'config\["l1"\].*>= 1'),
    (tuning.build_model, ({"l1": 8},), {}, ValueError, r"config lacks \['l2'\]; pass a dict"),
    (tuning.build_model, ({"l1": 8.5, "l2": 4},), {}, TypeError, r'config\["l1"\].*whole number'),
    (tuning.build_model, ([8, 4],), {}, TypeError, r"config must be a dict such as"),
    (TrialRun, ({"l1": 4, "l2": 4, "lr": 0.1},), {}, ValueError, r"config lacks \['batch_size'\]"),
    (TrialRun, ({**CONFIG, "batch_size": 0},), {}, ValueError, r'config\["batch_size"\] must be >= 1'),
    (TrialRun, ({**CONFIG, "lr": -0.1},), {}, ValueError, r"learning rate.*> 0"),
    (TrialRun, ({**CONFIG, "lr": float("nan")},), {}, ValueError, r"learning rate.*finite"),
    (TrialRun, (CONFIG,), {"seed": -1}, ValueError, r"seed must be >= 0"),
    (TrialRun, (CONFIG,), {"device": 0}, TypeError, r"device must be a string such as 'cpu'"),
    (ToyTask, (), {"n_samples": 0}, ValueError, r"n_samples must be >= 4"),
    (ToyTask, (), {"n_classes": 1}, ValueError, r"n_classes must be >= 2"),
    (ToyTask, (), {"n_features": "20"}, TypeError, r"n_features must be a whole number"),
    (ToyTask, (), {"noise": -1.0}, ValueError, r"noise must be a finite number >= 0"),
    (ToyTask, (), {"label_noise": 1.5}, ValueError, r"label_noise must be a finite number >= 0 and <= 1"),
    (ToyTask, (), {"val_fraction": 1.0}, ValueError, r"leaves an empty training or validation set"),
    (ToyTask, (), {"val_fraction": 0.0}, ValueError, r"val_fraction must be a finite number > 0"),
]

TRAINABLES_BAD_INPUTS = [
    (asha_milestones, (8,), {"grace_period": 0}, ValueError, r"grace_period must be >= 1"),
    (asha_milestones, (8,), {"grace_period": 9}, ValueError, r"grace_period must be <= max_t \(8\)"),
    (asha_milestones, (0,), {}, ValueError, r"max_t must be >= 1"),
    (asha_milestones, (8,), {"reduction_factor": 1}, ValueError, r"reduction_factor must be .*> 1"),
    (asha_milestones, ("8",), {}, TypeError, r"max_t must be a whole number"),
    (tuning.notes_search_space, ([],), {}, ValueError, r"batch_sizes must not be empty"),
    (tuning.notes_search_space, ("16",), {}, TypeError, r"batch_sizes must be a list of whole numbers"),
    (tuning.optuna_search_space, ((),), {}, ValueError, r"batch_sizes must not be empty"),
    (tuning.optuna_search_space, ([16, 0],), {}, ValueError, r"every entry of batch_sizes must be >= 1"),
    (tuning.train_mlp, ("l1=4",), {}, TypeError, r"config must be a dict of hyperparameters"),
    (
        tuning.train_mlp,
        ({**CONFIG, "max_epochs": 0},),
        {},
        ValueError,
        r'config\["max_epochs"\] must be >= 1',
    ),
    (tuning.train_mlp, ({**CONFIG, "crash_at": [2]},), {}, ValueError, r'needs config\["crash_dir"\]'),
    (
        tuning.train_mlp,
        ({**CONFIG, "crash_at": [2], "crash_dir": ""},),
        {},
        ValueError,
        r"an existing folder",
    ),
    (tuning.train_mlp, ({**CONFIG, "crash_at": 2},), {}, TypeError, r'crash_at"\] must be a list of epochs'),
    (tuning.train_mlp, ({**CONFIG, "task": 3},), {}, TypeError, r'config\["task"\] must be a dict'),
]


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    TASK_BAD_INPUTS,
    ids=[f"{f.__name__}-{i}" for i, (f, *_) in enumerate(TASK_BAD_INPUTS)],
)
def test_task_rejects_bad_inputs(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    TRAINABLES_BAD_INPUTS,
    ids=[f"{f.__name__}-{i}" for i, (f, *_) in enumerate(TRAINABLES_BAD_INPUTS)],
)
def test_trainables_reject_bad_inputs(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)
