"""Loader sweeps (mgpu_helpers.data_parallel.loaders): the right counts, every setting, no worker left behind.

Throughput relations (two workers overlap waiting) are timing claims and are not asserted here.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from mgpu_helpers.data_parallel import (
    LoaderResult,
    SlowDataset,
    format_sweep,
    measure_loader,
    plot_sweep,
    rule_of_thumb_workers,
    sweep_loaders,
)

HAS_CUDA = torch.cuda.is_available()


def test_dataset_items_are_deterministic_normalised_images():
    ds = SlowDataset(8, image_size=6, channels=2, io_ms=0, cpu_passes=2, seed=3)
    x, y = ds[5]
    assert x.shape == (2, 6, 6) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, ds[5][0]) and len(ds) == 8
    assert not torch.equal(ds[4][0], ds[5][0])


def _consistent(r: LoaderResult, batches: int, batch_size: int) -> None:
    assert (r.batches, r.samples) == (batches, batches * batch_size)  # the warm-up batch is not counted
    assert r.startup_s >= 0 and r.steady_s >= 0
    if r.steady_s > 0:
        assert r.samples_per_s == pytest.approx(r.samples / r.steady_s)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_measure_counts_steady_batches_and_workers_exit(num_workers):
    # with workers, no worker process may outlive the loop (the autouse fixture in conftest.py checks)
    ds = SlowDataset(40, image_size=4, io_ms=0.5 if num_workers else 0)
    r = measure_loader(ds, batch_size=8, num_workers=num_workers, n_batches=3)
    assert (r.num_workers, r.pin_memory) == (num_workers, False)
    _consistent(r, 3, 8)
    with pytest.raises(ValueError, match="need 40"):
        measure_loader(SlowDataset(39, image_size=4, io_ms=0), batch_size=8, n_batches=4)


def test_sweep_covers_every_setting_once():
    ds = SlowDataset(48, image_size=4, io_ms=0)
    results = sweep_loaders(ds, workers=(0, 1, 1), batch_size=8, n_batches=2, progress=False)
    expected_pins = (False, True) if HAS_CUDA else (False,)
    assert [(r.num_workers, r.pin_memory) for r in results] == [(w, p) for p in expected_pins for w in (0, 1)]
    for r in results:
        _consistent(r, 2, 8)
    table = format_sweep(results)
    assert table.splitlines()[0].split() == ["num_workers", "pin_memory", "first", "batch", "samples/s"]
    assert len(table.splitlines()) == 1 + len(results)


def test_rule_of_thumb_and_plot():
    assert rule_of_thumb_workers(0) == 4 and rule_of_thumb_workers(1) == 4 and rule_of_thumb_workers(2) == 8
    rows = [LoaderResult(w, False, 2, 16, 0.1, 0.1 * (w + 1)) for w in (0, 1, 2)]
    ax = plot_sweep({"waits": rows}, note="measured")
    assert len(ax.lines) == 1 and list(ax.lines[0].get_xdata()) == [0, 1, 2]
    assert ax.lines[0].get_ydata()[0] == pytest.approx(160.0)
    plt.close("all")


_DS = SlowDataset(16, image_size=2, io_ms=0)
_ONE = {"batch_size": 4, "n_batches": 1}
_ROW = LoaderResult(0, False, 1, 8, 0.0, 0.1)
_NO_GPU = (
    []
    if HAS_CUDA
    else [
        (measure_loader, (_DS,), {**_ONE, "pin_memory": True}, ValueError, "needs a GPU"),
        (measure_loader, (_DS,), {**_ONE, "device": "cuda"}, ValueError, "none is visible"),
        (sweep_loaders, (_DS,), {"workers": (0,), "pin_memory": (True,)}, ValueError, "needs a GPU"),
    ]
)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    [
        (SlowDataset, (0,), {}, ValueError, "n_items must be >= 1"),
        (SlowDataset, (4,), {"io_ms": -1}, ValueError, "milliseconds >= 0"),
        (SlowDataset, (4,), {"io_ms": "2"}, ValueError, "milliseconds >= 0"),
        (SlowDataset, (4,), {"cpu_passes": -1}, ValueError, "cpu_passes must be >= 0"),
        (SlowDataset, (4, 0), {}, ValueError, "image_size must be >= 1"),
        (SlowDataset, (4.5,), {}, TypeError, "n_items must be a whole number"),
        (measure_loader, ([1, 2, 3],), {}, TypeError, "torch Dataset"),
        (measure_loader, (_DS,), {"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        (measure_loader, (_DS,), {"num_workers": -1}, ValueError, "0 loads in the main process"),
        (measure_loader, (_DS,), {"num_workers": "2"}, TypeError, "num_workers must be a whole number"),
        (measure_loader, (_DS,), {"n_batches": 0}, ValueError, "n_batches must be >= 1"),
        (measure_loader, (_DS,), {**_ONE, "device": "bogus"}, ValueError, "'cuda:0'"),
        (measure_loader, (_DS,), {**_ONE, "pin_memory": 1}, TypeError, "True or False"),
        (sweep_loaders, (_DS,), {"workers": ()}, ValueError, "non-empty list of num_workers"),
        (sweep_loaders, (_DS,), {"workers": (0, -2)}, ValueError, "num_workers in workers must be >= 0"),
        (sweep_loaders, (_DS,), {"workers": (0,), "pin_memory": ()}, ValueError, "True/False"),
        (sweep_loaders, (_DS,), {"workers": (0,), "batch_size": -1}, ValueError, "batch_size must be >= 1"),
        (sweep_loaders, (_DS,), {"workers": (0,), "progress": "no"}, TypeError, "True or False"),
        (rule_of_thumb_workers, (-1,), {}, ValueError, "n_gpus must be >= 0"),
        (rule_of_thumb_workers, ("2",), {}, TypeError, "n_gpus must be a whole number"),
        (format_sweep, ([],), {}, TypeError, "non-empty list of LoaderResult"),
        (format_sweep, ([1, 2],), {}, TypeError, "only LoaderResult"),
        (plot_sweep, ([_ROW],), {}, TypeError, "non-empty dict"),
        (plot_sweep, ({"a": []},), {}, TypeError, "non-empty list of LoaderResult"),
        (plot_sweep, ({"a": [_ROW]},), {"ax": "axes"}, TypeError, "matplotlib Axes"),
        (LoaderResult, (-1, False, 1, 8, 0.0, 0.1), {}, ValueError, "num_workers must be >= 0"),
        (LoaderResult, (0, False, 1, 8, -1.0, 0.1), {}, ValueError, "seconds >= 0"),
        *_NO_GPU,
    ],
)
def test_loaders_reject_bad_input(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)
