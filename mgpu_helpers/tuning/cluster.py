"""Used by notebook 06b (Ray Tune and ASHA), sections 1 and 4: a real Ray cluster head on 127.0.0.1.

:class:`LocalRayCluster` runs ``ray start --head --block`` as a child process that this Python
process owns and stops by its session (``ray start`` runs in a new one, and every process of its node
stays in it; plain ``ray stop`` would stop every Ray instance of this user: another notebook's, a
test's). Re-running notebook cells in any order is safe:

* a cluster started under the ``name`` of a running one (a re-run of the cell that starts it) reuses
  it when ``num_cpus``, ``num_gpus`` and ``port`` are the same, and the connection stays; with other
  settings (an edited cell) it stops the old one first, disconnecting this process from it;
* :meth:`~LocalRayCluster.connect` returns the current connection if it is to this cluster, and
  closes a connection to any other cluster first;
* every cluster and connection of this process use one environment and authentication token
  (:mod:`.ray_local`), which is never withdrawn while Ray is connected;
* once a cluster was started, Tune run while this process is not connected (the start cell re-run,
  the connect cell not) raises, naming the cell to run, instead of starting a second Ray of its own
  (:func:`._head.guard_auto_init`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from .._checks import real, text, whole
from ..processes import LOOPBACK, die_with_parent, free_port, temp_prefix
from . import _head
from ._optional import require, require_installed
from .ray_local import (
    STARTUP_ATTEMPTS,
    RayRuntime,
    _connected_address,
    _disconnect,
    _in_local_ray_block,
    _ray_init_kwargs,
    _session_environment,
    _use_session_environment,
    _wait_for_node,
)


class LocalRayCluster:
    """A real Ray cluster head on 127.0.0.1, started with ``ray start --head`` and owned by this process.

    ``start()`` runs ``ray start --head --node-ip-address=127.0.0.1 --port=<free port>
    --include-dashboard=false --num-cpus=N --block`` as a child process (``--block`` keeps the
    command alive as the owner of the head's processes); ``connect()`` is
    ``ray.init(address="127.0.0.1:<port>")`` — exactly how a driver joins any cluster — and
    ``status()`` runs ``ray status``. ``stop()`` disconnects and then stops *this* head by its
    process id. A cluster object that is garbage-collected, or still running when Python exits, is
    stopped too. Works as a context manager.

    Args:
        num_cpus: CPUs the head offers to trials, >= 1.
        num_gpus: GPUs it offers (``None``: detect).
        port: the head's GCS port (``None``: a free one).
        name: one running cluster per name in this process: starting another one with the same name
            reuses the running head if the settings match, else stops it first (so re-running the
            notebook cell that starts it leaves no orphan head).
        startup_timeout: seconds to wait for the head to be up (its node listed by ``ray status``).
        attempts: how often to try a start whose raylet timed out (Ray allows it 30 s).
    """

    def __init__(
        self,
        num_cpus: int = 2,
        num_gpus: int | None = None,
        *,
        port: int | None = None,
        name: str = "notebook",
        startup_timeout: float = 180.0,
        attempts: int = STARTUP_ATTEMPTS,
    ) -> None:
        self.num_cpus = whole("num_cpus", num_cpus, 1, "2")
        self.num_gpus = None if num_gpus is None else whole("num_gpus", num_gpus, 0, "0, 1 or None (detect)")
        if port is not None:
            port = whole("port", port, 1024, "6379, or None to pick a free one")
            if port > 65535:
                raise ValueError(f"port must be <= 65535 (or None to pick a free one), not {port}")
        self._port = port
        self.name = text("name", name, "notebook")
        self.startup_timeout = real("startup_timeout (s)", startup_timeout, 0.0, open_low=True, example="180")
        self.attempts = whole("attempts", attempts, 1, "3")
        self._head = _head.Head(self.name)
        self._finalizer: weakref.finalize | None = None

    def __repr__(self) -> str:
        state = (
            "not started"
            if self._head.process is None
            else "stopped"
            if self._head.stopped
            else ("running" if self._head.alive() else "exited")
        )
        where = f", address={self.address!r}" if self._head.port is not None else ""
        return f"LocalRayCluster(name={self.name!r}, num_cpus={self.num_cpus}{where}, {state})"

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` of the head's GCS, the address drivers and other nodes use."""
        if self._head.port is None:
            raise RuntimeError("the cluster is not started: call start() first")
        return self._head.address

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The ``ray start --head --block`` child process (``None`` before :meth:`start`)."""
        return self._head.process

    @property
    def temp_dir(self) -> str:
        """Ray's logs and sockets of this head (made by :meth:`start`, deleted by :meth:`stop`)."""
        return self._head.temp_dir

    def start_command(self) -> list[str]:
        """The ``ray start --head …`` command line (as run; without ``--block`` it returns at once)."""
        port = self._head.port if self._head.port is not None else self._port or "<port>"
        cmd = [
            "ray",
            "start",
            "--head",
            f"--node-ip-address={LOOPBACK}",
            f"--port={port}",
            "--include-dashboard=false",
            f"--num-cpus={self.num_cpus}",
        ]
        if self.num_gpus is not None:
            cmd.append(f"--num-gpus={self.num_gpus}")
        # No log monitor: it only forwards workers' prints to drivers, and connect() hides them.
        return [
            *cmd,
            f"--temp-dir={self.temp_dir or '<temp-dir>'}",
            "--include-log-monitor=false",
            "--disable-usage-stats",
            "--block",
        ]

    def start(self, wait: bool = True) -> LocalRayCluster:
        """Run ``ray start --head``; with ``wait`` (the default) block until it is up (see :meth:`wait`).

        ``start(wait=False)`` returns at once, so the head can boot while other work runs;
        :meth:`connect` and :meth:`status` wait for it. Starting a running cluster does nothing. A
        running cluster of this process with the same ``name`` is reused if it has the same
        ``num_cpus``, ``num_gpus`` and ``port`` (re-running the notebook cell keeps cluster and
        connection), else stopped first (disconnecting this process from it).
        """
        if not isinstance(wait, bool):
            raise TypeError(f"wait must be True or False, not {wait!r}")
        require_installed("ray", "LocalRayCluster.start")
        _head.guard_auto_init(require("ray", "LocalRayCluster.start"))  # no second Ray of Tune's own
        if self._head.alive() and not self._head.stopped:
            return self.wait() if wait else self
        settings = (self.num_cpus, self.num_gpus, self._port)
        previous = _head.RUNNING.get(self.name)
        if previous is not None and previous.settings == settings and previous.alive():
            self._attach(previous)
            return self.wait() if wait else self
        if previous is not None:
            previous.stop()
        if self._port is not None and not _head.port_is_free(self._port):
            raise RuntimeError(f"port {self._port} is in use on {LOOPBACK}; pass port=None for a free one")
        temp_dir = tempfile.mkdtemp(prefix=temp_prefix("rayc"))
        head = _head.Head(self.name, settings, temp_dir=temp_dir, attempt=1)
        _head.RUNNING[self.name] = head
        self._attach(head)
        self._launch()
        return self.wait() if wait else self

    def _attach(self, head: _head.Head) -> None:
        """Use ``head`` from now on; the head is stopped when its last owner is garbage-collected."""
        if self._finalizer is not None:
            self._finalizer.detach()
        self._head.stop()  # leftovers of an earlier start of this object that exited (no-op otherwise)
        head.owners += 1
        self._head = head
        self._finalizer = weakref.finalize(self, head.release)

    def _launch(self) -> None:
        head = self._head
        head.port = self._port if self._port is not None else free_port(LOOPBACK)
        head.deadline = time.monotonic() + self.startup_timeout
        with open(self.log_path, "wb") as log:
            head.process = subprocess.Popen(
                _head.ray_cli() + self.start_command()[1:],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **_session_environment(), **_head.HEAD_ENV},
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def wait(self) -> LocalRayCluster:
        """Block until the head is up: ``ray start`` reported it and ``ray status`` lists its node.

        A start whose raylet timed out is retried (up to ``attempts`` times).

        Raises:
            RuntimeError: with the end of ``ray start``'s output and what to do, after stopping
                everything this object started, if the head exited or did not come up in time.
        """
        return self._wait(listed=True)

    def _wait(self, listed: bool) -> LocalRayCluster:
        """:meth:`wait`; with ``listed=False`` only until ``ray start`` reported the head started."""
        head = self._head
        if head.process is None:
            raise RuntimeError("the cluster is not started: call start() first")
        if head.stopped:
            raise RuntimeError("the cluster was stopped: call start() to start it again")
        while not (head.listed or (head.started and not listed)):
            why = self._wait_once(listed)
            if why is None:
                break
            tail = "\n".join(self.log().splitlines()[-15:])
            head.stop_processes()
            if head.attempt >= self.attempts or "timed out" not in tail:
                attempt = head.attempt
                self.stop()
                raise RuntimeError(
                    f"`ray start --head` {why} (attempt {attempt} of {self.attempts}). If the machine is "
                    "busy, close other notebooks or pass a larger startup_timeout, then start it again. "
                    f"Its last output:\n{tail}"
                )
            head.attempt += 1
            self._launch()
        if not head.alive():
            code = head.process.returncode
            self.stop()
            raise RuntimeError(f"the cluster's head exited (code {code}); call start() to start a new one")
        return self

    def _wait_once(self, listed: bool) -> str | None:
        """Poll the running ``ray start`` until it is started (and listed); ``None``, or what went wrong."""
        head = self._head
        process = head.process
        assert process is not None
        while not head.started:
            if "Ray runtime started" in self.log():
                head.started = True
                head.track()
            elif process.poll() is not None:
                return f"exited with code {process.returncode}"
            elif time.monotonic() > head.deadline:
                return f"did not start within {self.startup_timeout:.0f} s"
            else:
                time.sleep(0.2)
        while listed and not head.listed:  # the autoscaler's first report; before it: "No cluster status"
            code, answer = self._ray_status(max(1.0, head.deadline - time.monotonic()))
            if code == 0 and "Active:" in answer and f"/{float(self.num_cpus)} CPU" in answer:
                head.listed = True
            elif process.poll() is not None:
                return f"exited with code {process.returncode}"
            elif time.monotonic() > head.deadline:
                limit = f"{self.startup_timeout:.0f} s"
                return f"was not listed by `ray status` within {limit} (it said: {answer[-300:]!r})"
            else:
                time.sleep(0.5)
        return None

    def _ray_status(self, timeout: float) -> tuple[int, str]:
        try:
            res = subprocess.run(
                [*_head.ray_cli(), "status", f"--address={self._head.address}"],
                capture_output=True,
                text=True,
                env={**os.environ, **_session_environment()},
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return -1, f"`ray status` did not answer within {timeout:.0f} s"
        return res.returncode, res.stdout if res.returncode == 0 else res.stdout + res.stderr

    @property
    def log_path(self) -> Path:
        """Where ``ray start``'s output goes (inside :attr:`temp_dir`)."""
        return Path(self.temp_dir) / "ray-start.log"

    def log(self) -> str:
        """What ``ray start`` printed so far."""
        return self.log_path.read_text(errors="replace") if self.temp_dir and self.log_path.exists() else ""

    def connect(self, quiet: bool = True) -> RayRuntime:
        """``ray.init(address=self.address)`` in this process (waits for the head to start first).

        Connected here already: returns the runtime again. Connected to another cluster: that
        connection is closed first (``ray.shutdown()``; that cluster keeps running). ``quiet`` hides
        Ray's info messages.
        """
        init_kwargs = _ray_init_kwargs(quiet)
        self._wait(listed=False)  # ray.init polls the GCS itself; the node count is polled below
        ray = require("ray", "LocalRayCluster.connect")
        current = _connected_address()
        if current != self.address:
            if current is not None and _in_local_ray_block():
                raise RuntimeError("this process runs Ray in a local_ray block; leave it before connecting")
            _disconnect()
            _use_session_environment()
            ray.init(address=self.address, **init_kwargs)
        _wait_for_node(ray, self.startup_timeout, f"the cluster at {self.address}")
        self._head.track()
        return RayRuntime(
            address=self.address,
            node_ip=ray.util.get_node_ip_address(),
            resources=dict(ray.cluster_resources()),
            pids=sorted(self._head.tracked),
            temp_dir=self.temp_dir,
        )

    def status(self, timeout: float = 120.0) -> str:
        """Output of ``ray status --address=127.0.0.1:<port>`` (nodes, resources in use, demands).

        Asked again every half second, up to ``timeout`` seconds, until it holds a cluster status.
        """
        timeout = real("timeout (seconds)", timeout, 0.0, open_low=True, example="120")
        self._wait(listed=False)
        deadline = time.monotonic() + timeout
        while True:
            code, answer = self._ray_status(max(1.0, deadline - time.monotonic()))
            if code == 0 and "Active:" in answer:
                return answer
            if not self._head.alive():
                self._wait(listed=False)  # raises, saying that the head exited
            if time.monotonic() > deadline:
                raise RuntimeError(f"`ray status` had no cluster status in {timeout:.0f} s:\n{answer}")
            time.sleep(0.5)

    def second_machine_commands(self, head_ip: str = "<head-ip>") -> list[str]:
        """What to type to grow this into a two-machine cluster (on a network, not on loopback)."""
        head_ip = text("head_ip", head_ip, "192.168.1.10")
        port = self._head.port or self._port or 6379
        return [
            f"# on the head machine (its address on the network, e.g. {head_ip}):",
            "export RAY_AUTH_MODE=token   # token authentication (Ray >= 2.52; the default only from 2.61)",
            "export RAY_AUTH_TOKEN=<secret>   # one token for every node: `ray get-auth-token --generate`",
            f"ray start --head --node-ip-address={head_ip} --port={port} --include-dashboard=false",
            "# on the second machine (same Python, same Ray and torch versions):",
            "export RAY_AUTH_MODE=token",
            "export RAY_AUTH_TOKEN=<secret>",
            f"ray start --address={head_ip}:{port}",
            "# anywhere in the cluster:",
            f"ray status --address={head_ip}:{port}",
            f"python -c \"import ray; ray.init(address='{head_ip}:{port}')\"  # then Tuner(...).fit()",
            "# when done, on every machine:",
            "ray stop",
        ]

    def stop(self, grace: float = 30.0) -> None:
        """Disconnect (if connected here), stop this head, wait until no process of its session is left,
        and delete its folder. Safe to call again, or before :meth:`start`."""
        grace = real("grace (seconds)", grace, 0.0, example="30")
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._head.stop(grace)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
