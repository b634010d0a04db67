"""Troubleshooting helpers: contained OOMs, batch-size finder, leak detection, diagnose() on real errors."""

import math
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from mgpu_helpers.launch import run_torchrun
from mgpu_helpers.memory import MemoryTracker, estimate_training_memory
from mgpu_helpers.models import MLP
from mgpu_helpers.troubleshoot import (
    KINDS,
    Diagnosis,
    TrainingStep,
    cuda_memory_cap,
    diagnose,
    find_max_batch_size,
    free_memory,
    is_oom,
    memory_growth,
    process_rss,
    reproduce_oom,
    run_with_memory_limit,
)

MiB = 1024**2
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS caps need Linux")


def _raised(fn) -> BaseException:
    """The exception ``fn()`` raises (the test fails if it raises none)."""
    with pytest.raises(BaseException) as info:
        fn()
    return info.value


# ------------------------------------------------------------------------------------------ capped child
@pytest.fixture(scope="module")
def cpu_oom() -> BaseException:
    """A real CPU allocator failure: 64 MiB requested in a child allowed 16 MiB."""
    if sys.platform != "linux":
        pytest.skip("RLIMIT_AS caps need Linux")
    result = run_with_memory_limit(torch.ones, 16 * MiB, limit_bytes=16 * MiB, timeout=120)
    assert not result.ok and result.exitcode == 0, "the child caught the failure and exited cleanly"
    return result.error


@linux_only
def test_capped_child_contains_a_real_oom_and_the_parent_is_untouched(cpu_oom):
    assert isinstance(cpu_oom, RuntimeError)
    assert "DefaultCPUAllocator" in str(cpu_oom) and "67108864 bytes" in str(cpu_oom)
    assert is_oom(cpu_oom)
    # The same request is harmless here (no cap in this process): the limit was the child's alone.
    assert torch.ones(16 * MiB).numel() == 16 * MiB


@linux_only
def test_capped_child_returns_values_and_reports_its_budget():
    rss_before = process_rss()
    result = run_with_memory_limit(torch.arange, 5, limit_bytes=64 * MiB, timeout=120)
    assert result.ok and torch.equal(result.value, torch.arange(5))
    assert result.limit_bytes == 64 * MiB and result.baseline_bytes > 0 and result.peak_rss_bytes > 0
    assert abs(process_rss() - rss_before) < 32 * MiB  # nothing of the child's memory lands here


def _defined_in_a_function():
    def nested(x):
        return x

    return nested


@linux_only
def test_capped_child_refuses_functions_a_child_cannot_import():
    for fn in (lambda x: x, _defined_in_a_function()):
        err = _raised(lambda fn=fn: run_with_memory_limit(fn, 1, limit_bytes=MiB))
        assert isinstance(err, ValueError) and "Can't pickle" in str(err) and "module level" in str(err)
        assert diagnose(err).kind == "unpicklable_target"
    main = sys.modules["__main__"]

    def notebook_function():
        pass

    notebook_function.__module__, notebook_function.__qualname__ = "__main__", "notebook_function"
    main.notebook_function = notebook_function  # as if typed into a notebook cell
    try:
        err = _raised(lambda: run_with_memory_limit(notebook_function, limit_bytes=MiB))
    finally:
        del main.notebook_function
    assert "Can't get attribute 'notebook_function' on <module '__main__'>" in str(err)
    assert diagnose(err).details["missing in the child"] == "notebook_function"


@linux_only
def test_reproduce_oom_recovers_to_the_baseline_exactly():
    result = run_with_memory_limit(reproduce_oom, 448, 64, limit_bytes=128 * MiB, timeout=180)
    assert result.ok, result.error_traceback
    out = result.value
    assert out["error_type"] == "RuntimeError" and "can't allocate memory" in out["message"]
    assert out["failed_at"] == "loss.backward()"  # forward fitted; the failure surfaced in backward
    r = out["readings"]
    assert r["baseline"]["tracked"] == 0
    assert r["inside except"]["tracked"] > 50 * MiB  # the traceback still holds the failed step's tensors
    assert r["after except"]["tracked"] == 0 and r["after free_memory"]["tracked"] == 0
    assert r["after batch 64"]["tracked"] == 0 and math.isfinite(out["loss"])
    # RSS (host RAM) back near the baseline: a leak of the failed step would be > 100 MiB.
    assert abs(r["after free_memory"]["process_rss"] - r["baseline"]["process_rss"]) < 32 * MiB


# ------------------------------------------------------------------------------------------ finder
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


def test_finder_grows_then_binary_searches_to_the_exact_limit():
    step = _OOM(300)
    result = find_max_batch_size(step)
    assert (result.largest, result.first_failure) == (300, 301)
    assert step.calls[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]  # doubling until the first OOM
    assert step.calls[10:] == [384, 320, 288, 304, 296, 300, 302, 301]  # then bisection of (256, 512)
    assert [p.fits for p in result.probes] == [b <= 300 for b in step.calls]
    assert "OOM" in result.table()


