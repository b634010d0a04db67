"""Used by notebook 06b (Ray Tune and ASHA) through :class:`~mgpu_helpers.tuning.LocalRayCluster`:
the processes and folder of one ``ray start --head``, how to stop them, and which heads run.

Kept apart from the cluster object so that a ``weakref.finalize`` can stop a head when its
``LocalRayCluster`` is garbage-collected (a notebook cell re-run rebinds the name) or Python exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import subprocess
import sys
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

    def track(self) -> None:
        """Remember every process below ``ray start`` (one re-parented after a crash is still found)."""
        if self.process is not None:
            self.tracked.update({p.pid: p for p in descendants(self.process.pid)})

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
