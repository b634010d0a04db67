"""Used by notebooks 06b and 08 through :class:`~mgpu_helpers.tuning.LocalRayCluster`: the processes
and folder of one ``ray start --head``, how to stop them, which heads run, and the guard that keeps
Tune from starting a second Ray beside them (:func:`guard_auto_init`).

Kept apart from the cluster object so that a ``weakref.finalize`` can stop a head when its
``LocalRayCluster`` is garbage-collected (a notebook cell re-run rebinds the name) or Python exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..processes import LOOPBACK, descendants, stop_processes
from .ray_local import _connected_address, _disconnect, _remove_tree

#: name -> the head this process started under that name and has not stopped yet.
RUNNING: dict[str, Head] = {}
#: Ray's autoscaler monitor writes what ``ray status`` shows every ``AUTOSCALER_UPDATE_INTERVAL_S``
#: (Ray's default: 5 s); every second makes a new head's first report, and so its readiness, come sooner.
HEAD_ENV = {"AUTOSCALER_UPDATE_INTERVAL_S": "1"}


def ray_cli() -> list[str]:
    """The ``ray`` command of this Python environment."""
    exe = Path(sys.executable).with_name("ray")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


def port_is_free(port: int) -> bool:
    """True if a TCP socket can bind ``port`` on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


@dataclasses.dataclass(eq=False)
class Head:
    """The processes and folder of one ``ray start --head``; kept apart from :class:`LocalRayCluster`
    so that a finalizer can stop them when the last cluster object using them is garbage-collected or
    Python exits."""

    name: str
    settings: tuple[Any, ...] = ()  # (num_cpus, num_gpus, fixed port): a re-run with the same ones reuses it
    temp_dir: str = ""
    port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    tracked: dict[int, Any] = dataclasses.field(default_factory=dict)
    owners: int = 0  # LocalRayCluster objects using this head; the last one collected stops it
    started: bool = False  # `ray start` said "Ray runtime started"
    listed: bool = False  # `ray status` lists the node with its CPUs
    attempt: int = 0
    deadline: float = 0.0
    stopped: bool = False

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def marked(self) -> list[Any]:
        """Every live process of this head's session: ``ray start`` runs in a new session (its pid is the
        session id), and each process of its node stays in it, wherever it is re-parented (gcs_server
        and the raylet may land below this process) and whatever it calls itself (``ray::IDLE``)."""
        import psutil

        found = []
        if self.process is None:
            return found
        for proc in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):  # gone, or not ours
                if os.getsid(proc.pid) == self.process.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        return found

    def track(self) -> None:
        """Remember every process of this head (one re-parented after a crash is still found)."""
        if self.process is not None:
            self.tracked.update({p.pid: p for p in [*descendants(self.process.pid), *self.marked()]})

    def stop_processes(self, grace_s: float = 30.0) -> None:
        """SIGTERM to ``ray start --block`` (it then stops its node), then whatever is left, by pid."""
        if self.process is None:
            return
        self.track()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        stop_processes([self.process, *self.tracked.values()], grace_s=5.0)
        self.tracked = {}
        # a worker the raylet started while the node was stopping is in no list above: wait for them all
        deadline = time.monotonic() + 15.0
        while (left := self.marked()) and time.monotonic() < deadline:
            stop_processes(left, grace_s=2.0)

    def release(self) -> None:
        """One owner is gone (garbage-collected, or Python exits); the last one stops the head."""
        self.owners -= 1
        if self.owners <= 0:
            self.stop()

    def stop(self, grace_s: float = 30.0) -> None:
        """Disconnect this process if it is connected here, stop the head, delete its folder. Idempotent."""
        if self.stopped:
            return
        self.stopped, self.started, self.listed = True, False, False
        if RUNNING.get(self.name) is self:
            del RUNNING[self.name]
        try:
            if self.port is not None and _connected_address() == self.address:
                _disconnect()
        finally:
            try:
                self.stop_processes(grace_s)
            finally:
                if self.temp_dir:
                    _remove_tree(self.temp_dir)


def _not_connected() -> str:
    """Why ``ray.init()`` without an address is refused, and which notebook cell to run instead."""
    running = [head for head in RUNNING.values() if head.alive()]
    if running:
        where = ", ".join(f"{head.name!r} at {head.address}" for head in running)
        return (
            f"this process is not connected to its Ray cluster ({where}), so Ray Tune (or a ray.get / "
            "@ray.remote call) would start a second Ray of its own beside it. Run the cell with "
            "`runtime = cluster.connect()` first (notebook 06b: section 1; 08: section 4): after the cell "
            "that starts the cluster was edited or run again, its connect cell must run again too."
        )
    return (
        "this process's Ray cluster is not running (stopped, or it failed to start), so Ray Tune (or a "
        "ray.get / @ray.remote call) would start a Ray of its own that nothing stops. Run the cell that "
        "starts it, `cluster = tuning.LocalRayCluster(...).start(...)`, then the one with "
        "`runtime = cluster.connect()`; for a Ray inside this process use `with tuning.local_ray(): ...`."
    )


def guard_auto_init(ray: Any) -> None:
    """Make ``ray.init()`` without an address refuse, saying which cell to run (:func:`_not_connected`).

    It is what Ray Tune (``Tuner.fit``, ``tune.run``), ``ray.get``, ``ray.put`` and ``.remote()`` call
    when this process is not connected: Ray would start a private instance with a second raylet and
    leave its session folder in /tmp/ray. Installed by ``LocalRayCluster.start`` (a
    process that runs its own cluster); an explicit address (``"local"`` from :func:`.local_ray`, a
    cluster's from ``connect``) or ``RAY_ADDRESS`` in the environment pass unchanged.
    """
    if getattr(ray.init, "mgpu_guard", False):
        return
    start = ray.init

    @functools.wraps(start)
    def init(address: str | None = None, **kwargs: Any) -> Any:
        if address is None and not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
            raise RuntimeError(_not_connected())
        return start(address, **kwargs)

    init.mgpu_guard = True  # type: ignore[attr-defined]
    ray.init = init