def test_finder_edge_cases():
    assert find_max_batch_size(_OOM(10**9), max_batch=100).largest == 100  # everything fits
    assert find_max_batch_size(_OOM(10**9), max_batch=100).first_failure is None
    nothing = find_max_batch_size(_OOM(0), start=4)
    assert (nothing.largest, nothing.first_failure, len(nothing.probes)) == (0, 4, 1)
    with pytest.raises(ValueError):
        find_max_batch_size(_OOM(5), start=8, max_batch=4)


def test_finder_propagates_errors_that_are_not_oom():
    def broken(batch_size):
        raise ValueError("shape mismatch, not memory")

    with pytest.raises(ValueError, match="shape mismatch"):
        find_max_batch_size(broken)


def test_finder_leaves_no_tensor_of_a_failed_probe_alive():
    tracker = MemoryTracker()
    with tracker:
        result = find_max_batch_size(_OOM(100))
    assert result.largest == 100
    assert tracker.peak_total >= 101 * 256 * 4  # the failing probes really allocated
    assert tracker.current_total == 0  # ... and nothing of them survived the search


@linux_only
def test_finder_under_a_real_memory_limit_matches_the_formula():
    """A model with a known memory law: peak ≈ params + grads + Adam (formula) + 3 logits per sample."""
    step = TrainingStep()
    limit = 128 * MiB
    model, optimizer = step.build()
    static = estimate_training_memory(model, optimizer).total
    per_sample = 3 * step.vocab_size * 4  # logits' log-softmax, its gradient and the logits' gradient
    predicted = (limit - static) // per_sample
    result = find_max_batch_size(step, start=16, memory_limit=limit, timeout=240)
    assert result.where.startswith("CPU child") and result.memory_limit == limit
    assert result.first_failure == result.largest + 1
    assert 0.8 * predicted <= result.largest <= predicted, (result.largest, predicted)


def test_cuda_memory_cap_explains_what_to_do_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="run_with_memory_limit"), cuda_memory_cap(MiB):
        pass


def test_free_memory_reports_rss():
    snap = free_memory()
    assert snap["process_rss"] > 0 and "cuda_allocated" not in snap


# ------------------------------------------------------------------------------------------ leaks
def _eval_loop_totals(keep_graph: bool, steps: int = 6) -> list[int]:
    torch.manual_seed(0)
    model = MLP(in_features=32, hidden=128, out_features=4)
    tracker = MemoryTracker(model)
    totals = []
    with tracker:
        running = 0.0
        for _ in range(steps):
            loss = F.cross_entropy(model(torch.randn(64, 32)), torch.randint(0, 4, (64,)))
            running += loss if keep_graph else loss.item()
            totals.append(tracker.mark("step").total)
    tracker.close()
    return totals


def test_leak_from_accumulating_loss_tensors_is_detected_and_item_fixes_it():
    leaky = memory_growth(_eval_loop_totals(keep_graph=True))
    fixed = memory_growth(_eval_loop_totals(keep_graph=False))
    assert leaky.growing and leaky.bytes_per_step > 64 * 128 * 4  # a batch of activations per step
    assert not fixed.growing and fixed.bytes_per_step == 0
    assert "GROWING" in str(leaky) and "flat" in str(fixed)


def test_memory_growth_on_plain_numbers():
    assert memory_growth([10, 20, 30, 40]).bytes_per_step == pytest.approx(10)
    assert not memory_growth([5, 5, 5]).growing
    assert not memory_growth([100, 130, 90, 100], min_bytes_per_step=50).growing
    with pytest.raises(ValueError):
        memory_growth([1])


# ------------------------------------------------------------------------------------------ diagnose
def test_diagnose_real_oom_errors(cpu_oom):
    d = diagnose(cpu_oom)
    assert d.kind == "out_of_memory" and "DefaultCPUAllocator" in d.evidence
    assert d.details["requested"] == "67,108,864 B (host RAM)"
    assert any("batch size" in s for s in d.next_steps)
    # ... also when it is the cause of another error, and as plain text (e.g. a worker's stderr)
    try:
        raise RuntimeError("training failed") from cpu_oom
    except RuntimeError as wrapped:
        assert diagnose(wrapped).kind == "out_of_memory"
    assert (
        diagnose(f"Traceback (most recent call last):\n  ...\nRuntimeError: {cpu_oom}").kind
        == "out_of_memory"
    )


def test_diagnose_cuda_oom_message():
    # Text of a real CUDA OOM (cannot be produced without a GPU); the type is torch's own.
    msg = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 14.75 GiB of which "
        "1.06 GiB is free. Including non-PyTorch memory, this process has 13.69 GiB memory in use. Of the "
        "allocated memory 9.50 GiB is allocated by PyTorch, and 3.90 GiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    d = diagnose(torch.OutOfMemoryError(msg))
    assert d.kind == "out_of_memory" and d.details["requested"] == "2.00 GiB"
    assert "expandable_segments" in d.details["reserved but unallocated"]
    assert diagnose(MemoryError()).kind == "out_of_memory"


