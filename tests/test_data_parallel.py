"""mgpu_helpers.data_parallel: the real DataParallel's splits, values and gradients; bytes where expected."""

import threading

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from mgpu_helpers import data_parallel as dp
from mgpu_helpers.data_parallel import comm
from mgpu_helpers.memory import MemoryTracker, virtual_device
from mgpu_helpers.models import LargeOutputModel, TinyRNN

F64 = {"rtol": 1e-12, "atol": 1e-12}


def _tracked(model: nn.Module, device: str = "vcuda:0", optimizer=None) -> MemoryTracker:
    """A tracker that counts the model's parameters (and gradients) on ``device``."""
    with virtual_device(device):
        return MemoryTracker(model, optimizer)


@pytest.mark.parametrize(("length", "n"), [(30, 2), (10, 2), (10, 4), (5, 4), (7, 3), (1, 2), (64, 4)])
def test_chunk_sizes_follow_torch_chunk(length, n):
    expected = [len(c) for c in torch.arange(length).chunk(n)]
    assert dp.chunk_sizes(length, n) == expected
    assert [len(c) for c in dp.scatter(torch.arange(length), list(range(n)))] == expected


def test_scatter_splits_structures_and_repeats_non_tensors():
    x, y = torch.arange(12).view(6, 2), torch.arange(6)
    parts = dp.scatter((x, y, "tag"), [0, 1, 2])
    assert len(parts) == 3 and all(p[2] == "tag" for p in parts)
    assert [p[0].shape[0] for p in parts] == [2, 2, 2]
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    dicts = dp.scatter({"a": x}, [0, 1])
    assert [d["a"].shape for d in dicts] == [torch.Size([3, 2])] * 2
    on_dim1 = dp.scatter(torch.zeros(4, 6, 3), [0, 1], dim=1)
    assert [t.shape for t in on_dim1] == [torch.Size([4, 3, 3])] * 2
    inputs, kwargs = dp.scatter_kwargs((x,), {"mask": y}, [0, 1])
    assert len(inputs) == len(kwargs) == 2 and kwargs[1]["mask"].tolist() == [3, 4, 5]


def test_torch_parallel_functions_refuse_cpu_tensors():
    """Why this module exists: on a CPU the real functions cannot be watched."""
    if torch.cuda.is_available():
        pytest.skip("the refusal is CPU-only")
    m, x = nn.Linear(3, 2), torch.randn(4, 3)
    with pytest.raises(ValueError, match="non cpu"):
        torch.nn.parallel.replicate(m, ["cpu", "cpu"])
    with pytest.raises(AssertionError, match="CPU"):
        torch.nn.parallel.gather([x, x], "cpu")
    dp = nn.DataParallel(m)
    assert dp.device_ids == [] and torch.equal(dp(x), m(x))  # a pass-through


@pytest.mark.parametrize(
    ("batch", "devices"), [(30, [0, 1]), (25, [0, 1, 2]), (10, [0, 2]), (3, [0, 1, 2, 3])]
)
def test_outputs_and_gradients_equal_the_unsplit_model(batch, devices):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    x, y = torch.randn(batch, 5, dtype=torch.float64), torch.randint(0, 3, (batch,))
    nn.functional.cross_entropy(model(x), y).backward()
    expected_out = model(x).detach()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    out = dp.VirtualDataParallel(model, device_ids=devices)(x)
    torch.testing.assert_close(out, expected_out, **F64)
    nn.functional.cross_entropy(out, y).backward()
    for p, g in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g, **F64)


def test_dim1_splits_the_batch_of_batch_second_input_and_gathers_on_dim1():
    torch.manual_seed(0)
    rnn = TinyRNN(n_features=4, hidden=8, n_classes=3).double()
    x = torch.randn(7, 6, 4, dtype=torch.float64)  # (time, batch, features)
    seen = []
    rnn.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    out = dp.VirtualDataParallel(rnn, [0, 1], dim=1)(x)
    assert sorted(seen[-2:]) == [(7, 3, 4), (7, 3, 4)]  # every replica got all time steps, half the batch
    assert out.shape == (3, 6)  # TinyRNN returns (batch, classes): gathering on dim 1 glues classes together
    unsplit = rnn(x)
    torch.testing.assert_close(torch.cat(out.split(3, dim=1), dim=0), unsplit, **F64)


