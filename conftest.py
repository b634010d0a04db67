"""Repository-wide pytest checks: no test, and no run as a whole, may leave a process behind; the test
process and every notebook kernel run in the state a GPU machine creates (autograd owns a thread, so a
forked child's backward fails: tests/_gpu_conditions.py)."""

import runpy
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from mgpu_helpers.processes import stop_processes


def pytest_configure(config):
    """One intra-op thread in the test process: unit tests assert behaviour, not speed, and on a
    2-core CI machine a multi-threaded pool spin-waits against the notebook kernels and Ray workers
    running beside it (a 0.1 s test took 24 s). Notebook kernels are separate processes: unaffected."""
    import torch

    torch.set_num_threads(1)
    runpy.run_path(str(GPU_CONDITIONS))["start_autograd_thread"]()
    _retry_kernel_start_up()
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order pytest_collection_modifyitems sets
        config.option.loadscopereorder = False  # (also over an explicit --loadscope-reorder)


#: Puts a process in a GPU machine's state.
GPU_CONDITIONS = Path(__file__).parent / "tests" / "_gpu_conditions.py"
#: Sent to every notebook kernel before its first cell; it leaves no name in the notebook's namespace.
KERNEL_GPU_CONDITIONS = f"__import__('runpy').run_path({str(GPU_CONDITIONS)!r})['start_autograd_thread']()"

#: How many times nbval may start a notebook's kernel when it dies before running any cell.
KERNEL_START_ATTEMPTS = 3


def _retry_kernel_start_up() -> None:
    """Start a notebook's kernel again when it dies before answering ``kernel_info``.

    jupyter_client picks the kernel's five TCP ports by binding port 0 and letting go; the kernel binds
    them a second or two later, and on a busy CI machine (torchrun, gloo and Ray connecting beside it)
    another process can take one in between: the kernel exits with "Address already in use" before any
    cell ran (seen once in a full run: every cell of 00 errored). No notebook code has run at that
    point, so a fresh start with fresh ports is the whole fix; the kernel's stderr (nbval throws it
    away) is kept and quoted if every attempt fails.
    """
    try:
        import nbval.kernel
    except ImportError:  # nbval is a test extra; without it no notebook is collected
        return
    if not getattr(nbval.kernel.start_new_kernel, "retries_start_up", False):
        nbval.kernel.start_new_kernel = in_gpu_conditions(retrying_start_up(nbval.kernel.start_new_kernel))


def in_gpu_conditions(start):
    """``start`` (a kernel starter returning ``(manager, client)``), then autograd's thread started in the
    kernel, as a GPU machine's first backward does: any code that forks the kernel and runs autograd in
    the child fails in CI as it would on Colab."""

    def start_new_kernel(*args, **kwargs):
        km, kc = start(*args, **kwargs)
        reply = kc.execute_interactive(KERNEL_GPU_CONDITIONS, silent=True, store_history=False, timeout=120)
        if reply["content"]["status"] != "ok":
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise RuntimeError(f"could not put the kernel in GPU-machine conditions: {reply['content']}")
        return km, kc

    start_new_kernel.retries_start_up = True
    start_new_kernel.__wrapped__ = getattr(start, "__wrapped__", start)  # nbval's own starter
    return start_new_kernel


def retrying_start_up(start):
    """``start`` (nbval's ``start_new_kernel``) tried up to KERNEL_START_ATTEMPTS times, each with its
    stderr kept in a temporary file and quoted in the error if every attempt fails."""

    def start_new_kernel(*args, **kwargs):
        errors = []
        for _ in range(KERNEL_START_ATTEMPTS):
            with tempfile.TemporaryFile("w+") as stderr:  # the kernel holds its own copy of the file
                try:
                    return start(*args, **{**kwargs, "stderr": stderr})
                except RuntimeError as exc:
                    if "died" not in str(exc):  # "Kernel didn't respond in 60 seconds": not a port race
                        raise
                    stderr.seek(0)
                    errors.append(f"{exc}; the kernel's stderr:\n{stderr.read()[-2000:]}")
        summary = f"the kernel died at start-up {KERNEL_START_ATTEMPTS} times:\n"
        raise RuntimeError(summary + "\n".join(errors))

    start_new_kernel.retries_start_up = True
    start_new_kernel.__wrapped__ = start
    return start_new_kernel


# Python's multiprocessing starts one resource-tracker process per interpreter the first time 'spawn'
# or 'forkserver' is used; it belongs to the interpreter and exits with it, so it is not a leak.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children(exclude: set[int] = frozenset()) -> list[psutil.Process]:
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid in exclude or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(h in " ".join(p.cmdline()) for h in _INTERPRETER_HELPERS):
                continue
            alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Fail a unit test that leaves a process it started (torchrun agents, workers, Ray) running."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    # A child that was just told to stop may need a moment to exit: poll, never judge the first look.
    deadline = time.monotonic() + 5
    left = _children(before)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _children(before)
    names = _describe(left)
    stop_processes(left, grace_s=1.0)
    assert not left, f"test left processes running: {names}"


#: The files that took longest on the 2-core CI VM (3 xdist workers; two runs of 2026-12-03, 160 s down to
#: 25 s each), longest first. xdist hands out whole files in the order they were collected; these go
#: first so that the short files fill the gaps at the end, instead of one long file running alone there.
#: Stale figures only cost balance, never correctness.
_LONG_FILES = (
    "tests/test_launcher.py",
    "tests/test_solutions.py",
    "notebooks/08_capstone.ipynb",
    "tests/test_shortcuts.py",
    "notebooks/04b_ddp_in_practice.ipynb",
    "notebooks/04d_fault_tolerance.ipynb",
    "tests/test_tuning_ray.py",
    "notebooks/05g_scale_lab.ipynb",
    "notebooks/06b_ray_tune.ipynb",
    "notebooks/01_nodes_and_gpus.ipynb",
    "tests/test_troubleshoot_fences.py",
    "tests/test_launch.py",
    "notebooks/07a_memory_problems.ipynb",
    "tests/test_benchmarks.py",  # one process for all six quick runs since issue 24
    "notebooks/03b_data_parallel_limits.ipynb",
    "tests/test_launch_c10d.py",
    "notebooks/07b_errors_and_hangs.ipynb",
    "notebooks/02a_model_parallel_by_hand.ipynb",
    "notebooks/02b_pipelining_api.ipynb",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::")[0]
    return _LONG_FILES.index(path) if path in _LONG_FILES else len(_LONG_FILES)


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect: see only the items that will run
def pytest_collection_modifyitems(session, config, items):
    """Move the long files to the front, longest first (a stable sort: every other item keeps its
    order; ``pytest_configure`` turns off xdist's reordering by test count)."""
    items.sort(key=_rank)


def pytest_sessionfinish(session, exitstatus):
    """After everything (notebooks included), give kernels a moment to exit, then require none left."""
    deadline = time.monotonic() + 10
    left = _children()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _children()
    if left:
        print(f"\nERROR: processes left running after the tests: {_describe(left)}")
        stop_processes(left, grace_s=1.0)
        session.exitstatus = 1