def test_diagnose_real_device_mismatch():
    err = _raised(lambda: torch.ones(2) + torch.ones(2, device="meta"))
    assert diagnose(err).kind == "device_mismatch"
    err = _raised(lambda: torch.nn.Linear(2, 2)(torch.ones(1, 2, device="meta")))
    assert diagnose(err).kind == "device_mismatch"
    # GPU wording (text): Conv2d with CPU input and CUDA weights
    gpu = "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same"
    assert diagnose(gpu).kind == "device_mismatch"
    gpu = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert diagnose(gpu).kind == "device_mismatch"


def test_diagnose_real_dtype_mismatch():
    errors = [
        _raised(lambda: torch.ones(2, 2) @ torch.ones(2, 2, dtype=torch.float64)),
        _raised(lambda: torch.nn.Linear(2, 2)(torch.ones(1, 2, dtype=torch.float64))),
        _raised(lambda: F.cross_entropy(torch.randn(4, 3), torch.tensor([0.0, 1.0, 2.0, 1.0]))),
        _raised(lambda: torch.nn.Conv2d(3, 4, 3)(torch.randn(1, 3, 8, 8).half())),
    ]
    assert [diagnose(e).kind for e in errors] == ["dtype_mismatch"] * 4


def test_diagnose_real_index_out_of_range_and_device_side_assert():
    errors = [
        _raised(lambda: F.cross_entropy(torch.randn(4, 3), torch.tensor([0, 1, 2, 5]))),
        _raised(lambda: torch.nn.Embedding(10, 3)(torch.tensor([10]))),
        _raised(lambda: torch.randn(3)[torch.tensor([5])]),
    ]
    assert [diagnose(e).kind for e in errors] == ["index_out_of_range"] * 3
    assert "Target 5 is out of bounds" in diagnose(errors[0]).evidence
    gpu = "RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously"
    d = diagnose(gpu)
    assert d.kind == "index_out_of_range" and any("CUDA_LAUNCH_BLOCKING=1" in s for s in d.next_steps)


def test_diagnose_real_gloo_timeout_between_two_processes():
    runs = run_torchrun(
        "mgpu_helpers.troubleshoot", ["hang", "--timeout", "2"], nproc_per_node=2, timeout=120
    )
    report = next(r for r in runs[0].results if r["rank"] == 0)
    assert report["kind"] == "distributed_timeout"  # diagnosed inside the worker, on the real exception
    assert 1.5 <= report["waited_s"] < 30  # the 2-second timeout, not a hang
    d = diagnose(report["message"])
    assert d.kind == "distributed_timeout" and d.details["waited"] == "2 s"
    assert any(r.get("skipped_all_reduce") for r in runs[0].results)


def test_diagnose_nccl_watchdog_message():
    text = (
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
    )
    d = diagnose(text)
    assert d.kind == "distributed_timeout" and d.details["waited"] == "600.012 s"


def test_diagnose_real_unpicklable_targets():
    # What a spawn child runs: unpickle "__main__.worker" in a process whose __main__ lacks it.
    main = sys.modules["__main__"]

    def worker():
        pass

    worker.__module__, worker.__qualname__ = "__main__", "notebook_worker"
    main.notebook_worker = worker
    try:
        blob = pickle.dumps(worker)
    finally:
        del main.notebook_worker
    err = _raised(lambda: pickle.loads(blob))
    d = diagnose(err)
    assert d.kind == "unpicklable_target" and d.details["missing in the child"] == "notebook_worker"
    assert diagnose(_raised(lambda: pickle.dumps(lambda x: x))).kind == "unpicklable_target"
    assert diagnose(_raised(lambda: pickle.dumps(_defined_in_a_function()))).kind == "unpicklable_target"


def test_diagnose_a_real_spawn_child_that_cannot_find_its_target():
    script = textwrap.dedent(
        """
        import multiprocessing as mp

        def work():
            print("never runs")

        if __name__ == "__main__":
            p = mp.get_context("spawn").Process(target=work)
            p.start()
            p.join()
            print("exitcode", p.exitcode)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "exitcode 1" in out.stdout
    d = diagnose(out.stderr)
    assert d.kind == "unpicklable_target" and d.details["missing in the child"] == "work"


def test_diagnose_cuda_setup_problems():
    if not torch.cuda.is_available():
        err = _raised(lambda: torch.ones(1).cuda())  # a real error on a CPU build of torch
        assert diagnose(err).kind == "cuda_setup"
    for text in (
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INIT",
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). ... "
        "CUDA driver version is insufficient for CUDA runtime version",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
        "you must use the 'spawn' start method",
    ):
        assert diagnose(text).kind == "cuda_setup", text


def test_diagnose_unknown_and_formatting():
    d = diagnose(ValueError("my own bug"))
    assert d.kind == "unknown" and d.evidence == "ValueError: my own bug"
    assert isinstance(d, Diagnosis) and set(KINDS) >= {d.kind}
    text = str(diagnose(_raised(lambda: torch.ones(2, 2) @ torch.ones(2, 2, dtype=torch.float64))))
    assert text.startswith("[dtype_mismatch]") and "next steps:" in text and "1. " in text
