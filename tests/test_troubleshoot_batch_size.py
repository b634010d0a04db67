"""Troubleshooting helpers, the batch-size finder: the search itself, on fake and real training steps."""

import sys

import pytest
import torch

from mgpu_helpers.memory import MemoryTracker, estimate_training_memory
from mgpu_helpers.troubleshoot import (
    BatchSizeSearch,
    TrainingStep,
    find_max_batch_size,
    search_max_batch_size,
)

MiB = 1024**2
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS caps need Linux")


class _OOM:
    """A fake training step that runs out of memory above a known batch size, holding memory as it fails."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[int] = []

    def __call__(self, batch_size: int) -> None:
        self.calls.append(batch_size)
        activations = torch.ones(batch_size, 256)  # alive in this frame when the error is raised
        if batch_size > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {activations.numel()} B")


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "exc", "message"),
    [
        (search_max_batch_size, (lambda b: True, 0), {}, ValueError, r"start must be a batch size >= 1"),
        (search_max_batch_size, (lambda b: True, 8, 4), {}, ValueError, r"max_batch \(4\) must be >= start"),
        (search_max_batch_size, (lambda b: True, "1"), {}, TypeError, r"start must be an int"),
        (search_max_batch_size, (300,), {}, TypeError, r"fits must be a function of the batch size"),
        (find_max_batch_size, (_OOM(5),), {"start": 0}, ValueError, r"start must be a batch size >= 1"),
        (find_max_batch_size, (_OOM(5),), {"start": 8, "max_batch": 4}, ValueError, r"larger max_batch"),
        (find_max_batch_size, (_OOM(5),), {"max_batch": 2.5}, TypeError, r"max_batch must be an int"),
        (find_max_batch_size, (None,), {}, TypeError, r"try_batch must be a function"),
        (find_max_batch_size, (_OOM(5),), {"memory_limit": 0}, ValueError, r"> 0 bytes \(or None"),
        (find_max_batch_size, (_OOM(5),), {"memory_limit": "64MiB"}, TypeError, r"int number of bytes"),
        (find_max_batch_size, (_OOM(5),), {"memory_limit": MiB, "device": "meta"}, ValueError, r"'cpu' or"),
        (find_max_batch_size, (_OOM(5),), {"device": "gpu"}, ValueError, r"not a device; pass 'cpu'"),
        (find_max_batch_size, (_OOM(5),), {"timeout": 0}, ValueError, r"seconds > 0"),
    ],
)
def test_batch_size_search_rejects_bad_input(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


def test_search_grows_then_bisects_on_a_plain_predicate():
    asked: list[int] = []

    def fits(b: int) -> bool:
        asked.append(b)
        return b <= 300

    assert search_max_batch_size(fits) == (300, 301)
    assert asked == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 384, 320, 288, 304, 296, 300, 302, 301]
    assert search_max_batch_size(lambda b: True, 3, 40) == (40, None)  # everything fits: stops at max
    assert search_max_batch_size(lambda b: False, 4) == (0, 4)  # not even start fits


def test_finder_grows_then_binary_searches_to_the_exact_limit():
    step = _OOM(300)
    result = find_max_batch_size(step)
    assert isinstance(result, BatchSizeSearch)
    assert (result.largest, result.first_failure) == (300, 301)
    assert step.calls[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]  # doubling until the first OOM
    assert step.calls[10:] == [384, 320, 288, 304, 296, 300, 302, 301]  # then bisection of (256, 512)
    assert [p.fits for p in result.probes] == [b <= 300 for b in step.calls]
    assert [p.error is None for p in result.probes] == [p.fits for p in result.probes]
    assert "OOM" in result.table() and len(result.table().splitlines()) == 1 + len(step.calls)


def test_finder_edge_cases():
    everything = find_max_batch_size(_OOM(10**9), max_batch=100)
    assert (everything.largest, everything.first_failure) == (100, None)
    nothing = find_max_batch_size(_OOM(0), start=4)
    assert (nothing.largest, nothing.first_failure, len(nothing.probes)) == (0, 4, 1)


def test_finder_propagates_errors_that_are_not_oom():
    def broken(batch_size):
        raise ValueError("shape mismatch, not memory")

    with pytest.raises(ValueError, match="shape mismatch"):
        find_max_batch_size(broken)


def test_finder_leaves_no_tensor_of_a_failed_probe_alive():
    tracker = MemoryTracker()
    with tracker:
        result = find_max_batch_size(_OOM(20))
    assert result.largest == 20
    assert tracker.peak_total >= 21 * 256 * 4  # the failing probes really allocated
    assert tracker.current_total == 0  # ... and nothing of them survived the search


def test_search_plot_draws_every_probe():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = find_max_batch_size(_OOM(20))
    ax = result.plot()
    assert len(ax.collections) >= len(result.probes)  # one marker per probe (+ legend handles)
    plt.close(ax.figure)


@linux_only
def test_finder_under_a_real_memory_limit_matches_the_formula():
    """A model with a known memory law: peak ≈ params + grads + Adam (formula) + 3 logits per sample."""
    step = TrainingStep()
    limit = 64 * MiB
    model, optimizer = step.build()
    static = estimate_training_memory(model, optimizer).total
    per_sample = 3 * step.vocab_size * 4  # logits' log-softmax, its gradient and the logits' gradient
    predicted = (limit - static) // per_sample
    result = find_max_batch_size(step, start=64, memory_limit=limit, timeout=240)
    assert result.where.startswith("CPU child") and result.memory_limit == limit
    assert result.first_failure == result.largest + 1
    assert 0.8 * predicted <= result.largest <= predicted, (result.largest, predicted)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_finder_under_a_cuda_cap_converges_and_leaves_memory_clean():
    step = TrainingStep(device="cuda:0")
    before = torch.cuda.memory_allocated(0)
    result = find_max_batch_size(step, start=16, memory_limit=64 * MiB, device="cuda:0")
    assert result.where.startswith("cuda:0, capped") and result.first_failure == result.largest + 1
    assert result.largest > 0 and torch.cuda.memory_allocated(0) == before
