"""Used by the graders of notebook 04d: run a function on 2 workers under torchelastic's own agent
(``LocalElasticAgent``, what ``torchrun`` runs) with one restart allowed, from a notebook kernel.

The agent is started by :func:`torch.distributed.launcher.api.elastic_launch` in a child of the package's
forkserver (:mod:`mgpu_helpers.launching.server`: never a fork of the kernel, which breaks autograd on GPU
machines; and the agent installs SIGTERM/SIGINT handlers, which must not land in the kernel). The
student's function travels to it by value, and its workers fork from the agent, which never ran autograd —
so functions defined in the notebook run as they are, no script needed. The job
sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (notebook 04d, section 2, says why), keeps every store and
socket on loopback (:mod:`mgpu_helpers.launching.loopback`), makes the agent host its own rendezvous store
(a port taken since :func:`~mgpu_helpers.processes.free_port` is retried, never joined), ties the agent to
the kernel (:func:`~mgpu_helpers.launching.server.die_with`) and the workers to the agent
(``PR_SET_PDEATHSIG``), and stops every process before returning.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from ..exercises import Wrong
from ..launching import server
from ..launching.loopback import bind_stores_to_loopback, loopback_env
from ..processes import LOOPBACK, die_with_parent, free_port, stop_processes

__all__ = ["elastic_job"]

#: One try of the elastic job (a normal one takes ~2 s) and how many tries (see :func:`elastic_job`).
_TRY_S, _TRIES = 20.0, 3


def _in_worker(agent: int, fn: Callable[..., Any], *args: Any) -> Any:
    """In a worker forked by the agent: SIGKILL when the agent dies; exit now if it already has."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != agent:
        os._exit(1)
    torch.set_num_threads(1)
    return fn(*args)


def _agent(payload: bytes, state: dict[str, Any], folder: str) -> None:
    """Runs in a forkserver child: one LocalElasticAgent, 2 workers, one restart allowed."""
    server.die_with(state)
    server.adopt(state)
    result: tuple[str, Any]
    try:
        worker, args = server.unpack(payload)
        log = open(os.path.join(folder, "agent.log"), "w")  # noqa: SIM115 - lives until os._exit
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        logging.disable(logging.CRITICAL)  # the agent's own log lines: the failures come back as data
        os.environ.update(loopback_env(), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
        bind_stores_to_loopback()
        tempfile.tempdir = folder
        from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std
        from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        for attempt in range(3):
            port = free_port()
            # is_host: this agent must host the rendezvous store. Without it, a port that another job
            # took since free_port() makes the agent join *that* job's store as a client and wait forever.
            config = LaunchConfig(
                min_nodes=1, max_nodes=1, nproc_per_node=2, max_restarts=1, rdzv_backend="c10d",
                rdzv_endpoint=f"{LOOPBACK}:{port}", rdzv_configs={"is_host": True}, run_id=f"mgpu-04d-{port}",
                start_method="fork", monitor_interval=0.05,
                logs_specs=DefaultLogsSpecs(os.path.join(folder, "logs", str(attempt)), Std.ALL),
            )  # fmt: skip
            try:
                result = ("ok", elastic_launch(config, _in_worker)(os.getpid(), worker, *args))
                break
            except RendezvousConnectionError:  # the port was taken after all: try another
                if attempt == 2:
                    raise
    except BaseException as exc:  # ChildFailedError: every attempt failed
        failures = getattr(exc, "failures", {}).values()
        messages = [
            str(f.message.get("message") if isinstance(f.message, dict) else f.message) for f in failures
        ]
        first = [m for m in messages if not re.search(r"Connection (closed|reset)|Signal \d+", m)]
        result = ("failed", (first or messages or [f"{type(exc).__name__}: {exc}"])[0])
    with open(os.path.join(folder, "result.pkl"), "wb") as fh:
        pickle.dump(result, fh)
    os._exit(0)


def _empty(folder: str) -> None:
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def elastic_job(
    crash: str, worker: Callable[..., Any], *args: Any, fresh: str | None = None
) -> dict[int, Any]:
    """``worker(*args)`` on 2 ranks under an elastic agent that restarts them once; rank -> return value.

    A job that has not finished after :data:`_TRY_S` seconds is stopped and run again, up to
    :data:`_TRIES` times, with the folder ``fresh`` emptied first: now and then a worker that the agent
    forks never starts (a lock held by one of the agent's threads at the moment of the fork — the hazard
    of forking a threaded process), and the job would wait forever. A normal job takes about 2 s.
    """
    payload = server.pack(worker, args)
    for _ in range(_TRIES):
        if fresh is not None:
            _empty(fresh)
        with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
            proc = server.context().Process(target=_agent, args=(payload, server.snapshot(), folder))
            try:
                with server.no_main_import():
                    proc.start()
                proc.join(_TRY_S)
                timed_out = proc.is_alive()
            finally:
                stop_processes([proc], grace_s=1.0)
            if timed_out:
                continue
            try:
                with open(os.path.join(folder, "result.pkl"), "rb") as fh:
                    status, value = pickle.load(fh)
            except (OSError, EOFError, pickle.UnpicklingError):
                raise Wrong("the elastic job's agent ended without a result.") from None
        if status != "ok":
            last = value.strip().splitlines()[-1] if value.strip() else "no error message"
            last = re.split(r"(?<=[.!]) ", last)[0][:200]  # its first sentence
            raise Wrong(f"{crash}; then the restarted job failed: {last}")
        return value
    raise Wrong(f"the elastic job did not finish within {_TRY_S:g} s, {_TRIES} times in a row.")
