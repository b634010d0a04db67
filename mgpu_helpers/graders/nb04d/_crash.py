"""Used by notebook 04d's graders (:mod:`~mgpu_helpers.graders.nb04d`): a machine lost in the middle of
writing a snapshot. :func:`arm_crash` makes the n-th write of a file in a folder — ``torch.save`` to a path,
or a file opened for writing — write half of its bytes and then "die"."""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


class Crash(BaseException):
    """Raised by the dying write of :func:`interrupted_write` (``except Exception`` lets it by)."""


def _raise_crash() -> None:
    raise Crash


def arm_crash(folder: str, nth: int = 2, die: Callable[[], Any] = lambda: os._exit(1)) -> Callable[[], None]:
    """Make the ``nth`` write of a file in ``folder`` write half its bytes, then call ``die``; returns a
    function that undoes the patches."""
    real_open, real_io_open, real_save, writes = builtins.open, io.open, torch.save, [0]
    folder = os.path.abspath(folder)

    def hit(target: Any) -> bool:
        inside = isinstance(target, (str, os.PathLike)) and os.path.abspath(target).startswith(
            folder + os.sep
        )
        writes[0] += inside
        return inside and writes[0] == nth

    class Dying:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def write(self, data: Any) -> None:
            self.handle.write(data[: len(data) // 2])
            self.handle.flush()
            self.handle.close()
            die()

        def __enter__(self) -> Dying:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.handle.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

    def dying_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        return Dying(handle) if set(mode) & set("wax+") and hit(file) else handle

    def dying_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not hit(f):
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        with real_open(f, "wb") as out:
            out.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        die()

    builtins.open = io.open = dying_open  # type: ignore[assignment]
    torch.save = torch.serialization.save = dying_save  # type: ignore[assignment]

    def undo() -> None:
        builtins.open, io.open = real_open, real_io_open
        torch.save = torch.serialization.save = real_save

    return undo


@contextmanager
def interrupted_write(folder: str, nth: int) -> Iterator[None]:
    """In this process: the ``nth`` write in ``folder`` writes half its bytes and raises :class:`Crash`."""
    undo = arm_crash(folder, nth, _raise_crash)
    try:
        yield
    finally:
        undo()