def test_parallel_apply_uses_one_thread_per_replica_and_names_failures():
    seen = {}

    def probe(x):
        seen[dp.current_device()] = (threading.current_thread().name, torch.is_grad_enabled())
        return x * 2

    timings = []
    with torch.no_grad():
        outs = dp.parallel_apply(
            [probe, probe], [torch.ones(2), torch.ones(3)], devices=[0, 1], timings=timings
        )
    assert [o.tolist() for o in outs] == [[2.0, 2.0], [2.0, 2.0, 2.0]]
    assert seen == {"vcuda:0": ("replica-0", False), "vcuda:1": ("replica-1", False)}
    assert sorted(t["device"] for t in timings) == ["vcuda:0", "vcuda:1"]
    assert all(t["end"] >= t["start"] for t in timings)

    def broken(x):
        raise KeyError("boom")

    with pytest.raises(RuntimeError, match="replica 1 on vcuda:1 raised KeyError") as info:
        dp.parallel_apply([probe, broken], [torch.ones(1), torch.ones(1)], devices=[0, 1])
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(ValueError, match="2 modules but 1 inputs"):
        dp.parallel_apply([probe, probe], [torch.ones(1)])


def test_replicas_share_storage_on_the_source_device_and_copy_elsewhere():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    tracker = _tracked(model)
    with tracker:
        r0, r1 = dp.replicate(model, [0, 1])
    tracker.close()
    w = model[0].weight
    assert r0[0].weight.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert r1[0].weight.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    assert torch.equal(r1[0].weight, w) and r1[0].weight.requires_grad and not r1[0].weight.is_leaf
    assert list(r1.parameters()) == []  # replica weights are plain attributes, as in torch
    assert (
        r0[1].running_mean.untyped_storage().data_ptr() == model[1].running_mean.untyped_storage().data_ptr()
    )
    with torch.no_grad():
        (detached,) = dp.replicate(model, [1], detach=True)
    assert not detached[0].weight.requires_grad


