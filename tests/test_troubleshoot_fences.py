"""Troubleshooting helpers, the fences: capped child processes (CPU), cuda_memory_cap (GPU), memory readings,
is_oom — real out-of-memory errors, contained, and every abnormal end cleaned up. (Notebook 07a's own OOM
reproduction and batch-size search run under nbval.)"""

import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import torch
from _scripts import defined_in_a_function, raised, wait_until

from mgpu_helpers.processes import stop_processes
from mgpu_helpers.troubleshoot import (
    ChildResult,
    cuda_memory_cap,
    diagnose,
    free_memory,
    is_oom,
    memory_snapshot,
    process_rss,
    run_with_memory_limit,
)

MiB = 1024**2
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS caps need Linux")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "exc", "message"),
    [
        (memory_snapshot, ("gpu0",), {}, ValueError, r"not a device; pass 'cpu'"),
        (memory_snapshot, (3.5,), {}, TypeError, r"device such as 'cpu'"),
        (memory_snapshot, ("cuda:99",), {}, ValueError, r"cuda:99.*(pass 'cpu'|pass cuda:0)"),
        (free_memory, (-1,), {}, ValueError, r"index must be >= 0"),
    ],
)
def test_memory_state_rejects_bad_input(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "exc", "message"),
    [
        (run_with_memory_limit, (torch.ones, 4), {"limit_bytes": 0}, ValueError, r"limit_bytes must be > 0"),
        (run_with_memory_limit, (torch.ones, 4), {"limit_bytes": -MiB}, ValueError, r"> 0 bytes"),
        (run_with_memory_limit, (torch.ones, 4), {"limit_bytes": "64MiB"}, TypeError, r"int number of bytes"),
        (run_with_memory_limit, (torch.ones, 4), {"limit_bytes": MiB, "timeout": 0}, ValueError, r"> 0"),
        (run_with_memory_limit, (abs, 1), {"limit_bytes": MiB, "timeout": -1}, ValueError, r"e\.g\. 120"),
        (run_with_memory_limit, (abs, 1), {"limit_bytes": MiB, "timeout": math.inf}, ValueError, "finite"),
        (run_with_memory_limit, (torch.ones,), {"limit_bytes": MiB, "timeout": "1"}, TypeError, "seconds"),
        (run_with_memory_limit, (42,), {"limit_bytes": MiB}, TypeError, r"fn must be a function"),
        (run_with_memory_limit, (lambda: 1,), {"limit_bytes": MiB}, ValueError, r"at module level"),
    ],
)
def test_capped_child_rejects_bad_input(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "exc", "message"),
    [
        (cuda_memory_cap, (0,), {}, ValueError, r"limit_bytes must be > 0"),
        (cuda_memory_cap, ("1 MiB",), {}, TypeError, r"int number of bytes"),
        (cuda_memory_cap, (MiB,), {"device": "cpu"}, ValueError, r"run_with_memory_limit"),
        (cuda_memory_cap, (MiB,), {"device": torch.device("meta")}, ValueError, r"caps a CUDA device"),
        (
            cuda_memory_cap,
            (MiB,),
            {"device": 99},
            ValueError if torch.cuda.is_available() else RuntimeError,
            r"cuda:99.*does not exist" if torch.cuda.is_available() else r"needs a CUDA GPU",
        ),
    ],
)
def test_cuda_memory_cap_rejects_bad_input(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        fn(*args, **kwargs)


def test_is_oom_rejects_what_is_not_an_exception():
    with pytest.raises(TypeError, match=r"caught exception"):
        is_oom("out of memory")


# ------------------------------------------------------------------------------------------ readings
def test_memory_snapshot_and_free_memory_read_this_process():
    snap = free_memory()
    assert snap["process_rss"] > 0 and "cuda_allocated" not in snap
    big = torch.ones(64 * MiB // 4)  # 64 MiB, written, so resident
    assert memory_snapshot("cpu")["process_rss"] - snap["process_rss"] > 32 * MiB
    del big


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
def test_diagnose_a_real_cpu_oom(cpu_oom):
    d = diagnose(cpu_oom)
    assert d.kind == "out_of_memory" and "DefaultCPUAllocator" in d.evidence
    assert d.details["requested"] == "67,108,864 B (host RAM)"
    assert any("batch size" in s for s in d.next_steps)
    # ... also when it is the cause of another error, and as plain text (e.g. a worker's stderr)
    try:
        raise RuntimeError("training failed") from cpu_oom
    except RuntimeError as wrapped:
        assert diagnose(wrapped).kind == "out_of_memory"
    text = f"Traceback (most recent call last):\n  ...\nRuntimeError: {cpu_oom}"
    assert diagnose(text).kind == "out_of_memory"


@linux_only
def test_capped_child_returns_values_and_reports_its_budget():
    rss_before = process_rss()
    result = run_with_memory_limit(torch.arange, 5, limit_bytes=64 * MiB, timeout=120)
    assert result.ok and torch.equal(result.value, torch.arange(5))
    assert result.limit_bytes == 64 * MiB and result.baseline_bytes > 0 and result.peak_rss_bytes > 0
    assert abs(process_rss() - rss_before) < 32 * MiB  # nothing of the child's memory lands here


@linux_only
def test_capped_child_refuses_functions_a_child_cannot_import():
    for fn in (lambda x: x, defined_in_a_function()):
        err = raised(lambda fn=fn: run_with_memory_limit(fn, 1, limit_bytes=MiB))
        # the pickling error's own text is CPython's, and changes between releases: not asserted
        assert isinstance(err, ValueError) and "cannot be sent to a child" in str(err)
        assert "module level" in str(err)
        assert isinstance(err.__cause__, AttributeError | pickle.PicklingError)
        assert diagnose(err).kind == "unpicklable_target"
    main = sys.modules["__main__"]

    def notebook_function():
        pass

    notebook_function.__module__, notebook_function.__qualname__ = "__main__", "notebook_function"
    main.notebook_function = notebook_function  # as if typed into a notebook cell
    try:
        err = raised(lambda: run_with_memory_limit(notebook_function, limit_bytes=MiB))
    finally:
        del main.notebook_function
    assert "Can't get attribute 'notebook_function' on <module '__main__'>" in str(err)
    assert diagnose(err).details["missing in the child"] == "notebook_function"


def _threads() -> int:
    with open("/proc/self/status") as fh:
        return int(next(ln for ln in fh if ln.startswith("Threads:")).split()[1])


def parallel_work_then_allocate(mib: int) -> tuple[int, int]:
    """Run in a capped child: work wide enough for every intra-op thread, then a ``mib`` MiB tensor."""
    before = _threads()
    torch.ones(4 * 32_768 * torch.get_num_threads()).mul_(2.0).sum()  # OpenMP's whole team
    torch.mm(torch.ones(384, 384), torch.ones(384, 384))
    after = _threads()
    torch.ones(mib * MiB // 4).sum()  # written: really allocated
    return before, after


def start_a_wider_thread_pool(threads: int) -> float:
    """Run in a capped child: a pool wider than the warm-up's, started under the cap (a 16-core
    machine's OpenMP team, started by the first large operation, did this before the warm-up)."""
    x = torch.ones(32_768 * threads)  # one grain of work per thread: a team of ``threads``
    torch.set_num_threads(threads)
    return float(x.mul_(2.0).sum())


@linux_only
def test_the_budget_is_what_the_function_gets():
    # torch's thread pools start before the cap (their stacks are address space: 8 MiB a thread) ...
    fits = run_with_memory_limit(parallel_work_then_allocate, 56, limit_bytes=64 * MiB, timeout=120)
    assert fits.ok, fits.explain()
    before, after = fits.value
    assert after == before, f"{after - before} threads started under the cap, out of the budget"
    # ... and the budget is the budget: 72 MiB do not fit in 64
    too_big = run_with_memory_limit(parallel_work_then_allocate, 72, limit_bytes=64 * MiB, timeout=120)
    assert not too_big.ok and too_big.stage == "run" and is_oom(too_big.error)
    assert "ran out of memory under the cap" in too_big.explain()


@linux_only
def test_a_thread_pool_started_under_the_cap_is_explained():
    wider = 2 * (os.cpu_count() or 1) + 8  # than the warm-up's pool (at most one thread per core)
    result = run_with_memory_limit(start_a_wider_thread_pool, wider, limit_bytes=64 * MiB, timeout=60)
    assert not result.ok and result.value is None
    if result.stage == "" and "timed out" in str(result.error):  # torch 2.11's CUDA build: a hang
        assert "starting threads under the cap" in result.explain(), result.explain()
    elif result.stage == "":  # libgomp ends the process when it cannot start a thread
        assert "Thread creation failed" in result.stderr and result.exitcode == 1
        assert "could not start a thread" in result.explain()
    else:  # or the pool's stacks left too little for the tensor
        assert result.stage == "run" and is_oom(result.error), result.explain()


def test_explain_names_what_happened_in_the_child():
    oom = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 67108864 bytes.")
    kw = {"limit_bytes": 16 * MiB, "baseline_bytes": 700 * MiB}
    cases = [
        (
            ChildResult(value=1, exitcode=0, stage="done", **kw),
            "returned normally within its budget of 16 MiB",
        ),
        (ChildResult(error=oom, exitcode=0, stage="run", **kw), "ran out of memory under the cap"),
        (
            ChildResult(
                error=KeyError("x"),
                exitcode=0,
                stage="run",
                error_traceback='  File "demo.py", line 3, in step\n    d["x"]\nKeyError: \'x\'\n',
                **kw,
            ),
            'the function raised KeyError: \'x\' (at File "demo.py", line 3, in step d["x"]); '
            "this is an error in the function, not an OOM",
        ),
        (
            ChildResult(error=RuntimeError("not enforced"), exitcode=0, stage="cap", **kw),
            "could not set its cap",
        ),
        (
            ChildResult(error=AttributeError("f"), exitcode=0, stage="start", **kw),
            "could not load the function",
        ),
        (
            ChildResult(
                error=RuntimeError("the capped child process was killed by SIGKILL before reporting."),
                exitcode=-9,
                **kw,
            ),
            "OOM killer",
        ),
        (
            ChildResult(
                error=RuntimeError("the capped child process died with exit code 1 before reporting."),
                exitcode=1,
                stderr="\nlibgomp: Thread creation failed: Resource temporarily unavailable\n",
                **kw,
            ),
            "could not start a thread",
        ),
    ]
    for result, expected in cases:
        assert expected in result.explain(), (expected, result.explain())
    assert not any(r.ok for r, _ in cases[1:])


# ------------------------------------------------------------------------------------------ abnormal ends
@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Temporary folders of this test go to ``tmp_path`` (other processes may use the shared one)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@linux_only
def test_a_child_that_times_out_is_stopped_and_leaves_no_folder(private_tmp):
    result = run_with_memory_limit(time.sleep, 600, limit_bytes=64 * MiB, timeout=1)
    assert not result.ok and "timed out after 1 s and was stopped" in str(result.error)
    assert result.exitcode is not None and result.exitcode < 0  # ended by a signal, not by finishing
    assert list(private_tmp.iterdir()) == []


@linux_only
def test_a_child_that_dies_is_reported_and_leaves_no_folder(private_tmp):
    result = run_with_memory_limit(os._exit, 3, limit_bytes=64 * MiB, timeout=120)
    assert not result.ok and result.exitcode == 3
    assert "died with exit code 3 before reporting" in str(result.error)
    assert list(private_tmp.iterdir()) == []


@linux_only
def test_an_interrupted_run_stops_its_child_and_removes_its_folder(private_tmp):
    """Ctrl-C (KeyboardInterrupt) while the parent waits for the child."""
    seen: dict[str, object] = {}

    def waiting_for_the_child(frame) -> bool:
        while frame is not None:
            if frame.f_code.co_name == "wait" and frame.f_code.co_filename == subprocess.__file__:
                return True
            frame = frame.f_back
        return False

    def interrupt(signum, frame):
        if waiting_for_the_child(frame):
            seen["children"] = [c for c in psutil.Process().children() if c.pid not in earlier]
            seen["folders"] = [p.name for p in private_tmp.iterdir()]
            raise KeyboardInterrupt
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # not waiting yet: look again shortly

    earlier = {c.pid for c in psutil.Process().children()}  # e.g. an xdist worker's other children
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            run_with_memory_limit(time.sleep, 600, limit_bytes=64 * MiB, timeout=600)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(seen["children"]) == 1 and seen["folders"][0].startswith("mgpu-oom-")  # it was running
    assert not seen["children"][0].is_running()
    assert list(private_tmp.iterdir()) == []


@linux_only
def test_a_killed_parent_takes_its_capped_child_along(tmp_path):
    kernel_code = (
        "import time\nfrom mgpu_helpers.troubleshoot import run_with_memory_limit\n"
        "run_with_memory_limit(time.sleep, 600, limit_bytes=64 * 1024**2, timeout=600)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    kernel = subprocess.Popen([sys.executable, "-c", kernel_code], env=env)
    try:
        child = wait_until(lambda: psutil.Process(kernel.pid).children(), "the capped child to start")[0]
        kernel.kill()  # like a kernel killed by the OOM killer or "Restart": no finally block runs
        kernel.wait()

        def gone() -> bool:
            try:
                return child.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        assert wait_until(gone, "the child to die with its parent")
    finally:
        stop_processes([kernel], grace_s=1.0)
        if "child" in locals() and child.is_running():
            stop_processes([child.pid], grace_s=1.0)


# ------------------------------------------------------------------------------------------ GPU cap
def test_cuda_memory_cap_explains_what_to_do_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="run_with_memory_limit"), cuda_memory_cap(MiB):
        pass


@pytest.mark.gpu
@needs_gpu
def test_cuda_memory_cap_turns_a_large_allocation_into_an_oom_and_restores():
    before = torch.cuda.memory_allocated(0)
    with cuda_memory_cap(128 * MiB, "cuda:0") as fraction:
        assert 0 < fraction < 1
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(256 * MiB, dtype=torch.uint8, device="cuda:0")
    assert is_oom(caught.value) and diagnose(caught.value).kind == "out_of_memory"
    assert "Tried to allocate" in str(caught.value)
    assert torch.cuda.memory_allocated(0) == before


@pytest.mark.gpu
@needs_gpu
def test_cuda_memory_cap_budget_does_not_grow_with_what_is_alive():
    # A live 2 MiB + 512 B tensor gets a 20 MiB segment of its own that empty_cache cannot release; the
    # ~18 MiB free inside it must count towards the budget, not come on top of it.
    keep = torch.empty(2 * MiB + 512, dtype=torch.uint8, device="cuda:0")
    chunks = []
    with cuda_memory_cap(64 * MiB, "cuda:0"), pytest.raises(torch.OutOfMemoryError):
        for _ in range(64):
            chunks.append(torch.empty(4 * MiB, dtype=torch.uint8, device="cuda:0"))
    got = len(chunks) * 4 * MiB
    del chunks, keep
    assert 0 < got <= 64 * MiB, f"the capped block allocated {got / MiB:.0f} MiB with a 64 MiB budget"
