"""Reference solutions of notebook 04a's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).chunk(n)
    for step in range(n - 1):  # reduce-scatter: afterwards rank r owns the full sum of chunk r + 1
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        request = dist.isend(chunks[send_i].contiguous(), dst=right)
        incoming = torch.empty_like(chunks[recv_i])
        dist.recv(incoming, src=left)
        request.wait()
        chunks[recv_i].add_(incoming)
    for step in range(n - 1):  # all-gather: pass the finished chunks once around the ring
        send_i, recv_i = (rank - step + 1) % n, (rank - step) % n
        request = dist.isend(chunks[send_i].contiguous(), dst=right)
        incoming = torch.empty_like(chunks[recv_i])
        dist.recv(incoming, src=left)
        request.wait()
        chunks[recv_i].copy_(incoming)


def gather_to_rank0_all_reduce(tensor):
    """Right sums, but rank 0 receives and sends everything: (N-1) x the tensor from rank 0."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, n):
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, src=src)
            tensor += incoming
        for dst in range(1, n):
            dist.send(tensor, dst=dst)
    else:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)


def ddp_step(rank, world_size, model, x, y):
    ddp_model = DDP(model)  # broadcasts rank 0's weights
    x_mine, y_mine = torch.tensor_split(x, world_size)[rank], torch.tensor_split(y, world_size)[rank]
    loss = F.cross_entropy(ddp_model(x_mine), y_mine, reduction="sum") * world_size / len(x)
    loss.backward()  # DDP averages over ranks: (1/W) sum_r W/n sum_i l_i = mean over the whole batch


def ddp_step_mean_per_rank(rank, world_size, model, x, y):
    """Right for equal shares only: with 4 + 3 samples the 3 count as much as the 4."""
    ddp_model = DDP(model)
    x_mine, y_mine = torch.tensor_split(x, world_size)[rank], torch.tensor_split(y, world_size)[rank]
    F.cross_entropy(ddp_model(x_mine), y_mine).backward()


SOLUTIONS = {"04a.1": (ring_all_reduce,), "04a.2": (ddp_step,)}
WRONG = {"04a.1": (gather_to_rank0_all_reduce,), "04a.2": (ddp_step_mean_per_rank,)}
