"""Used by notebook 01 (its ``whoami.py`` on two simulated nodes) and its grader 01.1: real ``torchrun``
jobs — one or several "nodes" on this machine — started from a notebook and cleaned up.

``torchrun`` (``python -m torch.distributed.run``) is what people type on a cluster: one invocation per
node, each starting ``--nproc-per-node`` worker processes and meeting the other nodes at
``--master-addr:--master-port``. On a laptop every "node" runs on 127.0.0.1, which exercises exactly
the same code path: rendezvous, a TCP store, process groups, collectives.

This module builds the command lines, starts them (through :mod:`~mgpu_helpers.launching.agent`: the
same torchrun, with its stores on loopback and its workers tied to it), waits with a timeout, names
the rank that failed, and makes sure every process it started is gone afterwards — also when a node
fails, the cell is interrupted, or the kernel is killed. Lines that workers print as
``MGPU_RESULT {json}`` are parsed for the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..processes import LOOPBACK, die_with_parent, free_port, is_loopback, stop_processes, temp_prefix
from .failures import WorkerFailure, describe_failure, is_consequence, parse_failures
from .loopback import loopback_env

__all__ = [
    "PARENT_PID_ENV",
    "RESULT_PREFIX",
    "SCRATCH_ENV",
    "NodeRun",
    "TorchrunError",
    "gpu_slices",
    "launch_env",
    "parse_results",
    "run_torchrun",
    "torchrun_command",
]

#: Workers print ``RESULT_PREFIX + json.dumps(obj)`` to hand a result back to the notebook.
RESULT_PREFIX = "MGPU_RESULT "

#: The agent wrapper run for every node (``python -m`` this); the variables that tell it the pid of the
#: process that started it (it exits if that one is already gone) and its scratch folder.
_AGENT_MODULE = f"{__package__}.agent"
PARENT_PID_ENV = "MGPU_PARENT_PID"
SCRATCH_ENV = "MGPU_AGENT_SCRATCH"

_RDZV = ("static", "c10d")


class TorchrunError(RuntimeError):
    """A torchrun job failed or timed out; the message names the failing rank and quotes its traceback."""


@dataclass
class NodeRun:
    """What one torchrun invocation ("node") did."""

    node_rank: int
    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def results(self) -> list[Any]:
        """Objects the workers of this node printed with :data:`RESULT_PREFIX`."""
        return parse_results(self.stdout)

    def shell_command(self) -> str:
        """The command as one would type it: ``torchrun …`` for ``python -m torch.distributed.run …``."""
        cmd = self.command
        if cmd[1:3] == ["-m", "torch.distributed.run"]:
            cmd = ["torchrun", *cmd[3:]]
        return " ".join(cmd)


def _check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number such as 2, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")


def _check_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise TypeError(f"env must be a dict of str to str such as {{'OMP_NUM_THREADS': '1'}}, not {env!r}")
    return env


def _check_args(args: Any) -> list[str]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(
            f"args must be a list of command-line arguments such as ['--steps', '3'], not {args!r}"
        )
    return [str(a) for a in args]


def launch_env(extra: dict[str, str] | None = None, *, threads_per_process: int = 1) -> dict[str, str]:
    """Environment for workers on one machine: this process's, plus collectives on loopback
    (:func:`~mgpu_helpers.launching.loopback.loopback_env`) and a fixed thread count.

    ``OMP_NUM_THREADS`` stops N workers from each using every core; ``extra`` is applied last.
    """
    _check_count("threads_per_process", threads_per_process, 1)
    env = dict(os.environ)
    for key, value in loopback_env().items():
        env.setdefault(key, value)
    env["OMP_NUM_THREADS"] = str(threads_per_process)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(_check_env(extra))
    return env


def torchrun_command(
    target: str,
    args: Sequence[str] = (),
    *,
    nnodes: int = 1,
    nproc_per_node: int = 2,
    node_rank: int = 0,
    master_addr: str = LOOPBACK,
    master_port: int,
    module: bool = True,
    rdzv: str = "static",
    rdzv_id: str = "mgpu-job",
    max_restarts: int = 0,
) -> list[str]:
    """The torchrun command line for one node; ``target`` is a module (``module=True``) or a script path.

    ``rdzv="static"`` (the default) is the classic form: each node is told its ``--node-rank`` and node
    0's ``--master-addr``/``--master-port``. ``rdzv="c10d"`` is the elastic form: the command is the
    *same on every node* — each agent joins the rendezvous at ``master_addr:master_port`` under
    ``rdzv_id``, and the rendezvous assigns node ranks once ``nnodes`` agents have joined
    (``node_rank`` is then ignored). With a loopback ``master_addr`` every node is on this machine, so
    c10d gets ``--local-addr=127.0.0.1`` too (else the workers would meet at the host's name).
    """
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must be a module name or a script path (a non-empty str), not {target!r}")
    _check_count("nnodes", nnodes, 1)
    _check_count("nproc_per_node", nproc_per_node, 1)
    _check_count("max_restarts", max_restarts, 0)
    _check_count("master_port", master_port, 1)
    if master_port > 65535:
        raise ValueError(f"master_port must be a TCP port in 1..65535, not {master_port}")
    if rdzv not in _RDZV:
        raise ValueError(f"rdzv must be 'static' or 'c10d', not {rdzv!r}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
    ]
    if rdzv == "c10d":
        cmd += [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master_addr}:{master_port}",
            f"--rdzv-id={rdzv_id}",
            f"--max-restarts={max_restarts}",
        ]
        if is_loopback(master_addr):
            cmd.append(f"--local-addr={LOOPBACK}")
    else:
        _check_count("node_rank", node_rank, 0)
        if node_rank >= nnodes:
            raise ValueError(f"node_rank must be in 0..{nnodes - 1} (one less than nnodes), not {node_rank}")
        if nnodes > 1:
            cmd.append(f"--node-rank={node_rank}")
        cmd += [f"--master-addr={master_addr}", f"--master-port={master_port}"]
    cmd += ["-m", target] if module else [target]
    return cmd + _check_args(args)


def gpu_slices(nnodes: int, nproc_per_node: int) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``nnodes`` simulated nodes on this one machine.

    Real nodes each have their own GPUs. Nodes simulated on one machine would all see the same GPUs,
    and NCCL refuses two ranks on one GPU, so each node gets its own slice of ``nproc_per_node``
    GPUs when there are enough, and none at all (``""``: CPU and gloo) when there are not.
    ``torch.cuda.device_count()`` does not create a CUDA context, so this is safe before forking.
    """
    _check_count("nnodes", nnodes, 1)
    _check_count("nproc_per_node", nproc_per_node, 1)
    import torch

    existing = os.environ.get("CUDA_VISIBLE_DEVICES")
    if existing is not None:
        visible = [d.strip() for d in existing.split(",") if d.strip()]
    else:
        visible = [str(i) for i in range(torch.cuda.device_count())]
    if len(visible) < nnodes * nproc_per_node:
        return [""] * nnodes
    return [",".join(visible[k * nproc_per_node : (k + 1) * nproc_per_node]) for k in range(nnodes)]


def run_torchrun(
    target: str,
    args: Sequence[str] = (),
    *,
    nnodes: int = 1,
    nproc_per_node: int = 2,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    module: bool = True,
    check: bool = True,
    rdzv: str = "static",
) -> list[NodeRun]:
    """Start ``nnodes`` torchrun invocations on 127.0.0.1 that form one job, and wait for all of them.

    Used by notebook 01 and its grader 01.1.

    With ``rdzv="static"`` node k gets ``--node-rank=k``; with ``rdzv="c10d"`` every node runs the same
    command and the rendezvous numbers them (the workers' ``GROUP_RANK``; :class:`NodeRun`'s
    ``node_rank`` is then the start order). Together they have ``nnodes × nproc_per_node`` ranks. Like
    real machines, the simulated nodes must not share GPUs: see :func:`gpu_slices`. Every store and
    collective listens on 127.0.0.1 only. If any node fails, the others are stopped at once (they would
    otherwise wait in rendezvous or in a collective). With ``check=True`` a failure or timeout raises
    :class:`TorchrunError` naming the rank that failed first, its exit code or signal, and quoting its
    traceback. Every process started here is gone when this returns or raises — and, on Linux, when
    the calling process is killed (the agents get SIGTERM and stop their workers; a worker whose
    agent is gone gets SIGKILL).

    Raises:
        TypeError, ValueError: bad arguments (the message says what to pass).
        FileNotFoundError: ``module=False`` and the script does not exist (nothing is started).
        TorchrunError: a rank failed, or the job timed out (``check=True``).
    """
    if sys.platform == "win32":  # pragma: no cover - the course runs on Linux/macOS/Colab
        raise OSError("run_torchrun needs process groups (Linux or macOS); on Windows use WSL.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds such as 120, not {timeout!r}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds such as 120, not {timeout!r}")
    for name, flag in (("module", module), ("check", check)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, not {flag!r}")
    if rdzv not in _RDZV:
        raise ValueError(f"rdzv must be 'static' or 'c10d', not {rdzv!r}")
    _check_count("nnodes", nnodes, 1)
    _check_count("nproc_per_node", nproc_per_node, 1)
    if not module and isinstance(target, str) and not os.path.isfile(target):
        raise FileNotFoundError(
            f"No such file: {target!r} (run_torchrun with module=False runs a script path; "
            "pass module=True for a module name such as 'mgpu_helpers.launching.worker')"
        )
    port = free_port()
    commands = [
        torchrun_command(
            target,
            args,
            nnodes=nnodes,
            nproc_per_node=nproc_per_node,
            node_rank=k,
            master_port=port,
            module=module,
            rdzv=rdzv,
            rdzv_id=f"mgpu-{port}",
        )
        for k in range(nnodes)
    ]
    node_gpus = gpu_slices(nnodes, nproc_per_node) if nnodes > 1 else [None]
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as files:
        run_env = {**launch_env(env), PARENT_PID_ENV: str(os.getpid())}
        # Output goes to temporary files, not pipes: a chatty worker can never block on a full pipe.
        logs = [
            (files.enter_context(tempfile.TemporaryFile()), files.enter_context(tempfile.TemporaryFile()))
            for _ in commands
        ]
        try:
            for cmd, (out, err), gpus in zip(commands, logs, node_gpus, strict=True):
                # torchrun's log folder goes in here (see agent.py), removed even if the agent was killed
                scratch = files.enter_context(tempfile.TemporaryDirectory(prefix=temp_prefix("torchrun")))
                node_env = {**run_env, SCRATCH_ENV: scratch}
                if gpus is not None:
                    node_env["CUDA_VISIBLE_DEVICES"] = gpus
                agent = [cmd[0], "-m", _AGENT_MODULE, *cmd[3:]]
                procs.append(
                    subprocess.Popen(
                        agent,
                        stdout=out,
                        stderr=err,
                        env=node_env,
                        start_new_session=True,  # Ctrl-C in a terminal reaches us, not the workers
                        preexec_fn=die_with_parent,  # SIGTERM to the agent when this process dies
                    )
                )
            status = _wait_all(procs, timeout)
        finally:
            stop_processes(procs, grace_s=3.0)  # the agents and their workers (each in its own session)
        texts = [(_read(out), _read(err)) for out, err in logs]
    runs = []
    for k, (cmd, p, (out, err), note) in enumerate(zip(commands, procs, texts, status, strict=True)):
        runs.append(
            NodeRun(k, cmd, None if note == "timeout" else p.returncode, out, err + _NOTES.get(note, ""))
        )
    if check and any(run.returncode != 0 for run in runs):
        raise TorchrunError(_failure_message(runs, status, timeout))
    return runs


_NOTES = {
    "stopped": "\n[stopped by run_torchrun: another node failed]",
    "timeout": "\n[stopped by run_torchrun: timeout]",
}


def _failure_message(runs: list[NodeRun], status: list[str], timeout: float) -> str:
    """Name the rank that failed first (not one stopped because of it), how, and quote its traceback."""
    candidates: list[tuple[tuple[bool, bool, int], NodeRun, WorkerFailure | None]] = []
    for run, note in zip(runs, status, strict=True):
        if run.returncode in (0, None):
            continue
        output = run.stdout + "\n" + run.stderr
        failures = parse_failures(output)
        first = failures[0] if failures else None
        consequence = first is None or is_consequence(first, output)
        candidates.append(((note != "done", consequence, run.node_rank), run, first))
    if not candidates:  # nobody failed: the deadline passed
        late = [run for run, note in zip(runs, status, strict=True) if note == "timeout"]
        return (
            f"timed out after {timeout:g} s with {len(late)} node(s) still running "
            f"(raise timeout= if the job is just slow): {late[0].shell_command()}\n"
            f"{describe_failure(None, late[0].stdout + chr(10) + late[0].stderr)}"
        )
    _, run, failure = min(candidates, key=lambda c: c[0])
    output = run.stdout + "\n" + run.stderr
    if failure is None:
        code = cast(int, run.returncode)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        head = f"node {run.node_rank}'s torchrun agent {how} before any worker failed"
    else:
        head = (
            f"rank {failure.rank} (local rank {failure.local_rank} on node {run.node_rank}) {failure.how()}"
        )
    return f"{head}\n  command: {run.shell_command()}\n{describe_failure(failure, output)}"


def _read(f: Any) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[str]:
    """Wait for all processes; on the first failure or at the deadline, stop the rest.

    Returns per process "done", "stopped" (killed because another failed) or "timeout".
    """
    deadline = time.monotonic() + timeout
    status = ["running"] * len(procs)
    while "running" in status:
        for i, p in enumerate(procs):
            if status[i] == "running" and p.poll() is not None:
                status[i] = "done"
        failed = any(s == "done" and p.returncode != 0 for s, p in zip(status, procs, strict=True))
        if failed or time.monotonic() > deadline:
            running = [p for s, p in zip(status, procs, strict=True) if s == "running"]
            stop_processes(running, grace_s=3.0)
            status = [s if s != "running" else ("stopped" if failed else "timeout") for s in status]
            break
        time.sleep(0.05)
    return status


def parse_results(stdout: str) -> list[Any]:
    """Decode every ``MGPU_RESULT {json}`` line in a worker's output."""
    if not isinstance(stdout, str):
        raise TypeError(
            f"stdout must be the text a node printed (NodeRun.stdout), not {type(stdout).__name__}"
        )
    return [
        json.loads(line[len(RESULT_PREFIX) :])
        for line in stdout.splitlines()
        if line.startswith(RESULT_PREFIX)
    ]