def test_accounted_bytes_for_a_known_model():
    """Linear(4, 1000), batch 10 on two devices, no gradients: every byte is predictable."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1000)
    params = (4 * 1000 + 1000) * 4  # 20,000 B
    x_bytes, chunk_in, chunk_out, gathered = 10 * 4 * 4, 5 * 4 * 4, 5 * 1000 * 4, 10 * 1000 * 4

    for output_device in (0, 1):
        tracker = _tracked(model)
        with tracker, torch.no_grad():
            x = dp.to_device(torch.randn(10, 4), 0)
            out = dp.VirtualDataParallel(model, [0, 1], output_device=output_device)(x)
        tracker.close()
        peaks = tracker.peak_breakdown_by_device
        assert {d: sum(v.values()) for d, v in peaks.items()} == tracker.peak_by_device
        # device 0: parameters, the batch, replica 0's output chunk (its input chunk is a view)
        # device 1: a copy of the parameters, its input chunk, its output chunk
        # plus, on the output device, the gathered output
        expected0 = params + x_bytes + chunk_out + (gathered if output_device == 0 else 0)
        expected1 = params + chunk_in + chunk_out + (gathered if output_device == 1 else 0)
        assert peaks["vcuda:0"] == {
            "parameters": params,
            "gradients": 0,
            "optimizer": 0,
            "other": expected0 - params,
        }
        assert peaks["vcuda:1"] == {
            "parameters": params,
            "gradients": 0,
            "optimizer": 0,
            "other": expected1 - params,
        }
        assert dp.virtual_device_of(out) is None  # the tracker has stopped: nothing is known any more
        live = tracker.current_by_device
        assert live[f"vcuda:{output_device}"]["other"] >= gathered  # the gathered output is still alive


def _train_step(model, x, y, setup, devices=(0, 1, 2, 3)):
    """One SGD step of a DataParallel setup under a tracker; returns (loss, grads, per-device peaks)."""
    model.zero_grad(set_to_none=True)
    tracker = _tracked(model)
    loss_fn = nn.CrossEntropyLoss()
    with tracker:
        xb, yb = dp.to_device(x, 0), dp.to_device(y, 0)
        if setup == "gather on 0":
            loss = loss_fn(dp.VirtualDataParallel(model, devices)(xb), yb)
        elif setup == "gather on 1":
            out = dp.VirtualDataParallel(model, devices, output_device=1)(xb)
            loss = loss_fn(out, dp.to_device(yb, 1))
            del out  # as in the other setups, only the loss keeps the outputs alive
        else:
            outs = dp.VirtualDataParallelModel(model, devices)(xb)
            assert isinstance(outs, list) and len(outs) == len(devices)
            loss = dp.DataParallelCriterion(loss_fn, devices)(outs, yb)
        loss.backward()
    tracker.close()
    grads = [p.grad.clone() for p in model.parameters()]
    return loss.detach(), grads, {d: sum(v.values()) for d, v in tracker.peak_breakdown_by_device.items()}


def test_parallel_criterion_keeps_loss_and_gradients_and_cuts_the_first_device_peak():
    torch.manual_seed(0)
    model = LargeOutputModel(in_features=16, hidden=8, vocab_size=4000).double()
    x, y = torch.randn(198, 16, dtype=torch.float64), torch.randint(0, 4000, (198,))  # chunks 50, 50, 50, 48
    results = {s: _train_step(model, x, y, s) for s in ("gather on 0", "gather on 1", "criterion")}
    base_loss, base_grads, base_peaks = results["gather on 0"]
    unsplit = nn.functional.cross_entropy(model(x), y)
    torch.testing.assert_close(base_loss, unsplit.detach(), **F64)
    for setup in ("gather on 1", "criterion"):
        loss, grads, _ = results[setup]
        torch.testing.assert_close(loss, base_loss, **F64)
        for g, g0 in zip(grads, base_grads, strict=True):
            torch.testing.assert_close(g, g0, **F64)

    logits = 198 * 4000 * 8  # the full batch's logits in float64
    first, others = base_peaks["vcuda:0"], max(base_peaks[f"vcuda:{i}"] for i in (1, 2, 3))
    assert first - others > 2 * logits  # gathered logits, the loss's softmax and its gradient sit on device 0
    moved = results["gather on 1"][2]
    assert moved["vcuda:1"] > moved["vcuda:0"]  # output_device=1 moves the peak ...
    assert moved["vcuda:1"] > 0.95 * first  # ... without making it smaller
    fixed = results["criterion"][2]
    assert fixed["vcuda:0"] < 0.4 * first  # the parallel criterion removes it: every device holds its
    assert max(fixed.values()) - min(fixed.values()) < logits / 8  # own quarter, the devices are balanced


def test_criterion_gathers_only_scalars_and_rejects_gathered_outputs():
    outs = [torch.randn(3, 5), torch.randn(2, 5)]
    target = torch.randint(0, 5, (5,))
    crit = dp.DataParallelCriterion(nn.CrossEntropyLoss(), [0, 1])
    loss = crit(outs, target)
    torch.testing.assert_close(loss, nn.functional.cross_entropy(torch.cat(outs), target))
    summed = dp.DataParallelCriterion(nn.CrossEntropyLoss(reduction="sum"), [0, 1], reduction="sum")
    torch.testing.assert_close(
        summed(outs, target), nn.functional.cross_entropy(torch.cat(outs), target, reduction="sum")
    )
    with pytest.raises(TypeError, match="one output per device"):
        crit(torch.cat(outs), target)
    as_function = dp.DataParallelCriterion(nn.functional.cross_entropy, [0, 1])
    torch.testing.assert_close(as_function(outs, target), loss)


def test_gather_of_scalars_gives_a_vector_for_loss_mean_backward():
    """A model that returns its own loss: DataParallel gathers one scalar per device -> loss.mean()."""
    w = torch.ones(3, requires_grad=True)
    losses = dp.parallel_apply([lambda x: (x * w).sum()] * 2, [torch.ones(3), 2 * torch.ones(3)])
    gathered = dp.gather(losses, 0)
    assert gathered.shape == (2,)
    gathered.mean().backward()
    assert w.grad.tolist() == [1.5, 1.5, 1.5]


def test_module_on_the_wrong_device_is_refused_with_advice():
    model = nn.Linear(2, 2)
    tracker = MemoryTracker(model)  # parameters registered on "cpu", not on vcuda:0
    with tracker, pytest.raises(RuntimeError, match=r"device_ids\[0\]"):
        dp.VirtualDataParallel(model)(torch.randn(4, 2))
    tracker.close()
    with pytest.raises(ValueError, match="distinct"):
        dp.VirtualDataParallel(model, [0, 0])
    with pytest.raises(TypeError):
        dp.device_name(1.5)


def test_to_device_is_a_no_op_on_the_same_device():
    tracker = MemoryTracker()
    with tracker:
        x = dp.to_device(torch.ones(4), 0)
        assert dp.virtual_device_of(x) == "vcuda:0"
        assert dp.to_device(x, "vcuda:0") is x
        y = dp.to_device(x, 1)
        assert dp.virtual_device_of(y) == "vcuda:1" and y is not x
    tracker.close()
    assert dp.to_device(torch.ones(1), "cpu").device.type == "cpu"


def test_phase_timer_and_plots():
    timer = dp.PhaseTimer()
    with timer("scatter"):
        pass
    timer.add_threads([{"replica": 0, "device": "vcuda:0", "thread": "replica-0", "start": 0.0, "end": 1.0}])
    assert [r[0] for r in timer.rows] == ["scatter", "forward"]
    ax = dp.plot_phases(timer.rows)
    assert len(ax.patches) == 2
    ax = dp.plot_peak_comparison({"a": {"vcuda:0": 2**20, "vcuda:1": 0}, "b": {"vcuda:0": 1, "vcuda:1": 2}})
    assert len(ax.patches) == 4 and ax.patches[0].get_height() == pytest.approx(1.0)
    fig = dp.draw_data_parallel_flow(3)
    assert any("gather outputs" in t.get_text() for t in fig.axes[0].texts)
    plt.close("all")


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.mark.gpu
@TWO_GPUS
def test_equals_real_data_parallel_on_two_gpus():  # pragma: no cover - GPU only
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double().cuda()
    x, y = torch.randn(25, 5, dtype=torch.float64, device="cuda"), torch.randint(0, 3, (25,), device="cuda")
    real = nn.DataParallel(model, device_ids=[0, 1])(x)
    nn.functional.cross_entropy(real, y).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    virtual = dp.VirtualDataParallel(model, [0, 1])(x)
    torch.testing.assert_close(virtual, real.detach(), **F64)
    nn.functional.cross_entropy(virtual, y).backward()
    for p, g in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g, **F64)


def test_backend_runs_the_same_code_on_virtual_devices():
    b = dp.backend(min_gpus=10_000)  # never enough GPUs: always virtual
    assert not b.real and b.kind == "virtual devices" and b.parallel is comm
    assert b.DataParallel is dp.VirtualDataParallel and b.device(1) == "vcuda:1"
    torch.manual_seed(0)
    model = nn.Linear(4, 1000)

    def step():
        with torch.no_grad():
            out = b.DataParallel(model, [0, 1])(b.to(torch.randn(10, 4), 0))
            return b.where(out)

    peaks, where = b.step_peaks(step, model, 2)
    assert where == "vcuda:0"
    params = (4 * 1000 + 1000) * 4
    assert peaks == {"vcuda:0": params + 160 + 20_000 + 40_000, "vcuda:1": params + 80 + 20_000}
    assert b.last_breakdown["vcuda:1"]["parameters"] == params  # the replica's weights count as parameters
    assert b.where(torch.ones(1)) == "?"  # no tracker running: nothing is known


def test_backend_real_branch_reads_the_cuda_counters(monkeypatch):
    """The GPU branch of step_peaks, with CUDA's counters replaced by a fake allocator."""
    allocated = {0: 1000, 1: 0}
    peak = dict(allocated)

    def alloc(device, nbytes):
        allocated[device] += nbytes
        peak[device] = max(peak[device], allocated[device])

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: peak.__setitem__(d, allocated[d]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: allocated[d])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: peak[d])

    def step():
        alloc(0, 500)
        alloc(1, 300)
        alloc(0, -500)
        return "done"

    model = nn.Linear(2, 3)  # 9 parameters, 36 B
    peaks, value = dp.Backend(True, 2).step_peaks(step, model, 2)
    assert value == "done"
    assert peaks == {"cuda:0": 500 + 36, "cuda:1": 300}


