"""Used by notebook 06b (Ray Tune and ASHA), through :class:`~mgpu_helpers.tuning.LocalRayCluster` and
the graders of its exercises: Ray on this machine only.

The plumbing that notebook 06b leaves out lives here:

* **One environment per Python process** — Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` into a
  module constant and the authentication token into a C++ cache. :func:`_use_session_environment`
  puts this process's settings into ``os.environ`` *for good* (one token per process, never
  restored), so that every cluster this process starts, and every connection it makes, agree — even
  when a notebook cell that starts or joins a cluster is run again (see :mod:`.cluster`).
* :func:`local_ray` — ``ray.init`` inside this process, bound to 127.0.0.1, dashboard off, always
  shut down, its processes stopped by id; :func:`quiet_logs`; :func:`ray_processes`.

Ray is imported inside the functions, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from .._checks import whole
from ..processes import LOOPBACK, descendants, stop_processes, temp_prefix
from ._optional import require

#: Ray gives its raylet a fixed 30 s to register; on a loaded 2-core machine that can be too short.
STARTUP_ATTEMPTS = 3
_SESSION: dict[str, str] = {}
_LOCAL_BLOCK: list[bool] = [False]  # True while a local_ray block runs in this process
_FORCED_INIT_KWARGS = ("address", "include_dashboard", "_node_ip_address", "_temp_dir")


def _session_environment() -> dict[str, str]:
    """The environment variables that keep Ray on this machine and quiet; the same all process long.

    * ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` — Ray reads it when it is imported; on Linux its
      default (1) makes Ray replace ``127.0.0.1`` by the machine's network address, so this is what
      actually keeps every Ray process on loopback;
    * ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` — token authentication, with one token for this
      Python process (the one already in the environment, if any); Ray's default would write
      ``~/.ray/auth_token``. A second machine would need the same token;
    * ``RAY_USAGE_STATS_ENABLED=0`` — no usage reporting (there is no network here anyway).
    """
    if not _SESSION:
        _SESSION.update(
            {
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32),
            }
        )
    return dict(_SESSION)


def _connected_address() -> str | None:
    """The GCS address this process's Ray driver is connected to, or ``None`` (Ray not imported or not up)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().gcs_address)


def _in_local_ray_block() -> bool:
    """True while a :func:`local_ray` block runs in this process."""
    return _LOCAL_BLOCK[0]


def _use_session_environment() -> None:
    """Put :func:`_session_environment` into ``os.environ`` and make an imported Ray agree with it.

    When Ray was imported before (and this process is not connected), its loopback switch and its
    cached authentication token are refreshed. Never refreshed while connected: the connection's
    gRPC channels re-read the cached token, and a cache emptied under them aborts the process in
    Ray's native code (``authentication_token_loader.cc``).
    """
    os.environ.update(_session_environment())
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and getattr(constants, "ENABLE_RAY_CLUSTER", False):
        constants.ENABLE_RAY_CLUSTER = False
    if "ray._raylet" in sys.modules and _connected_address() is None:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _disconnect() -> None:
    """``ray.shutdown()`` if this process is connected to a Ray cluster (the cluster keeps running)."""
    if _connected_address() is not None:
        sys.modules["ray"].shutdown()


@dataclasses.dataclass
class RayRuntime:
    """What :func:`local_ray` or :meth:`LocalRayCluster.connect` started or joined."""

    address: str
    node_ip: str
    resources: dict[str, float]
    pids: list[int]
    temp_dir: str


@contextlib.contextmanager
def quiet_logs(level: int = logging.CRITICAL) -> Iterator[None]:
    """Raise the level of Ray's and Optuna's loggers inside the block (default: CRITICAL only).

    Use it around runs whose trials fail on purpose, whose tracebacks Tune would otherwise log.
    """
    level = whole("level (a logging level such as logging.CRITICAL)", level, 0, "50")
    loggers = [logging.getLogger(name) for name in ("ray", "ray.tune", "ray.train", "optuna")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, lvl in zip(loggers, old, strict=True):
            lg.setLevel(lvl)


def _ray_init_kwargs(quiet: bool) -> dict[str, Any]:
    """``log_to_driver`` and ``logging_level`` for ``ray.init``: quiet hides the workers' output."""
    if not isinstance(quiet, bool):
        raise TypeError(f"quiet must be True or False, not {quiet!r}")
    return {"log_to_driver": not quiet, "logging_level": logging.WARNING if quiet else logging.INFO}


def _wait_for_node(ray: Any, timeout_s: float, what: str) -> None:
    """Poll the GCS until the connected Ray has a live node offering CPUs, for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (any(n.get("Alive") for n in ray.nodes()) and ray.cluster_resources().get("CPU", 0) > 0):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} has no live node with CPUs after {timeout_s:.0f} s; start it again")
        time.sleep(0.2)


def _is_startup_timeout(exc: BaseException) -> bool:
    text = str(exc)
    return "timed out during startup" in text or "Failed to connect to GCS" in text


#: "ray" as a word (``ray::Trainable``, ``.../ray/...``, ``ray start``), not inside another ("array")
_RAY_WORDS = re.compile(r"\bray\b|gcs_server|raylet")


def _is_ray_process(proc: Any) -> bool:
    """True if the ``psutil.Process`` looks like one of Ray's (gcs_server, raylet, ray::…, ray scripts)."""
    try:
        text = proc.name() + " " + " ".join(proc.cmdline()[:3])
    except Exception:  # gone or not ours to inspect
        return False
    return _RAY_WORDS.search(text) is not None


def ray_processes(root: int | None = None) -> list[Any]:
    """Ray's processes among the live descendants of process ``root`` (default: this one)."""
    if root is not None:
        whole("root (a process id)", root, 1)
    return [p for p in descendants(root) if _is_ray_process(p)]


def _remove_tree(path: str) -> None:
    """Delete a Ray temp folder; try again briefly if a process that just exited was still writing."""
    for _ in range(10):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.3)


