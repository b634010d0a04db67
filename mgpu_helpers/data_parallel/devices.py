"""Used by notebooks 03a and 03b (data parallelism). Virtual device names, moving tensors, chunk sizes.

A *virtual device* is a name such as ``"vcuda:1"`` that exists only for memory accounting
(:func:`mgpu_helpers.memory.virtual_device`): a tensor allocated inside ``virtual_device("vcuda:1")``
is counted there by every active :class:`~mgpu_helpers.memory.MemoryTracker`, while its bytes stay in
host memory. Devices are given as ints (``0`` means ``"vcuda:0"``), as virtual names (``"vcuda:1"``) or
as real devices (``"cpu"``, ``"cuda:0"``, a :class:`torch.device`).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from .._checks import whole
from ..memory import active_trackers, current_virtual_device, virtual_device

__all__ = [
    "Device",
    "chunk_sizes",
    "current_device",
    "device_name",
    "to_device",
    "virtual_device_of",
]

_PREFIX = "vcuda"  # virtual devices are named f"{_PREFIX}:{index}": vcuda:0, vcuda:1, ...
_VIRTUAL_NAME = re.compile(rf"{_PREFIX}:\d+")

#: What the functions of this package accept as a device.
Device = int | str | torch.device


def device_name(device: Device) -> str:
    """The name a device is accounted under: ``0 -> "vcuda:0"``, ``"vcuda:1"``, real ones as ``str()``.

    Raises ``TypeError`` for anything but an int, a str or a :class:`torch.device`, and ``ValueError`` for
    a negative index or a string that is neither ``"vcuda:<index>"`` nor a device torch knows.
    """
    if isinstance(device, bool) or not isinstance(device, int | str | torch.device):
        raise TypeError(
            f"cannot read {device!r} as a device: pass an int index (0 -> 'vcuda:0'), a name such as "
            "'vcuda:1' or 'cpu', or a torch.device"
        )
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"a device index must be >= 0, not {device}: use 0 for 'vcuda:0'")
        return f"{_PREFIX}:{device}"
    if isinstance(device, torch.device):
        return str(device)
    if device.startswith(_PREFIX):
        if not _VIRTUAL_NAME.fullmatch(device):
            raise ValueError(f"virtual device names look like '{_PREFIX}:1', not {device!r}")
        return device
    try:
        return str(torch.device(device))
    except RuntimeError:
        raise ValueError(
            f"{device!r} is not a device: use an int index, a virtual name such as '{_PREFIX}:1', "
            "or a real device such as 'cpu' or 'cuda:0'"
        ) from None


def _is_virtual(name: str) -> bool:
    return name.startswith(_PREFIX + ":")


def _device_list(devices: Any, what: str = "devices") -> list[str]:
    """Names of a non-empty sequence of distinct devices; clear errors for anything else."""
    if isinstance(devices, str | bytes | torch.device) or not hasattr(devices, "__iter__"):
        raise TypeError(f"{what} must be a list of devices such as [0, 1], not {devices!r}")
    names = [device_name(d) for d in devices]
    if not names:
        raise ValueError(f"{what} is empty: give at least one device, e.g. [0, 1]")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must be distinct, got {names}: list every device once")
    return names


def current_device() -> str | None:
    """The virtual device this thread is working on (inside ``virtual_device(name)``), else ``None``.

    The virtual counterpart of ``torch.cuda.current_device()``: inside :func:`parallel_apply`, each
    replica's thread sees its own device.
    """
    return current_virtual_device()


def virtual_device_of(tensor: Tensor) -> str | None:
    """The device an active :class:`~mgpu_helpers.memory.MemoryTracker` counts ``tensor``'s storage under.

    ``None`` means no active tracker knows the storage (for example, no tracker is running). Views share
    their base's storage and so its device.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"virtual_device_of needs a torch.Tensor, not {type(tensor).__name__}")
    for tracker in active_trackers():
        device = tracker.device_of(tensor)
        if device is not None:
            return device
    return None


def _label(tensor: Tensor, category: str) -> None:
    """Count ``tensor`` under ``category`` in every active tracker (replica weights are parameters too)."""
    for tracker in active_trackers():
        tracker.classify(tensor, category)


def _copy_to(tensor: Tensor, name: str | None) -> Tensor:
    """A contiguous copy of ``tensor`` allocated on (virtual) device ``name``."""
    if name is None:
        return tensor.clone(memory_format=torch.contiguous_format)
    with virtual_device(name):
        return tensor.clone(memory_format=torch.contiguous_format)


def _move(tensor: Tensor, source: str | None, target: str | None) -> Tensor:
    """``tensor.to(target)`` across virtual devices: the tensor itself when already there, else a copy."""
    if source is not None and source == target:
        return tensor
    return _copy_to(tensor, target)


def to_device(tensor: Tensor, device: Device) -> Tensor:
    """``tensor.to(device)`` for real devices; for a virtual device, a copy allocated there.

    Use it as the virtual ``x.cuda()``: ``x = to_device(x, "vcuda:0")``. Like ``.to()``, it returns
    ``tensor`` itself when it already lives on that device.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"to_device moves a torch.Tensor, not {type(tensor).__name__}")
    name = device_name(device)
    if not _is_virtual(name):
        return tensor.to(name)
    return _move(tensor, virtual_device_of(tensor), name)


def chunk_sizes(length: int, n_devices: int) -> list[int]:
    """Sizes of ``torch.chunk(tensor_of_that_length, n_devices)``, i.e. of what scatter hands out.

    Every chunk has ``ceil(length / n_devices)`` items except the last, so fewer than ``n_devices``
    chunks can come out: ``chunk_sizes(30, 2) == [15, 15]``, ``chunk_sizes(10, 4) == [3, 3, 3, 1]``,
    ``chunk_sizes(5, 4) == [2, 2, 1]`` (three devices get work, the fourth none).
    """
    whole("length (the batch size)", length, 1, hint=": an empty batch cannot be split")
    whole("n_devices", n_devices, 1, hint=": data parallelism needs at least one device")
    step = -(-length // n_devices)
    return [min(step, length - start) for start in range(0, length, step)]
