"""Used by notebooks 03a and 03b (nn.DataParallel on virtual devices, through
:mod:`mgpu_helpers.data_parallel`):
*virtual* devices, i.e. several GPUs simulated on one CPU for the memory tracker.

Inside ``with virtual_device("cuda:1"):`` every storage this thread allocates is counted by the active
:class:`~mgpu_helpers.memory.MemoryTracker` as living on ``"cuda:1"``. This module also keeps the
registry of trackers that are inside their ``with`` block (:func:`active_trackers`), in which threads,
so that a virtual-device block can switch them on in a worker thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["active_trackers", "current_virtual_device", "virtual_device"]

_SCOPE = threading.local()
# id(tracker) -> (tracker, ids of the threads in which it is inside its ``with`` block), in entry order
_ACTIVE: dict[int, tuple[Any, set[int]]] = {}
_ACTIVE_LOCK = threading.Lock()


def virtual_device(name: str) -> contextlib.AbstractContextManager[None]:
    """Count storages allocated by this thread, inside the block, as living on device ``name``.

    This is how the course *simulates* several GPUs on one CPU: run each replica's work in its own
    thread inside ``virtual_device("cuda:1")`` (and so on), and the tracker's per-device numbers are
    what those devices would hold. Outside any block, an operation's outputs inherit the virtual
    device of its inputs (as real devices do: an op on ``cuda:1`` tensors allocates on ``cuda:1``),
    so backward passes and in-place helpers stay attributed correctly. Numbers obtained this way are
    *simulated* and should be labelled so.

    PyTorch's dispatch modes are per thread, so a tracker active in the main thread does not see a
    worker thread's operations; this block also switches every active tracker on in the current
    thread for its duration.

    Args:
        name: the device label to count under, e.g. ``"cuda:1"`` (a non-empty string).
    """
    if not isinstance(name, str):
        raise TypeError(f"virtual_device needs a device name such as 'cuda:1', not {name!r}")
    if not name.strip():
        raise ValueError(f"virtual_device needs a non-empty device name such as 'cuda:1', not {name!r}")
    return _scope(name)


@contextlib.contextmanager
def _scope(name: str) -> Iterator[None]:
    previous = getattr(_SCOPE, "name", None)
    _SCOPE.name = name
    me = threading.get_ident()
    with _ACTIVE_LOCK:
        missing = [tracker for tracker, threads in _ACTIVE.values() if me not in threads]
    with contextlib.ExitStack() as stack:
        for tracker in missing:
            stack.enter_context(tracker)
        try:
            yield
        finally:
            _SCOPE.name = previous


def current_virtual_device() -> str | None:
    """The virtual device this thread is inside (``with virtual_device(name)``), else None."""
    return getattr(_SCOPE, "name", None)


def active_trackers() -> list[Any]:
    """Memory trackers currently inside their ``with`` block, in any thread, in the order they entered."""
    with _ACTIVE_LOCK:
        return [tracker for tracker, _ in _ACTIVE.values()]


def _entered(tracker: Any) -> None:
    """Record that ``tracker`` is now active in the calling thread (called by the tracker)."""
    with _ACTIVE_LOCK:
        _ACTIVE.setdefault(id(tracker), (tracker, set()))[1].add(threading.get_ident())


def _exited(tracker: Any) -> None:
    """Record that ``tracker`` left the calling thread; forget it once no thread has it active."""
    with _ACTIVE_LOCK:
        entry = _ACTIVE.get(id(tracker))
        if entry is not None:
            entry[1].discard(threading.get_ident())
            if not entry[1]:
                del _ACTIVE[id(tracker)]
