"""Used by notebooks 01, 02b, 03b, 05b and 07a through the memory tracker: which storages hold a tensor's
data, how the tracker remembers each one, and the replay of its event log under final roles.

Private to :mod:`mgpu_helpers.memory`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .categories import CATEGORIES

# Ops whose output is the very tensor that was passed in but that still mark a "new" tensor:
# ``torch.tensor([...])`` builds its data outside the dispatcher and then calls lift_fresh.
LIFT_OPS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}
# Ops that change the size of an existing storage in place.
RESIZE_OPS = {torch.ops.aten.resize_.default, torch.ops.aten.set_.source_Storage}


@dataclass
class Entry:
    """One live storage the tracker counts."""

    uid: int
    nbytes: int
    device: str  # the label counted under: the real device, or a virtual one
    physical: str  # where the storage really is
    finalizer: weakref.finalize


@dataclass
class Replay:
    """The event log replayed with every storage under its final role."""

    events: list[int]
    rows: list[dict[str, int]]
    peak: dict[str, int]
    peak_total: int
    peak_breakdown: dict[str, int]
    peak_by_device: dict[str, int]
    peak_breakdown_by_device: dict[str, dict[str, int]]


def replay(log: list[tuple[int, int]], category: list[str], device: list[str]) -> Replay:
    """Replay ``log`` ((uid, ±bytes) per event) with each uid under ``category[uid]`` on ``device[uid]``."""
    totals = dict.fromkeys(CATEGORIES, 0)
    by_device: dict[str, dict[str, int]] = {}
    peak = dict.fromkeys(CATEGORIES, 0)
    peak_by_device: dict[str, int] = {}
    at_device_peak: dict[str, dict[str, int]] = {}
    events, rows = [0], [dict(totals)]
    peak_total, peak_breakdown = 0, dict(totals)
    for i, (uid, delta) in enumerate(log, start=1):
        cat, dev = category[uid], device[uid]
        totals[cat] += delta
        row = by_device.setdefault(dev, dict.fromkeys(CATEGORIES, 0))
        row[cat] += delta
        peak[cat] = max(peak[cat], totals[cat])
        dev_total = sum(row.values())
        if dev not in peak_by_device or dev_total > peak_by_device[dev]:
            peak_by_device[dev] = dev_total
            at_device_peak[dev] = dict(row)
        total = sum(totals.values())
        if total > peak_total:
            peak_total, peak_breakdown = total, dict(totals)
        events.append(i)
        rows.append(dict(totals))
    return Replay(events, rows, peak, peak_total, peak_breakdown, peak_by_device, at_device_peak)


def cuda_rounded(nbytes: int) -> int:
    """Size the CUDA caching allocator reserves for a block: at least 512 B, a multiple of 512 B."""
    return max(512, int(math.ceil(nbytes / 512)) * 512) if nbytes > 0 else 0


def storages_of(t: Any) -> list[torch.UntypedStorage]:
    """The storages that really hold ``t``'s data.

    A tensor subclass that wraps other tensors (e.g. FSDP2's ``DTensor``, whose own "storage" has the
    global size) is unwrapped to the tensors it holds (for a ``DTensor``: this rank's local shard).
    """
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return []
    if is_traceable_wrapper_subclass(t):
        inner, _ = t.__tensor_flatten__()
        return [s for name in inner for s in storages_of(getattr(t, name))]
    try:
        storage = t.untyped_storage()
    except (NotImplementedError, RuntimeError):  # e.g. sparse or functional wrapper tensors
        return []
    return [storage] if storage.nbytes() > 0 else []


def storage_of(t: Any) -> torch.UntypedStorage | None:
    """The first storage holding ``t``'s data, or None (meta tensors, empty tensors)."""
    storages = storages_of(t)
    return storages[0] if storages else None


def all_storages(items: Iterable[Any]) -> Iterator[torch.UntypedStorage]:
    """The storages of every tensor among ``items`` (non-tensors are skipped)."""
    for item in items:
        yield from storages_of(item)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every tensor held in ``optimizer.state``."""
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value
