"""Repository-wide pytest checks: no test, and no run as a whole, may leave a process behind."""

import time

import psutil
import pytest

from mgpu_helpers.processes import stop_processes


def pytest_configure(config):
    """One intra-op thread in the test process: unit tests assert behaviour, not speed, and on a
    2-core CI machine a multi-threaded pool spin-waits against the notebook kernels and Ray workers
    running beside it (a 0.1 s test took 24 s). Notebook kernels are separate processes: unaffected."""
    import torch

    torch.set_num_threads(1)

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


#: Files that take a minute or more on one worker: collected first, so that with ``-n 2 --dist loadfile``
#: one worker starts on them while the other works through the rest, instead of one worker finishing
#: alone at the end (the wheel-install test builds a virtual environment: ~90 s).
_LONG_FILES = ("tests/test_wheel_install.py",)


def pytest_collection_modifyitems(session, config, items):
    """Move the long files to the front (a stable sort: every other item keeps its order)."""
    items.sort(key=lambda item: not any(item.nodeid.startswith(f) for f in _LONG_FILES))


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

