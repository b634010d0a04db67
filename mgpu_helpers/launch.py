"""Run real ``torchrun`` jobs from a notebook — one or several "nodes" on this machine — and clean up.

``torchrun`` (``python -m torch.distributed.run``) is what people type on a cluster: one invocation per
node, each starting ``--nproc-per-node`` worker processes and meeting the other nodes at
``--master-addr:--master-port``. On a laptop we start every "node" on 127.0.0.1, which exercises
exactly the same code path: rendezvous, a TCP store, process groups, collectives.

This module only builds the command lines, starts them, waits with a timeout, and makes sure that
every process it started is gone afterwards — also when a node fails or the cell is interrupted.
Lines that workers print as ``MGPU_RESULT {json}`` are parsed for the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RESULT_PREFIX",
    "NodeRun",
    "TorchrunError",
    "free_port",
    "gpu_slices",
    "launch_env",
    "loopback_interface",
    "parse_results",
    "run_torchrun",
    "torchrun_command",
]

#: Workers print ``RESULT_PREFIX + json.dumps(obj)`` to hand a result back to the notebook.
RESULT_PREFIX = "MGPU_RESULT "


class TorchrunError(RuntimeError):
    """A torchrun node failed or timed out; the message holds the end of its output."""


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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def loopback_interface() -> str | None:
    """Name of the network interface holding 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS), if known."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(getattr(a, "address", None) == "127.0.0.1" for a in addrs):
                return name
    except Exception:  # psutil missing or unsupported platform: let gloo choose
        return None
    return None


