"""Loader sweeps: the right number of samples, workers that overlap waiting, no worker left behind."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from mgpu_helpers.dataloading import (
    LoaderResult,
    SlowDataset,
    format_sweep,
    measure_loader,
    plot_sweep,
    rule_of_thumb_workers,
    sweep_loaders,
)


def test_dataset_items_are_deterministic_normalised_images():
    ds = SlowDataset(8, image_size=6, channels=2, io_ms=0, cpu_passes=2, seed=3)
    x, y = ds[5]
    assert x.shape == (2, 6, 6) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, ds[5][0]) and len(ds) == 8
    assert not torch.equal(ds[4][0], ds[5][0])
    with pytest.raises(ValueError, match=">= 0"):
        SlowDataset(4, io_ms=-1)


def test_measure_counts_steady_batches_only():
    ds = SlowDataset(40, image_size=4, io_ms=0)
    r = measure_loader(ds, batch_size=8, num_workers=0, n_batches=3)
    assert (r.batches, r.samples) == (3, 24)  # one warm-up batch is not counted
    assert r.startup_s > 0 and r.steady_s > 0 and r.samples_per_s > 0
    with pytest.raises(ValueError, match="need 40"):
        measure_loader(SlowDataset(39, image_size=4, io_ms=0), batch_size=8, n_batches=4)


def test_workers_overlap_waiting_and_exit():
    """Two workers wait for storage at the same time: close to twice the items per second."""
    ds = SlowDataset(96, image_size=4, io_ms=8.0)
    serial = measure_loader(ds, batch_size=8, num_workers=0, n_batches=5)
    two = measure_loader(ds, batch_size=8, num_workers=2, n_batches=5)
    assert two.samples_per_s > 1.4 * serial.samples_per_s, (serial, two)
    # no worker process may outlive the loop (the autouse fixture in conftest.py checks this too)


def test_sweep_covers_every_setting_and_refuses_pinning_without_gpu():
    ds = SlowDataset(48, image_size=4, io_ms=0)
    results = sweep_loaders(ds, workers=(0, 1), batch_size=8, n_batches=2, progress=False)
    expected_pins = {False, True} if torch.cuda.is_available() else {False}
    assert {(r.num_workers, r.pin_memory) for r in results} == {(w, p) for w in (0, 1) for p in expected_pins}
    table = format_sweep(results)
    assert table.splitlines()[0].split() == ["num_workers", "pin_memory", "first", "batch", "samples/s"]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a GPU"):
            sweep_loaders(ds, workers=(0,), pin_memory=(True,), progress=False)


def test_rule_of_thumb_and_plot():
    assert rule_of_thumb_workers(0) == 4 and rule_of_thumb_workers(2) == 8
    with pytest.raises(ValueError):
        rule_of_thumb_workers(-1)
    rows = [LoaderResult(w, False, 2, 16, 0.1, 0.1 * (w + 1)) for w in (0, 1, 2)]
    ax = plot_sweep({"waits": rows}, note="measured")
    assert len(ax.lines) == 1 and list(ax.lines[0].get_xdata()) == [0, 1, 2]
    assert ax.lines[0].get_ydata()[0] == pytest.approx(160.0)
    plt.close("all")
