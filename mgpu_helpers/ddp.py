"""Used by notebooks 04b (DDP in practice: it captures the reducer's native log lines), 04d (fault
tolerance: its `!torchrun` cells) and 07c (the profiler's log lines), and by ``benchmarks/ddp.py``:
the plumbing around DDP jobs that would only distract in the notebook.

The concepts — the training script, the sampler, the scaling measurement, the unused-parameter error —
are written out in notebooks 04a and 04b; this module holds:

* :func:`torchrun_ready_shell` — makes ``!torchrun …`` typed in a cell run *this* kernel's torchrun on
  the loopback interface, with its temp folders in one folder of the kernel's, and picks a free port
  for ``--master-port``;
* :func:`captured_native_stderr` — captures what C++ code writes to file descriptor 2 (DDP's reducer
  warnings), which ``warnings.catch_warnings`` cannot see, so a cell can print a one-line summary
  instead of a dump;
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

from .processes import LOOPBACK, free_port, loopback_interface, temp_prefix

__all__ = ["captured_native_stderr", "torchrun_ready_shell"]


def torchrun_ready_shell() -> int:
    """Prepare this kernel's environment for ``!torchrun …`` cells; return a free port on 127.0.0.1.

    * The folder of this kernel's Python goes first on ``PATH``: a kernel started from a virtual
      environment does not always have it there, and ``!torchrun`` would then run another Python's
      torchrun (with another torch) or none at all.
    * ``GLOO_SOCKET_IFNAME`` names the loopback interface, so that gloo's connections stay on
      127.0.0.1; otherwise gloo uses the address the host name resolves to, which containers and
      laptops without a network often cannot reach.
    * ``TMPDIR`` names a folder of this kernel's (``mgpu-shell-<pid>-…`` in the temp dir): torchrun's
      agent makes a log folder per run (``torchelastic_*``) and never removes it. The folder goes when
      the kernel exits; one left by a killed kernel goes at the next call in any kernel.
    * The returned port was free a moment ago; pass it as ``--master-port``. (Two jobs must not share
      a port; ``torchrun``'s default, 29500, clashes as soon as a second job runs.)

    Only this kernel's ``os.environ`` changes, which the shell of every later ``!`` command (and every
    process the kernel starts later) inherits; the kernel's own ``tempfile`` keeps the temp dir it had.
    A kernel stopped with SIGKILL (nbval does) runs no exit handler: its folder goes at the next call.
    """
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "").split(os.pathsep)
    if bin_dir not in path[:1]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *[p for p in path if p != bin_dir]])
    iface = loopback_interface()
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    os.environ["TMPDIR"] = _shell_temp_dir()
    return free_port(LOOPBACK)


_SHELL_TEMP_DIR: list[str] = []  # this kernel's folder for the temp files of its `!` commands


def _shell_temp_dir() -> str:
    """This kernel's ``mgpu-shell-<pid>-…`` folder, made on the first call, removed at exit."""
    if not (_SHELL_TEMP_DIR and os.path.isdir(_SHELL_TEMP_DIR[0])):
        base = tempfile.gettempdir()  # fixed for this kernel before TMPDIR changes
        folder = tempfile.mkdtemp(prefix=temp_prefix("shell"), dir=base)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _SHELL_TEMP_DIR[:] = [folder]
    return _SHELL_TEMP_DIR[0]


@contextlib.contextmanager
def captured_native_stderr() -> Iterator[list[str]]:
    """Capture everything written to file descriptor 2 inside the ``with`` block, C++ code included.

    PyTorch's C++ warnings (e.g. DDP's reducer: "find_unused_parameters=True was specified … but did
    not find any unused parameters") are written straight to the process's stderr, past Python's
    ``warnings`` module and ``sys.stderr``. This swaps file descriptor 2 for a temporary file for the
    duration of the block::

        with captured_native_stderr() as captured:
            ...                      # code whose native warnings we want
        text = captured[0]           # everything written, as one string

    Yields a list that holds the captured text (one string) once the block has ended.
    """
    captured: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))
