"""Used by notebook 01 through :func:`mgpu_helpers.launching.run_torchrun`: the torchrun
agent it starts for each simulated node.

``python -m mgpu_helpers.launching.agent ARGS`` runs ``torchrun ARGS`` (``torch.distributed.run``)
unchanged, except for what a job confined to one machine and tied to a notebook kernel needs:

* **stores on loopback** — every rendezvous / worker store whose host is a loopback address listens on
  127.0.0.1 only (:func:`~mgpu_helpers.launching.loopback.bind_stores_to_loopback`; torchrun has no
  option for that);
* **workers die with their agent** — torchrun starts each worker in its own session, so a killed agent
  (SIGKILL, nothing can run) would leave them running. Each worker is started with
  ``PR_SET_PDEATHSIG=SIGKILL``: Linux kills it the moment its agent is gone. (An agent that gets SIGTERM
  stops its workers itself: torchrun turns the signal into ``SignalException`` and closes them.)
* **no folder left behind** — torchrun's per-run log folder (``torchelastic_*``, never removed by
  torchrun) is made inside a scratch folder that run_torchrun passes in ``MGPU_AGENT_SCRATCH`` and
  removes afterwards, even if the agent was killed;
* **the agent dies with the kernel** — :func:`run_torchrun` starts the agent with
  ``preexec_fn=die_with_parent`` (SIGTERM when the kernel dies); ``MGPU_PARENT_PID`` lets the agent
  notice a kernel that died before that was in place.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from ..processes import die_with_parent, temp_prefix
from .loopback import bind_stores_to_loopback
from .torchrun import PARENT_PID_ENV, SCRATCH_ENV

__all__ = ["main"]


def _exit_if_orphaned() -> None:
    """Exit at once if the process that started us died before our death signal was in place."""
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        sys.exit(f"mgpu agent: parent process {expected} is gone; not starting the job")


def _workers_die_with_agent() -> None:
    """Start every worker with ``PR_SET_PDEATHSIG=SIGKILL`` (Linux; elsewhere nothing changes).

    The ``prctl`` function is looked up *before* any fork, so the child only calls it: a forked child
    of a multi-threaded agent must not import or ``dlopen`` anything.
    """
    if not sys.platform.startswith("linux"):
        return
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    agent = os.getpid()

    def die_with_agent() -> None:  # runs in the worker, between fork and exec
        die_with_parent(signal.SIGKILL)  # prctl was looked up when processes was imported
        if os.getppid() != agent:  # the agent died before the line above
            os._exit(1)

    if getattr(subprocess_handler, "Popen", None) is not subprocess.Popen:
        raise RuntimeError("torch's SubprocessHandler no longer starts workers with subprocess.Popen")
    subprocess_handler.Popen = functools.partial(subprocess.Popen, preexec_fn=die_with_agent)


def main(argv: list[str] | None = None) -> None:
    """Run torchrun with ``argv`` (default: this process's arguments), stores on loopback."""
    _exit_if_orphaned()
    bind_stores_to_loopback()
    _workers_die_with_agent()
    from torch.distributed.run import main as torchrun_main

    # torchrun makes a log folder per run (tempfile.mkdtemp(prefix="torchelastic_")) and never removes
    # it: make it inside a folder that run_torchrun made (and removes, even if the agent was killed),
    # or one of ours, removed when the agent ends. (No SIGTERM handler of ours: during rendezvous the
    # agent waits in C++, where a Python handler would only run when the wait ends; SIGTERM's default
    # action ends it at once.)
    scratch = os.environ.pop(SCRATCH_ENV, None) or tempfile.mkdtemp(prefix=temp_prefix("agent"))
    tempfile.tempdir = scratch  # this process only; the workers' environment is unchanged
    try:
        torchrun_main(argv)
    finally:
        tempfile.tempdir = None
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
