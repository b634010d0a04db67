"""The course's communication spy: every way a rank communicates is seen once, with the full-tensor
byte convention (all-gather: the gathered output; reduce-scatter: the input before it is split)."""

import pytest
import torch
import torch.distributed as dist

from mgpu_helpers.collectives import (
    Call,
    CollectiveSpy,
    all_gather_single,
    reduce_scatter_single,
    ring_bytes_sent,
)
from mgpu_helpers.launching import launch


def _by_hand_dtensor_and_fsdp(rank: int, world_size: int) -> dict[str, list[Call]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    seen = {}
    with CollectiveSpy() as spy:
        t = torch.ones(8)  # 32 bytes
        dist.all_reduce(t)
        full = torch.empty(8 * world_size)
        all_gather_single(full, torch.ones(8))
        part = torch.empty(4, dtype=torch.float64)
        reduce_scatter_single(part, torch.ones(4 * world_size, dtype=torch.float64))
        dist.broadcast(torch.zeros(2, dtype=torch.int64), src=0)
        dist.scatter(torch.empty(3), [torch.ones(3)] * world_size if dist.get_rank() == 0 else None, src=0)
        dist.gather(
            torch.ones(3),
            [torch.empty(3) for _ in range(world_size)] if dist.get_rank() == 1 else None,
            dst=1,
        )
    seen["by_hand"] = spy.calls
    mesh = init_device_mesh("cpu", (world_size,))
    with CollectiveSpy() as spy:
        d = distribute_tensor(torch.arange(12.0).reshape(6, 2), mesh, [Shard(0)])
        d.full_tensor()  # an all-gather of the 6x2 float table: 48 bytes
    seen["dtensor"] = [c for c in spy.calls if c.op == "all_gather"]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 6, bias=False)  # 24 floats: 96 bytes
    fully_shard(model, mesh=mesh)
    with CollectiveSpy() as spy:
        model(torch.ones(3, 4)).sum().backward()
    seen["fsdp"] = spy.calls
    return seen


def test_the_spy_sees_collectives_by_hand_through_dtensor_and_inside_fsdp2():
    both = launch(_by_hand_dtensor_and_fsdp, 2)
    assert both[0]["by_hand"] == both[1]["by_hand"]  # the same at a scatter's root and elsewhere
    seen = both[0]
    assert seen["by_hand"] == [
        Call("all_reduce", torch.float32, 32),
        Call("all_gather", torch.float32, 64),  # the gathered output: 2 ranks x 8 floats
        Call("reduce_scatter", torch.float64, 64),  # the input before the split: 8 doubles
        Call("broadcast", torch.int64, 16),
        Call("scatter", torch.float32, 24),  # all the pieces: 2 ranks x 3 floats, on every rank
        Call("gather", torch.float32, 24),
    ]
    assert seen["dtensor"] == [Call("all_gather", torch.float32, 48)]
    ops = [c.op for c in seen["fsdp"]]
    assert ops.count("all_gather") >= 1 and ops.count("reduce_scatter") == 1, ops
    assert all(c.nbytes == 96 for c in seen["fsdp"]), seen["fsdp"]  # the full weight, both directions


def test_ring_traffic_per_rank():
    assert ring_bytes_sent("all_gather", 1000, 4) == ring_bytes_sent("reduce_scatter", 1000, 4) == 750
    assert ring_bytes_sent("all_reduce", 1000, 4) == 1500
    with pytest.raises(ValueError, match="no ring formula for 'broadcast'"):
        ring_bytes_sent("broadcast", 1000, 4)
