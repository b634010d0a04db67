"""The memory tracker counts exact bytes per category on CPU, over many steps."""

import gc

import pytest
import torch

from mgpu_helpers.memory import CATEGORIES, MemoryTracker, estimate_training_memory, format_bytes

LINEAR_BYTES = 1000 * 1000 * 4 + 1000 * 4  # weight + bias, fp32 = 4,004,000 B


def _linear_adam(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(1000, 1000)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def test_linear_adam_exact_bytes_over_several_steps():
    model, opt = _linear_adam()
    tracker = MemoryTracker(model, opt)
    assert tracker.current == {"parameters": LINEAR_BYTES, "gradients": 0, "optimizer": 0, "other": 0}
    after_backward, after_step, after_zero = [], [], []
    with tracker:
        for _ in range(4):
            x = torch.randn(8, 1000)
            loss = model(x).pow(2).mean()
            loss.backward()
            after_backward.append(tracker.mark("backward").bytes)
            opt.step()
            after_step.append(tracker.mark("step").bytes)
            opt.zero_grad(set_to_none=True)
            del x, loss
            after_zero.append(tracker.mark("zero_grad").bytes)
    live_inputs = 8 * 1000 * 4 + 4  # the input batch and the scalar loss, still referenced
    for i, b in enumerate(after_backward):
        assert b["parameters"] == LINEAR_BYTES
        assert b["gradients"] == LINEAR_BYTES
        # Adam's exp_avg + exp_avg_sq (2 × 4,004,000 B) + two 4-byte float32 step counters
        assert b["optimizer"] == (0 if i == 0 else 2 * LINEAR_BYTES + 8)
        assert b["other"] == live_inputs
    for b in after_step:
        assert b == {
            "parameters": LINEAR_BYTES,
            "gradients": LINEAR_BYTES,
            "optimizer": 2 * LINEAR_BYTES + 8,
            "other": live_inputs,
        }
    for b in after_zero:
        assert b == {
            "parameters": LINEAR_BYTES,
            "gradients": 0,
            "optimizer": 2 * LINEAR_BYTES + 8,
            "other": 0,
        }
    tracker.close()


def test_deterministic_timeline_and_peak():
    def run():
        model, opt = _linear_adam()
        tracker = MemoryTracker(model, opt)
        with tracker:
            for _ in range(2):
                model(torch.randn(16, 1000)).sum().backward()
                opt.step()
                opt.zero_grad()
        tracker.close()
        return [s.bytes for s in tracker.timeline], tracker.peak_total, tracker.peak_breakdown

    first, second = run(), run()
    assert first == second
    timeline, peak_total, breakdown = first
    assert peak_total == max(sum(b.values()) for b in timeline)
    assert sum(breakdown.values()) == peak_total
    # At the peak (inside Adam's first step) the optimizer state already counts as optimizer state,
    # because storages are labelled by their final role.
    assert breakdown["optimizer"] == 2 * LINEAR_BYTES + 8
    assert breakdown["parameters"] == LINEAR_BYTES


def test_views_are_counted_once_and_frees_are_seen():
    tracker = MemoryTracker()
    with tracker:
        x = torch.zeros(1000)  # 4,000 B
        views = [x[:10], x.view(10, 100), x[::2]]
        assert tracker.current["other"] == 4000
        del views
        y = x * 2  # a new 4,000 B storage
        assert tracker.current["other"] == 8000
        del x, y
        gc.collect()
        assert tracker.current["other"] == 0
    assert tracker.peak["other"] == 8000
    tracker.close()


def test_preexisting_tensors_are_not_counted_but_lifted_literals_are():
    dataset = torch.randn(10_000, 10)
    tracker = MemoryTracker()
    with tracker:
        batch = dataset[:100]  # a view of data made before tracking: no new allocation
        assert tracker.current_total == 0
        t = torch.tensor([1.0, 2.0, 3.0])  # built outside the dispatcher, then lift_fresh
        assert tracker.current_total == 12
        del batch, t
    tracker.close()


def test_grads_accumulated_in_place_and_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.BatchNorm1d(10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tracker = MemoryTracker(model, opt)
    p_bytes = sum(p.numel() * 4 for p in model.parameters())
    with tracker:
        for _ in range(3):
            model(torch.randn(4, 10)).sum().backward()  # gradients accumulate (no zero_grad)
            opt.step()
        tracker.mark("end")
    assert tracker.current["gradients"] == p_bytes
    assert tracker.current["optimizer"] == p_bytes  # one momentum buffer per parameter
    tracker.close()


def test_estimate_matches_tracker_for_adam_and_sgd():
    model, opt = _linear_adam()
    est = estimate_training_memory(model, opt)
    assert (est.parameters, est.gradients, est.optimizer) == (
        LINEAR_BYTES,
        LINEAR_BYTES,
        2 * LINEAR_BYTES + 8,
    )
    assert est.total == 4 * LINEAR_BYTES + 8
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    assert estimate_training_memory(model, plain).optimizer == 0
    amsgrad = torch.optim.Adam(model.parameters(), amsgrad=True)
    assert estimate_training_memory(model, amsgrad).optimizer == 3 * LINEAR_BYTES + 8
    with pytest.raises(ValueError, match="No memory rule"):
        estimate_training_memory(model, torch.optim.LBFGS(model.parameters()))


def test_matches_torch_mem_tracker_on_one_iteration():
    """Cross-check against PyTorch's own (private) MemTracker where both apply: one iteration."""
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    model, opt = _linear_adam()
    theirs = mem_tracker.MemTracker()
    theirs.track_external(model, opt)
    ours = MemoryTracker(model, opt)
    with theirs, ours:
        model(torch.randn(8, 1000)).sum().backward()
        opt.step()
    snap = theirs.get_tracker_snapshot()[torch.device("cpu")]
    by_name = {k.value if hasattr(k, "value") else str(k): v for k, v in snap.items()}
    assert by_name.get("Parameter") == ours.current["parameters"]
    assert by_name.get("Optstate") == ours.current["optimizer"]
    ours.close()


def test_summary_and_format_bytes():
    model, opt = _linear_adam()
    tracker = MemoryTracker(model, opt)
    text = tracker.summary(estimate_training_memory(model, opt))
    assert "4,004,000 B" in text and "estimate" in text
    assert format_bytes(4_004_000) == "3.82 MiB"
    assert format_bytes(512) == "512 B"
    assert set(tracker.current) == set(CATEGORIES)
    tracker.close()


def test_cuda_cross_check_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the GPU path is exercised in the notebooks")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        MemoryTracker().cuda_cross_check(0)


def test_virtual_devices_attribute_bytes_like_real_ones():
    """Threads inside virtual_device() count as separate devices; ops inherit their inputs' device."""
    import threading

    from mgpu_helpers.memory import virtual_device

    tracker = MemoryTracker()
    results = {}

    def replica(name: str, n: int) -> None:
        with virtual_device(name):  # also switches the tracker on in this thread
            x = torch.ones(n)  # n * 4 bytes on this virtual device
            results[name] = x * 2

    with tracker:
        threads = [threading.Thread(target=replica, args=(f"cuda:{i}", 100 * (i + 1))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # main thread, no scope: outputs inherit the virtual device of their (first) input
        gathered = torch.cat([results["cuda:0"], results["cuda:1"]])
        shifted = results["cuda:1"] + 1
        with virtual_device("cuda:0"):
            on_first = gathered.clone()
    by_dev = {d: sum(c.values()) for d, c in tracker.current_by_device.items()}
    # the x's are freed; results stay (400 B on cuda:0, 800 B on cuda:1); gathered (1200 B) inherits
    # cuda:0, shifted (800 B) cuda:1, and the explicit clone (1200 B) is on cuda:0
    assert by_dev == {"cuda:0": 400 + 1200 + 1200, "cuda:1": 800 + 800}
    assert tracker.peak_by_device["cuda:1"] == 800 + 800
    assert tracker.live_bytes("cuda:1") == 1600
    assert tracker.device_of(shifted) == "cuda:1" and tracker.device_of(gathered[:3]) == "cuda:0"
    assert tracker.device_of(torch.ones(1)) is None  # made outside tracking
    tracker.classify(shifted, "parameters")
    assert tracker.current_by_device["cuda:1"]["parameters"] == 800
    with pytest.raises(ValueError, match="category must be"):
        tracker.classify(shifted, "weights")
    at_peak = tracker.peak_breakdown_by_device
    assert {d: sum(b.values()) for d, b in at_peak.items()} == tracker.peak_by_device
    del on_first, shifted
    tracker.close()


def test_dtensor_counts_its_local_shard():
    """FSDP2 parameters are DTensors: count the shard this rank holds, not the global size."""
    from mgpu_helpers.launcher import launch

    def rank_bytes(rank, world_size):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world_size,))
        full = torch.zeros(8, 100)  # 3,200 B in all
        param = torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
        model = torch.nn.Module()
        model.register_parameter("w", param)
        tracker = MemoryTracker(model)
        return tracker.current["parameters"]

    assert launch(rank_bytes, 2, threads_per_process=1) == [1600, 1600]
