"""Troubleshooting helpers: diagnose() on real errors (real hangs and mismatched collectives between two gloo
processes included) and leak detection."""

import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from _scripts import defined_in_a_function, raised

from mgpu_helpers.launching import launch
from mgpu_helpers.memory import MemoryTracker
from mgpu_helpers.models import MLP
from mgpu_helpers.troubleshoot import KINDS, Diagnosis, diagnose, memory_growth


# ------------------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "exc", "message"),
    [
        (diagnose, (123,), {}, TypeError, r"caught exception .* or an error text"),
        (diagnose, (None,), {}, TypeError, r"not NoneType"),
        (diagnose, ("  \n",), {}, ValueError, r"empty error text; pass the exception"),
    ],
)
def test_diagnose_rejects_bad_input(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "exc", "message"),
    [
        (memory_growth, ([],), {}, ValueError, r"at least two readings"),
        (memory_growth, ([5],), {}, ValueError, r"at least two readings .* got 1"),
        (memory_growth, ("abc",), {}, TypeError, r"list of per-step memory readings"),
        (memory_growth, (5,), {}, TypeError, r"list of per-step memory readings"),
        (memory_growth, ([1, "2"],), {}, TypeError, r"values\[1\] must be a number of bytes"),
        (memory_growth, ([1, float("nan")],), {}, ValueError, r"values\[1\] must be a finite number"),
        (memory_growth, ([1, 2],), {"min_bytes_per_step": -1}, ValueError, r"min_bytes_per_step .* >= 0"),
        (memory_growth, ([1, 2],), {"min_bytes_per_step": "1"}, TypeError, r"min_bytes_per_step must be a"),
    ],
)
def test_memory_growth_rejects_bad_input(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


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
    assert memory_growth(iter([10, 20, 30, 40])).total_growth == 30  # any iterable of readings
    assert not memory_growth([5, 5, 5]).growing
    assert not memory_growth([100, 130, 90, 100], min_bytes_per_step=50).growing
    assert not memory_growth([40, 30, 20, 10]).growing  # shrinking is not a leak


# ------------------------------------------------------------------------------------------ diagnose
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
    err = raised(lambda: torch.ones(2) + torch.ones(2, device="meta"))
    assert diagnose(err).kind == "device_mismatch"
    err = raised(lambda: torch.nn.Linear(2, 2)(torch.ones(1, 2, device="meta")))
    assert diagnose(err).kind == "device_mismatch"
    # GPU wording (text): Conv2d with CPU input and CUDA weights
    gpu = "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same"
    assert diagnose(gpu).kind == "device_mismatch"
    gpu = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert diagnose(gpu).kind == "device_mismatch"


def test_diagnose_real_dtype_mismatch():
    errors = [
        raised(lambda: torch.ones(2, 2) @ torch.ones(2, 2, dtype=torch.float64)),
        raised(lambda: torch.nn.Linear(2, 2)(torch.ones(1, 2, dtype=torch.float64))),
        raised(lambda: F.cross_entropy(torch.randn(4, 3), torch.tensor([0.0, 1.0, 2.0, 1.0]))),
        raised(lambda: torch.nn.Conv2d(3, 4, 3)(torch.randn(1, 3, 8, 8).half())),
    ]
    assert [diagnose(e).kind for e in errors] == ["dtype_mismatch"] * 4


def test_diagnose_real_index_out_of_range_and_device_side_assert():
    errors = [
        raised(lambda: F.cross_entropy(torch.randn(4, 3), torch.tensor([0, 1, 2, 5]))),
        raised(lambda: torch.nn.Embedding(10, 3)(torch.tensor([10]))),
        raised(lambda: torch.randn(3)[torch.tensor([5])]),
    ]
    assert [diagnose(e).kind for e in errors] == ["index_out_of_range"] * 3
    assert "Target 5 is out of bounds" in diagnose(errors[0]).evidence
    gpu = "RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously"
    d = diagnose(gpu)
    assert d.kind == "index_out_of_range" and any("CUDA_LAUNCH_BLOCKING=1" in s for s in d.next_steps)


def _skips_the_collective(rank, world_size):
    """Rank 0 reduces, rank 1 never joins (but stays alive until rank 0's timeout has fired)."""
    import time

    import torch.distributed as dist

    if rank == 1:
        time.sleep(2.0)
        return None
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        return str(exc)
    return None


def _mismatched_collectives(rank, world_size):
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(4 if rank == 0 else 3))  # shapes differ between the ranks
    except RuntimeError as exc:
        return str(exc)
    return None


def test_diagnose_real_gloo_timeout_between_two_processes():
    message, _ = launch(_skips_the_collective, 2, backend="gloo", collective_timeout_s=1.0, timeout_s=60)
    d = diagnose(message)
    assert d.kind == "distributed_timeout" and d.details["waited"] == "1 s"


def test_diagnose_real_mismatched_collectives_under_distributed_debug_detail():
    messages = launch(
        _mismatched_collectives,
        2,
        backend="gloo",
        collective_timeout_s=5.0,
        timeout_s=60,
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    )
    detected = [m for m in messages if m and "Detected mismatch" in m]
    assert detected, messages
    d = diagnose(detected[0])
    assert d.kind == "collective_mismatch" and any("same shapes" in s for s in d.next_steps)


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
    err = raised(lambda: pickle.loads(blob))
    d = diagnose(err)
    assert d.kind == "unpicklable_target" and d.details["missing in the child"] == "notebook_worker"
    assert diagnose(raised(lambda: pickle.dumps(lambda x: x))).kind == "unpicklable_target"
    assert diagnose(raised(lambda: pickle.dumps(defined_in_a_function()))).kind == "unpicklable_target"


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
        err = raised(lambda: torch.ones(1).cuda())  # a real error on a CPU build of torch
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
    assert isinstance(d, Diagnosis) and KINDS[-1] == "unknown"
    assert set(KINDS) == {
        "out_of_memory", "index_out_of_range", "device_mismatch", "dtype_mismatch", "collective_mismatch",
        "distributed_timeout", "unpicklable_target", "cuda_setup", "unknown",
    }  # fmt: skip
    text = str(diagnose(raised(lambda: torch.ones(2, 2) @ torch.ones(2, 2, dtype=torch.float64))))
    assert text.startswith("[dtype_mismatch]") and "next steps:" in text and "1. " in text
