"""Worker scripts and process-watching helpers shared by the tests that start processes.

Waits poll with a deadline (they only catch hangs); nothing here asserts on elapsed time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from mgpu_helpers.processes import is_loopback, listening_addresses

#: Only catches hangs: generous, since on a loaded 2-core machine a CUDA build of torch (the Colab stack's)
#: takes over 10 s to import, and a job's process tree imports it several times before it is complete.
HANG_DEADLINE_S = 180

#: Node 1 (GROUP_RANK 1) fails at once; every other node sleeps, so it must be stopped.
FAILING_NODE = """
import os, time
if os.environ["GROUP_RANK"] == "1":
    raise ValueError("node one is broken on purpose")
time.sleep(120)
"""

SLEEP = """
import time
time.sleep(120)
"""

#: Joins a gloo group, then rank 1 raises from inside a function.
RAISE_AFTER_JOIN = """
import torch.distributed as dist
dist.init_process_group("gloo")

def broken_step():
    raise ValueError("rank one is broken after joining")

if dist.get_rank() == 1:
    broken_step()
dist.barrier()
dist.destroy_process_group()
"""

#: Joins a gloo group, then rank 1 is killed by SIGKILL.
KILLED_AFTER_JOIN = """
import os, signal, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""

#: Joins a gloo group, marks itself ready in DIR (argv[1]), and waits until DIR/release exists.
READY_THEN_WAIT = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
folder = sys.argv[1]
open(os.path.join(folder, f"ready{dist.get_rank()}"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.destroy_process_group()
"""


def write_script(folder: Path, body: str, name: str = "worker.py") -> str:
    """``body`` (dedented) saved as ``folder/name``; returns the path."""
    path = Path(folder) / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = HANG_DEADLINE_S) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s`` (a hang)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up after {timeout_s} s waiting for {what}")


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan that exited may wait for init to reap it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_descendants(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if is_alive(p)]
    except psutil.NoSuchProcess:
        return []


def signal_parent_and_watch(
    code: str, *args: str, min_descendants: int, sig: int, tmpdir: Path | None = None
) -> str:
    """Run ``code`` in a Python process standing in for a notebook kernel (temp files in ``tmpdir``);
    once it has ``min_descendants`` live descendants, send it ``sig``; then require every one of those
    descendants (pids taken *before* the signal) to be gone. Returns the parent's output, which goes to
    a file: a pipe would stay open as long as any child that inherited it lives."""
    env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir else None
    # Ctrl-C raises KeyboardInterrupt, as in a kernel, even when the tests run as a background job
    # (a non-interactive shell starts those with SIGINT ignored, and Python keeps that). SIGUSR1 makes
    # the parent print every thread's stack: what it was stuck in, if it never exits.
    code = (
        "import faulthandler, signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    ) + textwrap.dedent(code)
    with tempfile.TemporaryFile() as log:
        parent = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            tree = wait_until(
                lambda: (d := live_descendants(parent.pid)) and len(d) >= min_descendants and d,
                f"{min_descendants} processes under the parent",
            )
            os.kill(parent.pid, sig)
            try:
                parent.wait(timeout=HANG_DEADLINE_S)
            except subprocess.TimeoutExpired:
                os.kill(parent.pid, signal.SIGUSR1)
                time.sleep(1)
                log.seek(0)
                stacks = log.read().decode(errors="replace")[-4000:]
                raise AssertionError(
                    f"the parent did not exit within {HANG_DEADLINE_S} s of signal {sig}; its output and "
                    f"stacks:\n{stacks}\nits processes: {[p.pid for p in live_descendants(parent.pid)]}"
                ) from None
            wait_until(lambda: not any(is_alive(p) for p in tree), "the parent's processes to exit")
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
        log.seek(0)
        return log.read().decode(errors="replace")


def job_listening_addresses(ready: Callable[[], bool]) -> list[tuple[str, int, str]]:
    """Listening sockets of every process this test process started, once ``ready()`` holds."""
    wait_until(ready, "the job to be up")
    found = []
    for child in psutil.Process().children():
        found += listening_addresses(child.pid)
    return found


def assert_loopback_only(addresses: list[tuple[str, int, str]], at_least: int) -> None:
    assert len(addresses) >= at_least, f"expected >= {at_least} listening sockets, found {addresses}"
    wide = [a for a in addresses if not is_loopback(a[0])]
    assert not wide, f"listening beyond loopback: {wide}"


def count_mgpu_entries(folder: Path) -> int:
    return sum(1 for name in os.listdir(folder) if name.startswith("mgpu-"))


def raised(fn: Callable[[], Any]) -> BaseException:
    """The exception ``fn()`` raises (fails if it raises none)."""
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - returning it is the point
        return exc
    raise AssertionError(f"{fn} raised nothing")


def defined_in_a_function() -> Callable[[Any], Any]:
    """A function that cannot be pickled by reference (it is local to another function)."""

    def nested(x: Any) -> Any:
        return x

    return nested


def reference_solutions(notebook: str) -> Any:
    """``solutions/nb<notebook>.py`` (repository root, outside the package): SOLUTIONS and WRONG."""
    import importlib

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"solutions.nb{notebook}")


def solution_entries(
    kind: str, skip: frozenset[str] = frozenset(), marks: Callable[[str], list[Any]] = lambda _id: []
) -> list[Any]:
    """A ``pytest.param(exercise id, name)`` for every entry of the reference-solution modules' ``kind``
    dict ("SHORTCUTS": work the grader must reject, "VARIANTS": other correct work it must accept),
    leaving out ``skip``; ``marks(exercise id)`` adds marks. A module that needs an optional package of
    the course's extras (Ray for 06b and 08) that is not installed becomes one skipped entry: the GPU
    check runs where Ray's wheel cannot go. Any other import error fails the collection."""
    import pytest

    from mgpu_helpers.course import EXTRAS
    from mgpu_helpers.exercises import exercises

    optional = {module for _packages, modules in EXTRAS.values() for module in modules} | {"pandas"}
    found, missing = [], {}
    for ex in exercises():
        notebook = ex.id.split(".")[0]
        if ex.id in skip or notebook in missing:
            continue
        try:
            module = reference_solutions(notebook)
        except ModuleNotFoundError as err:
            if err.name not in optional:
                raise
            missing[notebook] = err.name
            reason = f"solutions/nb{notebook}.py needs {err.name}, which is not installed here"
            found.append(
                pytest.param(
                    ex.id, "", id=f"nb{notebook}-needs-{err.name}", marks=pytest.mark.skip(reason=reason)
                )
            )
            continue
        found += [
            pytest.param(ex.id, name, id=f"{ex.id}-{name}", marks=marks(ex.id))
            for name in getattr(module, kind, {}).get(ex.id, {})
        ]
    return found


def graded(exercise_id: str, *work: Any, hint: bool = False) -> tuple[bool, str]:
    """Run ``grade(exercise_id, *work, hint=hint)`` and return (passed, what it printed)."""
    import contextlib
    import io

    from mgpu_helpers.exercises import grade

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ok = bool(grade(exercise_id, *work, hint=hint))
    return ok, out.getvalue()
