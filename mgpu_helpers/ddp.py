"""Used by notebooks 04b (DDP in practice), 04d (fault tolerance: its `!torchrun` cells), 07b (errors
and hangs: it captures gloo's native log lines) and 07c (the profiler's), and by ``benchmarks/ddp.py``:
the plumbing around DDP jobs that would only distract in the notebook.

The concepts — the training script, the sampler, the scaling measurement, the unused-parameter error —
are written out in notebooks 04a and 04b; this module holds:

* :func:`torchrun_ready_shell` — makes ``!torchrun …`` typed in a cell run *this* kernel's torchrun on
  the loopback interface, and picks a free port for ``--master-port``;
* :func:`captured_native_stderr` — captures what C++ code writes to file descriptor 2 (DDP's reducer
  warnings), which ``warnings.catch_warnings`` cannot see, so a cell can print a one-line summary
  instead of a dump;
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

from .processes import LOOPBACK, free_port, loopback_interface

__all__ = ["captured_native_stderr", "torchrun_ready_shell"]


def torchrun_ready_shell() -> int:
    """Prepare this kernel's environment for ``!torchrun …`` cells; return a free port on 127.0.0.1.

    * The folder of this kernel's Python goes first on ``PATH``: a kernel started from a virtual
      environment does not always have it there, and ``!torchrun`` would then run another Python's
      torchrun (with another torch) or none at all.
    * ``GLOO_SOCKET_IFNAME`` names the loopback interface, so that gloo's connections stay on
      127.0.0.1; otherwise gloo uses the address the host name resolves to, which containers and
      laptops without a network often cannot reach.
    * The returned port was free a moment ago; pass it as ``--master-port``. (Two jobs must not share
      a port; ``torchrun``'s default, 29500, clashes as soon as a second job runs.)

    Only this kernel's ``os.environ`` changes, which the shell of every later ``!`` command inherits.
    """
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "").split(os.pathsep)
    if bin_dir not in path[:1]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *[p for p in path if p != bin_dir]])
    iface = loopback_interface()
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    return free_port(LOOPBACK)


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
