"""Used by notebooks 04a, 04b, 06b and 08 directly, and by every notebook that starts processes (01, 02a,
02b, 04a, 04b, 05b, 06b, 07a, 07b) through
:mod:`mgpu_helpers.launching`, :mod:`mgpu_helpers.tuning` and :mod:`mgpu_helpers.troubleshoot`, and by
the test suite's leftover-process check (``conftest.py``).

Processes and ports on one machine: the single place that picks a free port, keeps traffic on
loopback, stops a process tree, and ties a child's life to its parent (``die_with_parent`` for the
children this package starts itself, a :class:`Watchdog` for those another library starts).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

#: The only address local jobs (rendezvous stores, gloo, Ray) listen on.
LOOPBACK = "127.0.0.1"


#: free_port draws from [PORT_FLOOR, PORT_CEILING), below the OS's ephemeral range, from which every
#: outgoing connection and every bind to port 0 takes a port; below Kubernetes' NodePorts (30000-32767),
#: and never within TORCHRUN_PORTS of torchrun's default 29500 (a job started by hand in a terminal).
PORT_FLOOR, PORT_CEILING = 20000, 30000
TORCHRUN_PORTS = range(29400, 29601)
_PORTS = random.SystemRandom()  # the OS's randomness: no seed a notebook sets, no state a fork copies


def _ephemeral_start() -> int:
    """First port of the OS's ephemeral range (Linux: /proc; elsewhere Linux's default, 32768, which is
    below macOS's and Windows' 49152)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now, drawn at random below the ephemeral range (see
    PORT_FLOOR).

    Between this call and the moment a server binds the port, another process could take it. A port the
    OS hands out (port 0) comes from the ephemeral range, as does the local port of every outgoing
    connection — on a busy machine (gloo meshes, Ray, Jupyter kernels) one of those can land on it. Below
    that range only a process that asks for that very port can; the OS's pick is the fallback when the
    range leaves no room below it. Servers should still retry with a new port if binding fails.
    """
    if not isinstance(host, str) or not host:
        raise TypeError(f"host must be an address string such as '127.0.0.1', not {host!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    top = min(_ephemeral_start(), PORT_CEILING)
    for _ in range(50 if top - PORT_FLOOR >= 1000 else 0):
        port = _PORTS.randrange(PORT_FLOOR, top)
        if port in TORCHRUN_PORTS:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:  # in use (or in TIME_WAIT): draw again
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def loopback_interface() -> str | None:
    """Name of the network interface holding 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS), if known."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(getattr(a, "address", None) == LOOPBACK for a in addrs):
                return name
    except Exception:  # psutil missing or unsupported platform: let gloo choose
        return None
    return None


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ``::1``, IPv4-mapped loopback (``::ffff:127.0.0.1``) and ``localhost``.

    >>> is_loopback("127.0.0.1"), is_loopback("::"), is_loopback("localhost")
    (True, False, True)
    """
    if not isinstance(address, str):
        raise TypeError(f"address must be a string such as '127.0.0.1', not {type(address).__name__}")
    text = address.strip().strip("[]").split("%", 1)[0]
    if text.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(
            f"{address!r} is not an IP address; pass one such as '127.0.0.1' or '::1' (or 'localhost')"
        ) from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def descendants(root: int | None = None) -> list[Any]:
    """Every live process below ``root`` (default: this process), as ``psutil.Process`` objects."""
    import psutil

    try:
        procs = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def listening_addresses(root: int | None = None) -> list[tuple[str, int, str]]:
    """``(ip, port, process name)`` of every listening TCP socket of ``root`` and its descendants.

    A job is loopback-only when ``all(is_loopback(ip) for ip, _, _ in listening_addresses(pid))``.
    """
    import psutil

    found = []
    try:
        me = psutil.Process(root)
    except psutil.NoSuchProcess:
        return []
    for p in [me, *descendants(root)]:
        try:
            # psutil 6.0 renamed connections() to net_connections(); Colab and Kaggle ship 5.9.5.
            conns = (p.net_connections if hasattr(p, "net_connections") else p.connections)(kind="inet")
            name = p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(c.laddr.ip, c.laddr.port, name) for c in conns if c.status == psutil.CONN_LISTEN]
    return sorted(set(found))


def stop_processes(procs: Iterable[Any], grace_s: float = 3.0) -> list[int]:
    """Stop processes and everything they started: SIGTERM, wait ``grace_s``, then SIGKILL; reap them.

    ``procs`` holds pids, ``psutil.Process``, ``subprocess.Popen`` or ``multiprocessing.Process``
    objects. Descendants are collected *before* anything is signalled, so grandchildren whose parent
    dies first are still found. Returns the pids that had to be killed. The one way this package
    stops a process tree: notebook launches, torchrun jobs, Ray clusters and the tests all use it.
    """
    import psutil

    if grace_s < 0:
        raise ValueError(f"grace_s must be >= 0 seconds, not {grace_s}")
    procs = list(procs)
    targets: dict[int, Any] = {}
    for item in procs:
        pid = item if isinstance(item, int) else getattr(item, "pid", None)
        if pid is None:
            continue
        try:
            proc = psutil.Process(pid)
            tree = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            targets.setdefault(p.pid, p)
    alive = []
    for p in targets.values():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.terminate()
            alive.append(p)
    gone, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.kill()
    gone += psutil.wait_procs(still, timeout=max(grace_s, 1.0))[0]
    # psutil reaped our direct children, so their Popen / multiprocessing objects can no longer learn
    # the exit status themselves (Popen would report 0): hand it over.
    codes = {p.pid: getattr(p, "returncode", None) for p in gone}
    for item in procs:
        code = codes.get(getattr(item, "pid", None))
        if code is None:
            continue
        holder = getattr(item, "_popen", None) or item  # multiprocessing.Process keeps it in _popen
        if getattr(holder, "returncode", 0) is None:
            holder.returncode = code
    return [p.pid for p in still]


def temp_prefix(kind: str) -> str:
    """Prefix for a temp folder of this process: ``mgpu-<kind>-<pid>-`` (pass it to ``tempfile``).

    A kernel that is killed runs no cleanup, so its folders stay behind; each call first removes the
    ``mgpu-<kind>-<pid>-*`` folders whose process is gone. The one naming rule for the package's temp
    folders (launch results, torchrun scratch, capped children, Ray sessions).
    """
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z0-9]+", kind):
        raise ValueError(f"kind must be a short lowercase word such as 'launch', not {kind!r}")
    remove_orphaned_temp_dirs(kind)
    return f"mgpu-{kind}-{os.getpid()}-"


def remove_orphaned_temp_dirs(kind: str, folder: str | None = None) -> list[str]:
    """Delete ``mgpu-<kind>-<pid>-*`` folders in ``folder`` (default: the temp dir) whose process is gone.

    Returns the paths removed. Folders of live processes, and names without a pid, are left alone.
    """
    import psutil

    folder = folder or tempfile.gettempdir()
    pattern = re.compile(rf"mgpu-{re.escape(kind)}-(\d+)-")
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = pattern.match(name)
        if match and not psutil.pid_exists(int(match.group(1))):
            path = os.path.join(folder, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


#: glibc's ``mallopt`` parameter numbers (malloc.h).
_MALLOPT = {"trim_threshold": -1, "mmap_threshold": -3, "arena_max": -8}


def tune_malloc(*, trim: bool = False, **options: int) -> bool:
    """In a child: set glibc malloc's ``options`` (``mmap_threshold``, ``trim_threshold``, ``arena_max``,
    in bytes or arenas), then give the heap's free top back to the system if ``trim``. The one place
    that talks to the C library's allocator: the launcher's children keep freed blocks for reuse
    (:func:`mgpu_helpers.launching.server.keep_freed_memory`), the capped child makes address space
    track memory in use (:mod:`mgpu_helpers.troubleshoot.capped_child`). Returns False, changing
    nothing, where the C library has no ``mallopt`` (macOS, musl)."""
    import ctypes

    unknown = set(options) - set(_MALLOPT)
    if unknown:
        raise TypeError(f"tune_malloc: unknown option(s) {sorted(unknown)}; known: {sorted(_MALLOPT)}")
    try:
        libc = ctypes.CDLL(None)
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return False
    for name, value in options.items():
        mallopt(_MALLOPT[name], int(value))
    if trim:
        malloc_trim(0)
    return True


def _find_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once in the parent (a forked child should not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # e.g. a libc without prctl
        return None


_PRCTL = _find_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:  # pragma: no cover - runs in a child
    """Ask Linux to send ``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``).

    Pass it as ``preexec_fn=die_with_parent`` to ``subprocess.Popen`` (or call it first thing in a
    child) so that a killed or hard-restarted notebook kernel takes its children with it. A no-op on
    other systems, where the parent's ``finally`` blocks are the only cleanup.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(sig))


