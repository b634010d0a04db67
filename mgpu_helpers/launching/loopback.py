"""Used by notebooks 01, 02a, 02b, 04a, 04b, 05b and 07b (every ``launch`` and ``run_torchrun`` job):
keeping a job on this machine on 127.0.0.1 — its rendezvous store and its collectives' sockets.

* **Stores.** A process group starts with a key-value store, :class:`torch.distributed.TCPStore`: one
  process hosts it, every rank connects to it. In torch 2.13 the server *ignores* ``host_name`` when
  binding and listens on every interface (``[::]:PORT``); neither torchrun's options
  (``--master-addr``, ``--rdzv-endpoint``, ``--local-addr``, ``--rdzv-conf``) nor an environment
  variable changes that. The one way to choose the address is ``master_listen_fd``: hand the store a
  socket that is already bound and listening (libuv backend). :func:`loopback_tcp_store` does that;
  :func:`bind_stores_to_loopback` routes torch's own store creation (torchrun's agent,
  ``init_process_group(init_method="env://")`` in a launched function) through it for stores whose
  host is a loopback address.
* **Collectives.** gloo and NCCL listen on the interface named by ``GLOO_SOCKET_IFNAME`` /
  ``NCCL_SOCKET_IFNAME`` (by default they may pick the machine's public one): :func:`loopback_env`.
"""

from __future__ import annotations

import errno
import functools
import socket
from datetime import timedelta
from typing import Any

from ..processes import LOOPBACK, is_loopback, loopback_interface

__all__ = ["bind_stores_to_loopback", "loopback_env", "loopback_tcp_store"]

_BACKLOG = 2048  # what torch's own TCPStore server asks for


def loopback_env() -> dict[str, str]:
    """Environment variables that keep gloo's and NCCL's sockets on the loopback interface.

    Empty when the loopback interface is unknown (then the libraries choose, as usual).
    """
    iface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface} if iface else {}


def _listening_socket(port: int) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:``port`` (0: the OS picks) and listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        import torch.distributed as dist

        reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
        # A RuntimeError subclass, like torch's own: torchrun's c10d rendezvous then becomes a client.
        raise dist.DistNetworkError(f"port {port} on {LOOPBACK} {reason}") from exc
    return sock


def loopback_tcp_store(
    port: int = 0,
    world_size: int | None = None,
    *,
    timeout: timedelta = timedelta(seconds=300),
    wait_for_workers: bool = False,
    multi_tenant: bool = False,
) -> Any:
    """A ``TCPStore`` server that listens on 127.0.0.1:``port`` only (``port=0``: a free one).

    Pass it to ``dist.init_process_group(backend, store=store, rank=0, world_size=n)``; the other
    ranks connect with ``dist.TCPStore("127.0.0.1", store.port, is_master=False)``.
    """
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an integer in 0..65535 (0: any free port), not {port!r}")
    if not 0 <= port < 65536:
        raise ValueError(f"port must be an integer in 0..65535 (0: any free port), not {port!r}")
    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise ValueError(f"world_size must be None (not checked) or an integer >= 1, not {world_size!r}")
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"timeout must be a positive datetime.timedelta, not {timeout!r}")
    return _loopback_store_class()(
        LOOPBACK,
        port,
        world_size,
        True,
        timeout,
        wait_for_workers=wait_for_workers,
        multi_tenant=multi_tenant,
    )


@functools.cache
def _loopback_store_class() -> type:
    """The ``TCPStore`` subclass (made once, on first use, so importing this module stays cheap)."""
    import torch.distributed as dist

    class LoopbackTCPStore(dist.TCPStore):  # type: ignore[misc, name-defined]
        """``TCPStore`` whose server, when its host is a loopback address, listens on 127.0.0.1 only."""

        def __init__(
            self,
            host_name: str,
            port: int,
            world_size: int | None = None,
            is_master: bool = False,
            timeout: timedelta = timedelta(seconds=300),
            wait_for_workers: bool = True,
            multi_tenant: bool = False,
            master_listen_fd: int | None = None,
            use_libuv: bool = True,
        ) -> None:
            if is_master and master_listen_fd is None and is_loopback(host_name):
                sock = _listening_socket(port)
                port, master_listen_fd, use_libuv = sock.getsockname()[1], sock.fileno(), True
                try:
                    super().__init__(
                        host_name, port, world_size, True, timeout, wait_for_workers, multi_tenant,
                        master_listen_fd, use_libuv,
                    )  # fmt: skip
                except BaseException:
                    sock.close()
                    raise
                sock.detach()  # the store's server owns the descriptor now and closes it
                return
            super().__init__(
                host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant,
                master_listen_fd, use_libuv,
            )  # fmt: skip

    return LoopbackTCPStore


# Modules of torch that create TCPStore servers through their own name ``TCPStore``; the elastic agent's
# dynamic rendezvous and ``elastic.utils.distributed`` use ``torch.distributed.TCPStore``.
_STORE_MODULES = (
    "torch.distributed",
    "torch.distributed.rendezvous",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)


def bind_stores_to_loopback() -> list[str]:
    """Make every ``TCPStore`` server torch creates in *this process* listen on 127.0.0.1 when its host
    is a loopback address (``127.0.0.1``, ``localhost``, ``::1``); other hosts are left as they are.

    Replaces the name ``TCPStore`` in the torch modules that create stores (rendezvous handlers behind
    ``init_process_group``, torchrun's static and c10d rendezvous). Called in the children of
    :func:`~mgpu_helpers.launching.launch` and in the torchrun agents of
    :func:`~mgpu_helpers.launching.run_torchrun`; never in the notebook's own process. Returns the
    modules patched. Raises ``RuntimeError`` if torch no longer has one of them (then the job would
    silently listen on every interface).
    """
    import importlib

    cls = _loopback_store_class()
    original = cls.__mro__[1]
    patched = []
    for name in _STORE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise RuntimeError(f"cannot bind stores to loopback: torch has no module {name} ({exc})") from exc
        current = getattr(module, "TCPStore", None)
        if current is original:
            module.TCPStore = cls
            patched.append(name)
        elif current is not cls:
            raise RuntimeError(f"cannot bind stores to loopback: {name}.TCPStore is {current!r}")
    return patched
