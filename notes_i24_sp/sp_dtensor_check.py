# ruff: noqa
"""2 gloo ranks: by-hand Megatron SP == unsplit block == torch SequenceParallel/Colwise/Rowwise styles."""
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h, bias=False)
        self.fc2 = nn.Linear(4 * h, h, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.norm(x))))


def work(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    h, b, s = 8, 2, 6
    ref = Block(h).double()
    x = torch.randn(b, s, h, dtype=torch.float64)
    y_ref = ref(x)
    # by hand: shard weights, sequence-split input
    w1 = ref.fc1.weight.chunk(world, 0)[rank]
    w2 = ref.fc2.weight.chunk(world, 1)[rank]
    xs = x.chunk(world, 1)[rank]                      # (b, s/t, h): norm region holds 1/t
    n = torch.nn.functional.layer_norm(xs, (h,), ref.norm.weight, ref.norm.bias)
    parts = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(parts, n.contiguous())            # all-gather along sequence
    full = torch.cat(parts, 1)
    z = torch.relu(full @ w1.T) @ w2.T                # partial sums (b, s, h)
    out = torch.empty_like(xs)
    dist.reduce_scatter(out, list(z.chunk(world, 1)))  # gloo reduce_scatter (list form)
    torch.testing.assert_close(out, y_ref.chunk(world, 1)[rank], rtol=1e-12, atol=1e-12)
    # torch's styles
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    mesh = init_device_mesh("cpu", (world,))
    m = Block(h).double()
    m.load_state_dict(ref.state_dict())
    parallelize_module(m, mesh, {"norm": SequenceParallel(),
                                 "fc1": ColwiseParallel(input_layouts=Shard(1)),
                                 "fc2": RowwiseParallel(output_layouts=Shard(1))})
    y = m(xs)
    y = y.to_local() if hasattr(y, "to_local") else y
    torch.testing.assert_close(y, y_ref.chunk(world, 1)[rank], rtol=1e-12, atol=1e-12)
    if rank == 0:
        print("by-hand SP == unsplit == torch SP styles", tuple(y.shape))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.start_processes(work, args=(2,), nprocs=2, start_method="spawn")