@pytest.mark.parametrize("n_gpus", [0, 1, 2, 3, 8])
def test_backend_chooses_real_gpus_only_from_two(monkeypatch, n_gpus):
    """0 and 1 GPU: virtual devices (one GPU cannot split a batch); 2 or more: torch.nn.parallel."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n_gpus)
    b = dp.backend()
    assert (b.real, b.gpus) == (n_gpus >= 2, n_gpus)
    if b.real:
        assert b.parallel is torch.nn.parallel and b.DataParallel is nn.DataParallel
        assert b.DataParallelModel is dp.DataParallelModel
        assert b.device(n_gpus - 1) == torch.device("cuda", n_gpus - 1)
        with pytest.raises(ValueError, match=f"has {n_gpus} GPUs"):
            b.device(n_gpus)
    else:
        assert b.parallel is comm and b.DataParallelModel is dp.VirtualDataParallelModel
        assert b.device(3) == "vcuda:3" and b.where(torch.ones(1)) == "?"
    assert dp.backend(min_gpus=max(n_gpus + 1, 2)).real is False


def test_backend_matches_this_machine():
    b = dp.backend()
    assert b.real == (torch.cuda.device_count() >= 2) and b.gpus == torch.cuda.device_count()


@pytest.mark.gpu
@TWO_GPUS
def test_real_backend_parallel_criterion_on_two_gpus():  # pragma: no cover - GPU only
    torch.manual_seed(0)
    b = dp.backend()
    model = nn.Linear(6, 5).double().to(b.device(0))
    x = torch.randn(9, 6, dtype=torch.float64, device=b.device(0))
    y = torch.randint(0, 5, (9,), device=b.device(0))
    outs = b.DataParallelModel(model, [0, 1])(x)
    assert [o.device.index for o in outs] == [0, 1]
    loss = dp.DataParallelCriterion(nn.CrossEntropyLoss(), [0, 1])(outs, y)
    torch.testing.assert_close(loss, nn.functional.cross_entropy(model(x), y), **F64)
    assert loss.device == torch.device("cuda", 0)


def _lin():
    return nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    [
        (dp.device_name, (True,), {}, TypeError, "int index"),
        (dp.device_name, (1.5,), {}, TypeError, "int index"),
        (dp.device_name, (-1,), {}, ValueError, ">= 0"),
        (dp.device_name, ("vcuda:x",), {}, ValueError, "look like 'vcuda:1'"),
        (dp.to_device, (torch.ones(1), "bogus"), {}, ValueError, "'cpu' or 'cuda:0'"),
        (dp.to_device, ([1.0], 0), {}, TypeError, "torch.Tensor"),
        (dp.virtual_device_of, ("x",), {}, TypeError, "torch.Tensor"),
        (dp.chunk_sizes, (0, 2), {}, ValueError, "empty batch"),
        (dp.chunk_sizes, (5, 0), {}, ValueError, "at least one device"),
        (dp.chunk_sizes, (5.0, 2), {}, TypeError, "whole number"),
        (dp.chunk_sizes, (5, "2"), {}, TypeError, "whole number"),
    ],
)
def test_devices_reject_bad_input(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    [
        (dp.replicate, (_lin(), []), {}, ValueError, "at least one device"),
        (dp.replicate, (_lin(), [0, 0]), {}, ValueError, "distinct"),
        (dp.replicate, (_lin(), 0), {}, TypeError, r"list of devices such as \[0, 1\]"),
        (dp.replicate, ("model", [0, 1]), {}, TypeError, "nn.Module"),
        (dp.replicate, (_lin(), [0, 1]), {"detach": "yes"}, TypeError, "True or False"),
        (dp.scatter, (torch.ones(4), []), {}, ValueError, "at least one device"),
        (dp.scatter, (("tag", 3), [0, 1]), {}, ValueError, "contains none"),
        (dp.scatter, (torch.ones(4), [0, 1]), {"dim": 1}, ValueError, "out of range"),
        (dp.scatter, (torch.ones(0, 3), [0, 1]), {}, ValueError, "empty batch"),
        (dp.scatter, (torch.tensor(1.0), [0, 1]), {}, ValueError, "batch dimension"),
        (dp.scatter, (torch.ones(4), [0, 1]), {"dim": "0"}, TypeError, "dim must be an int"),
        (dp.scatter_kwargs, (("tag",), None, [0, 1]), {}, ValueError, "pass the batch"),
        (dp.scatter_kwargs, (torch.ones(2), None, [0, 1]), {}, TypeError, "tuple of positional"),
        (dp.scatter_kwargs, ((torch.ones(2),), [1], [0, 1]), {}, TypeError, "dict of keyword"),
        (dp.parallel_apply, ([], []), {}, ValueError, "one replica per device"),
        (dp.parallel_apply, (_lin(), [torch.ones(2)]), {}, TypeError, "list of replicas"),
        (dp.parallel_apply, ([_lin(), 3], [torch.ones(2)] * 2), {}, TypeError, "callable"),
        (dp.parallel_apply, ([_lin()] * 2, [torch.ones(2)]), {}, ValueError, "one input per replica"),
        (dp.parallel_apply, ([_lin()] * 2, [torch.ones(2)] * 2, [{}]), {}, ValueError, "one per replica"),
        (dp.parallel_apply, ([_lin()] * 2, [torch.ones(2)] * 2, [1, 2]), {}, TypeError, "one dict"),
        (dp.parallel_apply, ([_lin()] * 2, [torch.ones(2)] * 2, None, [0]), {}, ValueError, "one device per"),
        (dp.parallel_apply, ([_lin()], [torch.ones(2)]), {"timings": {}}, TypeError, "list to append"),
        (dp.gather, ([], "cpu"), {}, ValueError, "one output per replica"),
        (dp.gather, (torch.ones(2), 0), {}, TypeError, "list with one output per replica"),
        (dp.gather, ([torch.ones(2)], "bogus"), {}, ValueError, "not a device"),
        (dp.gather, (["a", "b"], 0), {}, TypeError, "return tensors"),
        (dp.gather, ([torch.ones(1), "b"], 0), {}, TypeError, "same structure"),
        (dp.gather, ([{"a": torch.ones(1)}, {"b": torch.ones(1)}], 0), {}, ValueError, "same keys"),
    ],
)
def test_comm_rejects_bad_input(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    [
        (dp.VirtualDataParallel, (None,), {}, TypeError, "nn.Module"),
        (dp.VirtualDataParallel, (_lin(), []), {}, ValueError, "at least one device"),
        (dp.VirtualDataParallel, (_lin(), [0, 0]), {}, ValueError, "distinct"),
        (dp.VirtualDataParallel, (_lin(), [0, 1]), {"output_device": 2}, ValueError, "one of device_ids"),
        (dp.VirtualDataParallel, (_lin(), [0, 1]), {"dim": 0.5}, TypeError, "dim must be an int"),
        (dp.DataParallelCriterion, ("cross_entropy",), {}, TypeError, "nn.CrossEntropyLoss()"),
        (
            dp.DataParallelCriterion,
            (nn.CrossEntropyLoss,),
            {},
            TypeError,
            r"CrossEntropyLoss\(\), not the class",
        ),
        (dp.DataParallelCriterion, (nn.MSELoss(),), {"reduction": "none"}, ValueError, "'mean' or 'sum'"),
        (dp.DataParallelCriterion, (nn.MSELoss(), [0, 1], "vcuda:3"), {}, ValueError, "one of device_ids"),
        (dp.Backend, (True, 1), {}, ValueError, "at least 2 GPUs"),
        (dp.Backend, ("yes", 0), {}, TypeError, "True or False"),
        (dp.Backend, (False, -1), {}, ValueError, "gpus must be >= 0"),
        (dp.backend, (1,), {}, ValueError, "at least 2 devices"),
        (dp.backend, ("2",), {}, TypeError, "min_gpus must be a whole number"),
    ],
)
def test_modules_reject_bad_input(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)


def test_wrappers_reject_bad_calls():
    crit = dp.DataParallelCriterion(nn.CrossEntropyLoss(), [0, 1])
    target = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="one output tensor per device"):
        crit([], target)
    with pytest.raises(ValueError, match="same device_ids as the model"):
        crit([torch.ones(2, 3)] * 3, target)
    with pytest.raises(ValueError, match="same batch size"):
        crit([torch.ones(2, 3)] * 2, torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="contain none"):
        dp.VirtualDataParallel(_lin(), [0, 1])("not a batch")
    b = dp.Backend(False, 0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        b.to([1.0], 0)
    with pytest.raises(ValueError, match="n_devices must be >= 1"):
        b.step_peaks(lambda: None, _lin(), 0)
    with pytest.raises(TypeError, match="no arguments"):
        b.step_peaks(None, _lin(), 2)
    with pytest.raises(ValueError, match="this machine has 2 GPUs"):
        dp.Backend(True, 2).step_peaks(lambda: None, _lin(), 3)


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "error", "message"),
    [
        (dp.plot_phases, ("rows",), {}, TypeError, "PhaseTimer"),
        (dp.plot_phases, ([],), {}, ValueError, "time at least one phase"),
        (dp.plot_phases, ([("a", "b", 1.0)],), {}, TypeError, "label: str, lane: str"),
        (dp.plot_phases, ([("a", "b", 2.0, 1.0)],), {}, ValueError, "ends before it starts"),
        (dp.plot_phases, ([("a", "b", 0.0, 1.0)],), {"ax": "axes"}, TypeError, "matplotlib Axes"),
        (dp.plot_peak_comparison, ([1, 2],), {}, TypeError, r"\{setup: \{device: bytes\}\}"),
        (dp.plot_peak_comparison, ({},), {}, TypeError, "non-empty dict"),
        (dp.plot_peak_comparison, ({"a": {"vcuda:0": -1}},), {}, TypeError, "bytes >= 0"),
        (dp.draw_data_parallel_flow, (1,), {}, ValueError, "at least two devices"),
        (dp.draw_data_parallel_flow, (17,), {}, ValueError, "at most 16"),
        (dp.draw_data_parallel_flow, ("3",), {}, TypeError, "n_devices must be a whole number"),
        (dp.PhaseTimer(), ("",), {}, ValueError, "non-empty string"),
        (dp.PhaseTimer(), (3,), {}, TypeError, "string such as 'scatter'"),
        (dp.PhaseTimer().add_threads, ([{"replica": 0}],), {}, ValueError, "parallel_apply writes"),
    ],
)
def test_plots_reject_bad_input(func, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        func(*args, **kwargs)