def launch_env(extra: dict[str, str] | None = None, *, threads_per_process: int = 1) -> dict[str, str]:
    """Environment for workers on one machine: gloo on the loopback interface, fixed thread count.

    ``GLOO_SOCKET_IFNAME`` keeps gloo's traffic on loopback (by default it may pick the machine's
    public interface); ``OMP_NUM_THREADS`` stops N workers from each using every core.
    """
    env = dict(os.environ)
    iface = loopback_interface()
    if iface:
        env.setdefault("GLOO_SOCKET_IFNAME", iface)
    env["OMP_NUM_THREADS"] = str(threads_per_process)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def torchrun_command(
    target: str,
    args: Sequence[str] = (),
    *,
    nnodes: int = 1,
    nproc_per_node: int = 2,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
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
    (``node_rank`` is then ignored).
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes and nproc_per_node must be >= 1 (got {nnodes}, {nproc_per_node})")
    if rdzv not in ("static", "c10d"):
        raise ValueError(f"rdzv must be 'static' or 'c10d', not {rdzv!r}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
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
    else:
        if not 0 <= node_rank < nnodes:
            raise ValueError(f"node_rank must be in 0..{nnodes - 1}, got {node_rank}")
        if nnodes > 1:
            cmd.append(f"--node-rank={node_rank}")
        cmd += [f"--master-addr={master_addr}", f"--master-port={master_port}"]
    cmd += ["-m", target] if module else [target]
    return cmd + [str(a) for a in args]


def gpu_slices(nnodes: int, nproc_per_node: int) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``nnodes`` simulated nodes on this one machine.

    Real nodes each have their own GPUs. Nodes simulated on one machine would all see the same GPUs,
    and NCCL refuses two ranks on one GPU, so each node gets its own slice of ``nproc_per_node``
    GPUs when there are enough, and none at all (``""``: CPU and gloo) when there are not.
    ``torch.cuda.device_count()`` does not create a CUDA context, so this is safe before forking.
    """
    import torch

    existing = os.environ.get("CUDA_VISIBLE_DEVICES")
    if existing is not None:
        visible = [d.strip() for d in existing.split(",") if d.strip()]
    else:
        visible = [str(i) for i in range(torch.cuda.device_count())]
    if len(visible) < nnodes * nproc_per_node:
        return [""] * nnodes
    return [",".join(visible[k * nproc_per_node : (k + 1) * nproc_per_node]) for k in range(nnodes)]


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """Stop a process and everything it started (it runs in its own session)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


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

    With ``rdzv="static"`` node k gets ``--node-rank=k``; with ``rdzv="c10d"`` every node runs the same
    command and the rendezvous numbers them (the workers' ``GROUP_RANK``; :class:`NodeRun`'s
    ``node_rank`` is then the start order). Together they have ``nnodes × nproc_per_node`` ranks. Like
    real machines, the simulated nodes must not share GPUs: see :func:`gpu_slices`. If any
    node fails, the others are stopped at once (they would otherwise wait in rendezvous or in a
    collective). With ``check=True`` a failure or timeout raises :class:`TorchrunError` that quotes
    the failing node's output; every process started here is gone when this returns or raises.
    """
    if sys.platform == "win32":  # pragma: no cover - the course runs on Linux/macOS/Colab
        raise OSError("run_torchrun needs process groups (Linux or macOS); on Windows use WSL.")
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
    run_env = launch_env(env)
    node_gpus = gpu_slices(nnodes, nproc_per_node) if nnodes > 1 else [None]
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as files:
        # Output goes to temporary files, not pipes: a chatty worker can never block on a full pipe.
        logs = [
            (files.enter_context(tempfile.TemporaryFile()), files.enter_context(tempfile.TemporaryFile()))
            for _ in commands
        ]
        try:
            for cmd, (out, err), gpus in zip(commands, logs, node_gpus, strict=True):
                node_env = run_env if gpus is None else {**run_env, "CUDA_VISIBLE_DEVICES": gpus}
                procs.append(
                    subprocess.Popen(cmd, stdout=out, stderr=err, env=node_env, start_new_session=True)
                )
            status = _wait_all(procs, timeout)
        finally:
            for p in procs:
                _kill_group(p)
        texts = [(_read(out), _read(err)) for out, err in logs]
    runs = []
    for k, (cmd, p, (out, err), note) in enumerate(zip(commands, procs, texts, status, strict=True)):
        runs.append(
            NodeRun(k, cmd, None if note == "timeout" else p.returncode, out, err + _NOTES.get(note, ""))
        )
    if check and any(run.returncode != 0 for run in runs):
        # Report the node that failed by itself, not one that was stopped because of it: stopped by us
        # ("stopped"/"timeout"), or by its own agent when a peer failed (a SignalException traceback).
        def collateral(item: tuple[NodeRun, str]) -> tuple[bool, bool]:
            run, note = item
            return note != "done", "SignalException" in run.stdout + run.stderr

        failed = [(run, note) for run, note in zip(runs, status, strict=True) if run.returncode != 0]
        run = min(failed, key=collateral)[0]
        reason = "timed out" if run.returncode is None else f"exited with code {run.returncode}"
        raise TorchrunError(f"node {run.node_rank} {reason}: {run.shell_command()}\n{_failure_excerpt(run)}")
    return runs


def _failure_excerpt(run: NodeRun, max_lines: int = 30) -> str:
    """The worker's own traceback (what a student needs), else the end of the node's output."""
    lines = (run.stdout + "\n" + run.stderr).strip().splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if starts:
        block = lines[starts[0] : starts[0] + max_lines]
        end = next(
            (i for i, line in enumerate(block[1:], 1) if line and not line.startswith((" ", "\t"))), None
        )
        block = block if end is None else block[: end + 1]
        return "--- first worker traceback ---\n" + "\n".join(block)
    return "--- end of output ---\n" + "\n".join(lines[-max_lines:])


_NOTES = {
    "stopped": "\n[stopped by run_torchrun: another node failed]",
    "timeout": "\n[stopped by run_torchrun: timeout]",
}


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
            for i, p in enumerate(procs):
                if status[i] == "running":
                    _kill_group(p)
                    status[i] = "stopped" if failed else "timeout"
            break
        time.sleep(0.05)
    return status


def parse_results(stdout: str) -> list[Any]:
    """Decode every ``MGPU_RESULT {json}`` line in a worker's output."""
    return [
        json.loads(line[len(RESULT_PREFIX) :])
        for line in stdout.splitlines()
        if line.startswith(RESULT_PREFIX)
    ]