class Watchdog:
    """A small process that stops the process trees it is told about when this process dies.

    For children that another library starts, so that ``die_with_parent`` cannot be set on them
    (ipyparallel's controller and engines, each in a session of its own)::

        dog = Watchdog()
        dog.watch(pids)   # as soon as they are started; again for any started later
        ...               # stop them the usual way, then:
        dog.close()       # the watchdog exits and stops nothing

    If this process dies first — even by SIGKILL, which runs no cleanup — the watchdog notices within
    ``poll_s`` (its parent changed, or its pipe closed without :meth:`close`), stops every watched
    process and what it started (:func:`stop_processes`, ``grace_s``), and exits. It runs in a session
    of its own, so the SIGINT or SIGKILL that Jupyter sends to the kernel's process group (interrupt,
    restart) does not reach it, and it holds no resource that outlives it.
    """

    def __init__(self, grace_s: float = 1.5, poll_s: float = 0.2) -> None:
        """Start the watchdog process (a child of this one, about 0.1 s to start)."""
        if not grace_s >= 0 or not poll_s > 0:
            raise ValueError(f"grace_s must be >= 0 and poll_s > 0 seconds, not {grace_s}, {poll_s}")
        code = "import sys; sys.path.insert(0, sys.argv[1]); import mgpu_helpers.processes as p; p._watch()"
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, root, str(os.getpid()), str(grace_s), str(poll_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def watch(self, pids: Iterable[int]) -> None:
        """Add processes (by pid; their descendants are found when they are stopped)."""
        lines = "".join(f"{int(pid)}\n" for pid in pids)
        with contextlib.suppress(OSError, ValueError):  # the watchdog is gone, or closed
            self.process.stdin.write(lines.encode())
            self.process.stdin.flush()

    def close(self, timeout_s: float = 5.0) -> None:
        """Tell the watchdog that all is stopped: it exits without stopping anything. Idempotent."""
        if self.process.stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.write(b"stop\n")
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_processes([self.process], grace_s=0)


def _watch() -> None:  # pragma: no cover - runs in the watchdog process
    """The watchdog's loop (:class:`Watchdog`): argv = package root, parent pid, grace_s, poll_s."""
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, grace_s, poll_s = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    watched: dict[int, Any] = {}
    pipe, pending = sys.stdin.fileno(), b""
    while True:
        gone = os.getppid() != parent  # re-parented (to init or a subreaper): the parent is gone
        # Read what the parent wrote, also once it is gone (it may die before this process reads).
        if pipe >= 0 and select.select([pipe], [], [], 0 if gone else poll_s)[0]:
            chunk = os.read(pipe, 4096)
            if not chunk:  # closed: "stop" was sent (and read), or the parent is exiting
                pipe = -1
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line == b"stop":
                    return
                with contextlib.suppress(ValueError, psutil.Error):
                    proc = psutil.Process(int(line))  # kept with its start time: a reused pid is not it
                    watched[proc.pid] = proc
        elif gone:
            break
        elif pipe < 0:
            select.select([], [], [], poll_s)
    stop_processes([p for p in watched.values() if p.is_running()], grace_s=grace_s)
