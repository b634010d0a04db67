"""The memory tracker counts exact bytes per category on CPU, over many steps; the analytic estimate from a
real model gives the same bytes; bad arguments are refused with a message that says what to pass."""

import gc
import subprocess
import sys
import threading

import pytest
import torch

from mgpu_helpers.memory import (
    CATEGORIES,
    MemoryTracker,
    estimate_training_memory,
    format_bytes,
    virtual_device,
)

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
    assert est.activations is None and "other" not in est.as_dict()
    assert est.n_params == 1000 * 1000 + 1000 and any("Adam" in note for note in est.notes)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    assert estimate_training_memory(model, plain).optimizer == 0
    amsgrad = torch.optim.Adam(model.parameters(), amsgrad=True)
    assert estimate_training_memory(model, amsgrad).optimizer == 3 * LINEAR_BYTES + 8
    assert estimate_training_memory(model).optimizer == 0


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.Adam(p),
        lambda p: torch.optim.AdamW(p, amsgrad=True),
        lambda p: torch.optim.NAdam(p),
        lambda p: torch.optim.RAdam(p),
        lambda p: torch.optim.Adamax(p),
        lambda p: torch.optim.SGD(p, lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.RMSprop(p),
        lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True),
        lambda p: torch.optim.Adagrad(p),
        lambda p: torch.optim.Adadelta(p),
        lambda p: torch.optim.Rprop(p),
        lambda p: torch.optim.ASGD(p),
    ],
    ids=[
        "Adam",
        "AdamW-amsgrad",
        "NAdam",
        "RAdam",
        "Adamax",
        "SGD",
        "SGD-momentum",
        "RMSprop",
        "RMSprop-momentum-centered",
        "Adagrad",
        "Adadelta",
        "Rprop",
        "ASGD",
    ],
)
def test_every_optimizer_rule_equals_the_state_after_one_step(make):
    """The rule for each optimizer gives the bytes its state really takes (frozen parameters get none)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    model[1].bias.requires_grad_(False)
    opt = make(model.parameters())
    est = estimate_training_memory(model, opt)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    assert est.optimizer == _state_bytes(opt)
    assert est.parameters == sum(p.numel() * 4 for p in model.parameters())
    assert est.gradients == sum(p.grad.numel() * 4 for p in model.parameters() if p.grad is not None)


def test_estimate_follows_the_dtype_and_works_on_meta():
    model = torch.nn.Linear(100, 10).to(torch.bfloat16)
    est = estimate_training_memory(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert (est.parameters, est.gradients, est.optimizer) == (2020, 2020, 2020)
    with torch.device("meta"):  # shapes only: nothing allocated, the bytes are still known
        big = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)])
    need = estimate_training_memory(big, torch.optim.Adam(big.parameters()))
    assert need.total == 16 * need.n_params + 8 * 4


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
    other = next(line for line in text.splitlines() if line.startswith("activations & other"))
    assert other.split()[-1] == "-"  # the formula has no activations
    assert format_bytes(4_004_000) == "3.82 MiB"
    assert format_bytes(512) == "512 B"
    assert set(tracker.current) == set(CATEGORIES)
    tracker.close()


def test_cuda_cross_check_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the GPU path is exercised in the notebooks")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        MemoryTracker().cuda_cross_check(0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_cross_check_agrees_with_the_caching_allocator():
    device = torch.device("cuda:0")
    baseline = torch.cuda.memory_allocated(device)
    tracker = MemoryTracker()
    with tracker:
        x = torch.ones(1000, device=device)  # 4,000 B: one 4,096 B block
        y = x * 2 + 1  # the temporary x * 2 is freed; y stays
    check = tracker.cuda_cross_check(device, baseline)
    assert check == {"tracked_bytes": 2 * 4096, "cuda_allocated_bytes": 2 * 4096, "difference": 0}
    del x, y
    tracker.close()


def test_virtual_devices_attribute_bytes_like_real_ones():
    """Threads inside virtual_device() count as separate devices; ops inherit their inputs' device."""
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
    from mgpu_helpers.launching import launch

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

    assert launch(rank_bytes, 2, backend="gloo", threads_per_process=1) == [1600, 1600]


def test_importing_memory_imports_neither_matplotlib_nor_ipywidgets():
    code = (
        "import sys, mgpu_helpers.memory as m; m.MemoryWidget, m.plot_memory_timeline; "
        "print(sorted(k for k in ('matplotlib', 'ipywidgets') if k in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


_MODEL = torch.nn.Linear(2, 2)
_OTHER = torch.nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("call", "args", "kwargs", "exc", "match"),
    [
        (MemoryTracker, ("model",), {}, TypeError, r"model must be a torch.nn.Module .* not str"),
        (MemoryTracker, (_MODEL, "adam"), {}, TypeError, r"optimizer must be a torch.optim.Optimizer"),
        (MemoryTracker().track, (None, _MODEL), {}, TypeError, r"optimizer must be .*, not Linear"),
        (MemoryTracker().mark, (3,), {}, TypeError, r"mark needs a text label such as 'step 3'"),
        (MemoryTracker().mark, ("",), {}, ValueError, r"non-empty label"),
        (MemoryTracker().classify, ([1.0], "parameters"), {}, TypeError, r"classify needs a torch.Tensor"),
        (MemoryTracker().classify, (torch.ones(1), "weights"), {}, ValueError, r"category must be one of"),
        (MemoryTracker().device_of, ("x",), {}, TypeError, r"device_of needs a torch.Tensor"),
        (MemoryTracker().live_bytes, (0,), {}, TypeError, r"device must be a name such as 'cuda:0'"),
        (
            MemoryTracker().live_bytes,
            (),
            {"cuda_rounding": 1},
            TypeError,
            r"cuda_rounding must be True or False",
        ),
        (MemoryTracker().cuda_cross_check, (1.5,), {}, TypeError, r"device must be a CUDA index"),
        (MemoryTracker().cuda_cross_check, (0, "big"), {}, TypeError, r"baseline must be a byte count"),
        (MemoryTracker().summary, ("estimate",), {}, TypeError, r"estimate must be a MemoryPrediction"),
        (MemoryTracker().plot, (), {"unit": "MB"}, ValueError, r"unit must be one of"),
        (format_bytes, ("x",), {}, TypeError, r"format_bytes needs a number of bytes such as 4_004_000"),
        (format_bytes, (True,), {}, TypeError, r"format_bytes needs a number"),
        (format_bytes, (float("nan"),), {}, ValueError, r"finite"),
        (virtual_device, ("",), {}, ValueError, r"non-empty device name such as 'cuda:1'"),
        (virtual_device, (1,), {}, TypeError, r"device name such as 'cuda:1', not 1"),
        (estimate_training_memory, ("model",), {}, TypeError, r"model must be a torch.nn.Module"),
        (
            estimate_training_memory,
            (_MODEL, "adam"),
            {},
            TypeError,
            r"torch.optim.Adam\(model.parameters\(\)\)",
        ),
        (estimate_training_memory, (torch.nn.ReLU(),), {}, ValueError, r"has no parameters"),
        (
            estimate_training_memory,
            (_MODEL, torch.optim.Adam(_OTHER.parameters())),
            {},
            ValueError,
            r"not this model's: pass the optimizer built from model.parameters\(\)",
        ),
        (
            estimate_training_memory,
            (_MODEL, torch.optim.LBFGS(_MODEL.parameters())),
            {},
            ValueError,
            r"No memory rule for optimizer LBFGS\. Known: Adam.*MemoryTracker",
        ),
    ],
)
def test_bad_arguments_are_refused_with_a_fix(call, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(*args, **kwargs)
