"""Used by notebook 05g (and its graders): this process as ONE rank of a large job.

torch's **fake** process-group backend (the one torchtitan's dry run uses) lets one CPU process join a
job of any size as rank ``r``: every collective returns at once without moving data, so shapes,
placements, DTensor shards and the calls themselves are real while the *values* a collective should have
brought from other ranks are not. :func:`fake_world` joins such a job and always leaves it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist

from .._checks import whole

__all__ = ["fake_world"]


def _fake_store():  # type: ignore[no-untyped-def]
    """torch's in-memory store for the fake backend (importing its module registers the backend)."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as err:  # pragma: no cover - every torch the course supports (2.10+) has it
        raise RuntimeError(
            "this torch has no fake process-group backend (torch.testing._internal.distributed.fake_pg): "
            "the scale lab needs torch 2.10 or newer"
        ) from err
    return FakeStore()


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """Be rank ``rank`` of ``world_size`` ranks inside the ``with`` block (``dist.get_rank()``,
    ``init_device_mesh`` and every collective see that job); the process group is destroyed on the way
    out, also on an error.

    Collectives return immediately and bring no other rank's data: an all-reduce does not sum, an
    all-gather's output holds no other rank's piece. Count bytes and shapes here, not values.
    """
    n = whole("world_size", world_size, 1, "1024")
    r = whole("rank", rank, 0, "3")
    if r >= n:
        raise ValueError(f"rank must be below world_size={n} (ranks are 0 … {n - 1}), not {r}")
    if dist.is_initialized():
        raise RuntimeError(
            f"this process already belongs to a process group (backend {dist.get_backend()!r}, "
            f"{dist.get_world_size()} ranks): leave it first with dist.destroy_process_group(), or use "
            "the scale lab in a kernel that runs no other job"
        )
    dist.init_process_group("fake", store=_fake_store(), rank=r, world_size=n)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_sharding_decisions()


def _forget_sharding_decisions() -> None:
    """DTensor caches its sharding decisions by a mesh's shape and ranks, not by its process groups: a
    later job's mesh of the same shape would get back this job's (destroyed) groups, and its first
    collective fails with "Could not resolve the process group". Clear those caches (their names vary
    between torch releases)."""
    from torch.distributed.tensor import debug

    for name in dir(debug):
        if name.startswith("_clear_") and name.endswith("sharding_prop_cache"):
            getattr(debug, name)()
