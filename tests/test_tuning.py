"""Tests of mgpu_helpers.tuning: training, budgets, search spaces, and Ray on loopback with no leftovers."""

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mgpu_helpers import tuning
from mgpu_helpers.tuning import (
    Comparison,
    StudyTrace,
    ToyTask,
    TrialRun,
    asha_milestones,
    grid_design,
    is_loopback,
    run_study,
)

CONFIG = {"l1": 32, "l2": 16, "lr": 0.03, "batch_size": 32}
METRICS = {"epoch", "loss", "accuracy", "train_loss"}


# ------------------------------------------------------------------------------------------------
# No Ray on import
# ------------------------------------------------------------------------------------------------


def test_importing_the_package_and_every_module_does_not_import_ray():
    code = """
import importlib, json, pkgutil, sys
import mgpu_helpers
failed = {}
for m in pkgutil.iter_modules(mgpu_helpers.__path__):
    if m.name == "__main__":
        continue
    try:
        importlib.import_module("mgpu_helpers." + m.name)
    except Exception as exc:  # another module's own problem, reported but not this test's subject
        failed[m.name] = repr(exc)
print(json.dumps({"ray": sorted(k for k in sys.modules if k == "ray" or k.startswith("ray.")),
                  "optuna": "optuna" in sys.modules, "failed": failed}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert "tuning" not in report["failed"], report["failed"]
    assert report["ray"] == [], f"Ray was imported by importing mgpu_helpers modules: {report['ray'][:5]}"
    assert report["optuna"] is False


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------


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


def test_model_and_config_validation():
    model = tuning.build_model({"l1": 8, "l2": 4})
    assert model(torch.randn(5, 20)).shape == (5, 4)
    assert [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)] == [8, 4, 4]
    with pytest.raises(KeyError, match="batch_size"):
        TrialRun({"l1": 4, "l2": 4, "lr": 0.1})
    with pytest.raises(ValueError, match="batch_size"):
        TrialRun({**CONFIG, "batch_size": 0})
    with pytest.raises(ValueError, match="positive"):
        tuning.build_model({"l1": 0, "l2": 4})


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


# ------------------------------------------------------------------------------------------------
# Search spaces, rungs, grids
# ------------------------------------------------------------------------------------------------


def test_grid_design_is_log_spaced_and_fits_the_budget():
    for n in (1, 4, 6, 9, 12, 16):
        grid = grid_design(n)
        assert 1 <= len(grid) <= n
        assert all(c["l1"] == c["l2"] and c["l1"] in tuning.WIDTHS for c in grid)
    lrs = sorted({c["lr"] for c in grid_design(6)})
    assert len(lrs) == 3 and np.allclose(np.diff(np.log10(lrs)), 1.0)  # one per decade, cell centres
    assert lrs[0] > 1e-4 and lrs[-1] < 1e-1
    with pytest.raises(ValueError):
        grid_design(0)


def test_asha_milestones_match_rays_scheduler():
    from ray.tune.schedulers import ASHAScheduler

    for max_t, grace, rf in [(8, 1, 2), (27, 1, 3), (100, 2, 4), (16, 2, 2)]:
        sched = ASHAScheduler(metric="loss", mode="min", max_t=max_t, grace_period=grace, reduction_factor=rf)
        ray_rungs = sorted(m for m, _ in sched._brackets[0]._rungs)
        assert asha_milestones(max_t, grace, rf) == ray_rungs


def test_notes_space_samples_powers_of_two_and_optuna_needs_the_translated_space():
    from ray.tune.search.optuna import OptunaSearch

    space = tuning.notes_search_space()
    np.random.seed(0)
    widths = {space["l1"].func(None) for _ in range(200)}
    assert widths == set(tuning.WIDTHS)
    lrs = [space["lr"].sample() for _ in range(200)]
    assert all(1e-4 <= v <= 1e-1 for v in lrs) and min(lrs) < 1e-3 < max(lrs)
    assert space["batch_size"].categories == [2, 4, 8, 16]
    with pytest.raises(ValueError, match="Function"):
        OptunaSearch.convert_search_space(space)
    converted = OptunaSearch.convert_search_space(tuning.optuna_search_space())
    assert set(converted) == {"l1", "l2", "lr", "batch_size"}


def test_bohb_reason_matches_installed_packages():
    import importlib.util

    installed = all(importlib.util.find_spec(p) for p in ("hpbandster", "ConfigSpace"))
    reason = tuning.bohb_unavailable_reason()
    assert (reason is None) == installed
    if reason is not None:
        assert "HpBandSter" in reason or "hpbandster" in reason.lower()


def test_is_loopback():
    for ip in ("127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(ip), ip
    for ip in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "::ffff:10.1.2.3"):
        assert not is_loopback(ip), ip


# ------------------------------------------------------------------------------------------------
# Equal-budget studies
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", tuning.METHODS)
def test_run_study_spends_exactly_the_budget(method):
    trace = run_study(method, budget=16, seed=1, max_t=4)
    assert trace.spent == 16 and len(trace.best_curve) == 16
    assert trace.best_curve == sorted(trace.best_curve)  # best so far never decreases
    assert sum(t.epochs for t in trace.trials) == 16
    assert trace.best == max(a for t in trace.trials for a in t.accuracies)
    if method.endswith("asha"):
        assert all(t.epochs in asha_milestones(4, 1, 2) or t.truncated for t in trace.trials)
    else:
        assert [t.epochs for t in trace.trials] == [4, 4, 4, 4]


def test_grid_visits_its_points_and_asha_explores_more_than_random():
    grid = run_study("grid", budget=24, seed=0, max_t=4)
    assert sorted(tuple(t.config.items()) for t in grid.trials) == sorted(
        tuple(c.items()) for c in grid_design(6, batch_size=32)
    )
    random, asha = (
        run_study("random", budget=24, seed=0, max_t=4),
        run_study("asha", budget=24, seed=0, max_t=4),
    )
    assert len(asha.trials) > len(random.trials) == 6
    assert any(t.pruned for t in asha.trials)
    # same seed, same study
    again = run_study("asha", budget=24, seed=0, max_t=4)
    assert again.best_curve == asha.best_curve
    with pytest.raises(ValueError, match="unknown method"):
        run_study("bohb", budget=8)


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
    assert "epochs to best-1%" in tuning.method_summary(comp)


def test_plots_draw_without_error():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comp = tuning.compare_methods(("random", "asha"), budget=8, seeds=(0,), max_t=4, progress=False)
    axes = tuning.plot_best_vs_epochs(comp)
    assert len(axes) == 2 and len(axes[0].lines) >= 3  # two methods and the target line
    pts = {"grid": np.array([[0.2, 0.2], [0.8, 0.8]]), "random": np.array([[0.1, 0.5], [0.3, 0.9]])}
    axes = tuning.plot_search_layouts(lambda x, y: x + y, pts, important=lambda x: x)
    assert "2 distinct" in axes[0].get_title()
    plt.close("all")


# ------------------------------------------------------------------------------------------------
# Ray: loopback only, the trainable's reports, fault tolerance, and nothing left behind
# ------------------------------------------------------------------------------------------------


def _assert_no_ray_left():
    import ray

    assert not ray.is_initialized()
    assert tuning.ray_processes() == [], [(p.pid, p.name()) for p in tuning.ray_processes()]


def test_local_ray_on_loopback_trainable_reports_faults_restore_and_cleanup_on_error(tmp_path):
    from ray import tune  # imported before local_ray sets its environment: local_ray must cope

    class Boom(Exception):
        pass

    with pytest.raises(Boom), tuning.local_ray(num_cpus=2) as runtime:
        import ray

        # Loopback only: every socket Ray's processes listen on.
        listening = tuning.ray_listening_addresses()
        assert len(runtime.pids) >= 3 and runtime.node_ip == "127.0.0.1"
        assert listening and all(is_loopback(ip) for ip, _, _ in listening), listening

        # Two trials that report every epoch and checkpoint. One crashes once before epoch 2 and is retried
        # from its checkpoint (max_failures=1); the other crashes twice before epoch 3 and errors, which does
        # not stop the experiment. Tuner.restore then resumes it from its checkpoint.
        crash_dir = tmp_path / "crashes"
        crash_dir.mkdir()
        flaky = {**CONFIG, "max_epochs": 4, "checkpoint": True, "crash_dir": str(crash_dir)}
        trainable = tune.with_resources(tuning.train_mlp, {"cpu": 1})
        progress = tuning.epoch_progress(total=8)
        with tuning.quiet_logs():
            crashed = tune.Tuner(
                trainable,
                param_space={**flaky, "crash_at": tune.grid_search([[2], [3, 3]])},
                run_config=tune.RunConfig(
                    name="faults",
                    storage_path=str(tmp_path),
                    verbose=0,
                    callbacks=[progress],
                    failure_config=tune.FailureConfig(max_failures=1),
                ),
            ).fit()
        expected = tuning.train_locally(flaky, 4)
        by_crash = {tuple(r.config["crash_at"]): r for r in crashed}
        assert crashed.num_errors == 1 and len(crashed) == 2
        recovered, errored = by_crash[(2,)], by_crash[(3, 3)]
        df = recovered.metrics_dataframe
        assert recovered.error is None and set(df.columns) >= METRICS
        assert list(df["epoch"]) == [1, 2, 3, 4] == list(df["training_iteration"])
        assert list(df["accuracy"]) == [m["accuracy"] for m in expected]
        assert list(df["loss"]) == [m["loss"] for m in expected]
        assert errored.error is not None
        # The errored trial reported epochs 1 and 2 before crashing; whether the last report is flushed
        # to its result file before Ray records the error is a race, so only a prefix is required.
        errored_epochs = list(errored.metrics_dataframe.get("epoch", []))
        assert errored_epochs == [1, 2][: len(errored_epochs)]
        assert sorted(p.name.split("-", 1)[1] for p in crash_dir.iterdir()) == [
            "epoch2-0",
            "epoch3-0",
            "epoch3-1",
        ]
        table = tuning.results_table(crashed)
        assert sorted(table["status"]) == ["ERROR", "OK"] and max(table["epochs"]) == 4
        assert 4 <= progress.epochs <= 6  # 4 + up to 2 reports reached the driver's callback (see above)

        with tuning.quiet_logs():
            restored = tune.Tuner.restore(
                crashed.experiment_path, trainable=trainable, resume_errored=True
            ).fit()
        assert restored.num_errors == 0
        for r in restored:
            assert list(r.metrics_dataframe["epoch"]) == [1, 2, 3, 4]
            assert list(r.metrics_dataframe["accuracy"]) == [m["accuracy"] for m in expected]
        assert ray.is_initialized()
        raise Boom("an error inside the block must still shut Ray down")
    _assert_no_ray_left()


def test_local_cluster_start_status_task_and_stop():
    import ray

    with tuning.LocalRayCluster(num_cpus=1) as cluster:
        assert "--node-ip-address=127.0.0.1" in cluster.start_command()
        assert "--include-dashboard=false" in cluster.start_command()
        runtime = cluster.connect()
        assert runtime.node_ip == "127.0.0.1" and runtime.address == cluster.address
        listening = tuning.ray_listening_addresses()
        assert listening and all(is_loopback(ip) for ip, _, _ in listening), listening
        assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
        status = cluster.status()
        assert "Active:" in status and "1.0 CPU" in status
        with pytest.raises(RuntimeError, match="already running"):
            cluster.connect()
        assert "ray start --address" in "\n".join(cluster.second_machine_commands("10.0.0.1"))
    _assert_no_ray_left()
    assert not Path(cluster.temp_dir).exists()


def test_cluster_start_failure_is_reported_and_cleaned_up(monkeypatch):
    monkeypatch.setattr(
        tuning, "_ray_cli", lambda: [sys.executable, "-c", "print('no Ray here'); raise SystemExit(3)"]
    )
    cluster = tuning.LocalRayCluster(num_cpus=1)
    with pytest.raises(RuntimeError, match="exited with code 3"):
        cluster.start()
    assert cluster.process is not None and cluster.process.poll() == 3
    _assert_no_ray_left()
    with pytest.raises(RuntimeError, match="not started"):
        tuning.LocalRayCluster().address  # noqa: B018