@contextlib.contextmanager
def local_ray(
    num_cpus: int = 2,
    num_gpus: int | None = None,
    *,
    quiet: bool = True,
    attempts: int = STARTUP_ATTEMPTS,
    **init_kwargs: Any,
) -> Iterator[RayRuntime]:
    """Start Ray inside this process, bound to 127.0.0.1 with the dashboard off; always shut it down.

    ``ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=…)``
    under :func:`_session_environment`. A connection to a cluster (:meth:`LocalRayCluster.connect`,
    ``ray.init(address=…)``) is closed first; the cluster keeps running. On exit — normal or by an
    exception, also one raised by ``ray.init`` itself — ``ray.shutdown()`` runs and any Ray process
    this block started that is still alive is stopped by its process id. ``quiet`` hides the
    workers' output. A start that times out (Ray allows its raylet 30 s, which a busy 2-core
    machine can exceed) is cleaned up and tried again, up to ``attempts`` times. Other keyword
    arguments go to ``ray.init`` (e.g. ``object_store_memory``).

    Raises:
        RuntimeError: inside another ``local_ray`` block, or if Ray did not start in ``attempts`` tries.
    """
    num_cpus = whole("num_cpus", num_cpus, 1, "2")
    if num_gpus is not None:
        num_gpus = whole("num_gpus", num_gpus, 0, "0 or 1 (or None to detect)")
    attempts = whole("attempts", attempts, 1, "3")
    _ray_init_kwargs(quiet)
    forced = sorted(set(init_kwargs) & set(_FORCED_INIT_KWARGS))
    if forced:
        raise TypeError(f"local_ray sets {forced} itself (Ray on 127.0.0.1, no dashboard); leave them out")
    if _in_local_ray_block():
        raise RuntimeError("local_ray blocks cannot be nested: use the runtime of the block already running")
    ray = require("ray", "local_ray")
    import psutil

    _disconnect()
    _use_session_environment()
    # Ray's processes of this block are below the children ray.init starts; a LocalRayCluster's head
    # (an older child) and its workers are left alone.
    before = {p.pid for p in psutil.Process().children()}
    temp_dir = tempfile.mkdtemp(prefix=temp_prefix("ray"))
    seen: dict[int, Any] = {}  # every Ray process seen, so that one re-parented after a crash is found too

    def ours() -> list[Any]:
        new = [p for p in psutil.Process().children() if p.pid not in before and _is_ray_process(p)]
        return new + [d for p in new for d in descendants(p.pid)]

    def look() -> None:
        seen.update({p.pid: p for p in ours()})

    def cleanup() -> None:
        look()
        try:
            ray.shutdown()
        finally:
            look()
            stop_processes(list(seen.values()), grace_s=5.0)

    _LOCAL_BLOCK[0] = True
    try:
        for attempt in range(1, attempts + 1):
            try:
                ray.init(
                    address="local",
                    include_dashboard=False,
                    _node_ip_address=LOOPBACK,
                    num_cpus=num_cpus,
                    num_gpus=num_gpus,
                    _temp_dir=temp_dir,
                    **{**_ray_init_kwargs(quiet), **init_kwargs},
                )
                break
            except Exception as exc:
                cleanup()
                if not _is_startup_timeout(exc):
                    raise RuntimeError(f"Ray did not start: {exc}") from exc
                if attempt == attempts:
                    raise RuntimeError(
                        f"Ray did not start in {attempts} attempts ({exc}); the machine is busy: close other "
                        "notebooks or stop other jobs, then run the cell again"
                    ) from exc
        _wait_for_node(ray, 60.0, "the Ray of local_ray")
        look()
        yield RayRuntime(
            address=ray.get_runtime_context().gcs_address,
            node_ip=ray.util.get_node_ip_address(),
            resources=dict(ray.cluster_resources()),
            pids=sorted(p.pid for p in ours()),
            temp_dir=temp_dir,
        )
    finally:
        _LOCAL_BLOCK[0] = False
        try:
            cleanup()
        finally:
            _remove_tree(temp_dir)
