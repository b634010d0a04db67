"""Reference solutions of notebook 04a's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import copy

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


# --- shortcuts: the right numbers without the mechanism the exercise teaches (each must get a ❌) --------


def builtin_all_reduce(tensor):
    """torch's own collective instead of the ring."""
    dist.all_reduce(tensor)


def ring_half_then_builtin_all_gather(tensor):
    """The given reduce-scatter half, then dist.all_gather for the half the exercise asks for."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).chunk(n)
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        request = dist.isend(chunks[send_i].contiguous(), dst=right)
        incoming = torch.empty_like(chunks[recv_i])
        dist.recv(incoming, src=left)
        request.wait()
        chunks[recv_i].add_(incoming)
    owned, longest = (rank + 1) % n, chunks[0].numel()
    padded = torch.zeros(longest, dtype=tensor.dtype)  # all_gather needs equal sizes
    padded[: chunks[owned].numel()] = chunks[owned]
    parts = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(parts, padded)
    for r, part in enumerate(parts):
        chunks[(r + 1) % n].copy_(part[: chunks[(r + 1) % n].numel()])


def process_group_allreduce(tensor):
    """The default process group's allreduce, past the dist.* functions: nothing is sent by hand."""
    dist.distributed_c10d._get_default_group().allreduce([tensor]).wait()


def private_allreduce_with_dummy_ring(tensor):
    """The process group's own allreduce past the dist.* functions, plus a ring of zeros of the right
    size to the right neighbour so that the byte count and the peers look like a ring's."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.distributed_c10d._get_default_group().allreduce([tensor]).wait()
    dummy = torch.zeros(-(-tensor.numel() // n), dtype=tensor.dtype)
    for _ in range(2 * (n - 1)):
        request = dist.isend(dummy, (rank + 1) % n)
        dist.recv(torch.empty_like(dummy), (rank - 1) % n)
        request.wait()


def everyone_sends_everything(tensor):
    """Communicating everything: every rank sends its whole tensor to every other rank and adds."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = tensor.clone()
    requests = [dist.isend(mine, dst=r) for r in range(n) if r != rank]
    for src in range(n):
        if src != rank:
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, src=src)
            tensor += incoming
    for request in requests:
        request.wait()


def whole_tensor_around_the_ring(tensor):
    """A ring, but passing the whole tensor N-1 times instead of one chunk at a time."""
    rank, n = dist.get_rank(), dist.get_world_size()
    passing = tensor.clone()
    for _ in range(n - 1):
        request = dist.isend(passing.clone(), dst=(rank + 1) % n)
        dist.recv(passing, src=(rank - 1) % n)
        request.wait()
        tensor += passing


def ring_half_then_direct_all_gather(tensor):
    """The reduce-scatter ring, then every rank sends its finished chunk straight to every other rank:
    the ring's byte count, but not a ring."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).chunk(n)
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        request = dist.isend(chunks[send_i].contiguous(), dst=right)
        incoming = torch.empty_like(chunks[recv_i])
        dist.recv(incoming, src=left)
        request.wait()
        chunks[recv_i].add_(incoming)
    owned = (rank + 1) % n
    requests = [dist.isend(chunks[owned].contiguous(), dst=r) for r in range(n) if r != rank]
    for src in range(n):
        if src != rank:
            incoming = torch.empty_like(chunks[(src + 1) % n])
            dist.recv(incoming, src=src)
            chunks[(src + 1) % n].copy_(incoming)
    for request in requests:
        request.wait()


def ddp_step_whole_batch_every_rank(rank, world_size, model, x, y):
    """No sharding: every rank runs DDP on the whole batch (the average of equal gradients is right)."""
    F.cross_entropy(DDP(model)(x), y).backward()


def ddp_step_whole_batch_on_a_copy(rank, world_size, model, x, y):
    """DDP runs on the share only for show; the gradient comes from a deep copy on the whole batch."""
    ddp_model = DDP(model)  # rank 0's weights everywhere
    full = copy.deepcopy(model)
    F.cross_entropy(full(x), y).backward()
    x_mine = torch.tensor_split(x, world_size)[rank]
    (ddp_model(x_mine).sum() * 0).backward()
    for p, q in zip(model.parameters(), full.parameters(), strict=True):
        p.grad = q.grad.clone()


def ddp_step_rebuilt_from_grader(rank, world_size, model, x, y):
    """The grader's own case builder as answer key: rank 0's model rebuilt on every rank, its full-batch
    gradient written into p.grad (after a share-sized forward for the row count)."""
    from mgpu_helpers.graders import nb04a

    rank0 = nb04a._model(100)
    F.cross_entropy(rank0(x), y).backward()
    ddp_model = DDP(model)
    x_mine = torch.tensor_split(x, world_size)[rank]
    (ddp_model(x_mine).sum() * 0).backward()
    for p, q in zip(model.parameters(), rank0.parameters(), strict=True):
        p.grad = q.grad.clone()


def ddp_step_fresh_model_whole_batch(rank, world_size, model, x, y):
    """DDP's broadcast for rank 0's weights, then the full-batch gradient of a fresh, hook-free copy."""
    ddp_model = DDP(model)
    fresh = type(model)(*[copy.copy(m) for m in model])  # same layers, no hooks on the container
    fresh.load_state_dict(model.state_dict())
    x_mine = torch.tensor_split(x, world_size)[rank]
    (ddp_model(x_mine).sum() * 0).backward()
    grads = torch.autograd.grad(F.cross_entropy(fresh(x), y), list(fresh.parameters()))
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()


def ddp_step_model_built_anew(rank, world_size, model, x, y):
    """A new model of the same shape loaded with rank 0's weights; its full-batch gradient in p.grad."""
    ddp_model = DDP(model)
    x_mine = torch.tensor_split(x, world_size)[rank]
    (ddp_model(x_mine).sum() * 0).backward()
    anew = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    anew.load_state_dict(model.state_dict())
    F.cross_entropy(anew(x), y).backward()
    for p, q in zip(model.parameters(), anew.parameters(), strict=True):
        p.grad = q.grad.clone()


def ddp_step_whole_batch_through_the_weights(rank, world_size, model, x, y):
    """The model's own weights, but used by hand (F.linear) on the whole batch, past every module."""
    ddp_model = DDP(model)
    x_mine = torch.tensor_split(x, world_size)[rank]
    (ddp_model(x_mine).sum() * 0).backward()
    w0, b0, w1, b1 = model.parameters()
    loss = F.cross_entropy(F.linear(torch.tanh(F.linear(x, w0, b0)), w1, b1), y)
    for p, g in zip(model.parameters(), torch.autograd.grad(loss, [w0, b0, w1, b1]), strict=True):
        p.grad = g.clone()


SOLUTIONS = {"04a.1": (ring_all_reduce,), "04a.2": (ddp_step,)}
WRONG = {"04a.1": (gather_to_rank0_all_reduce,), "04a.2": (ddp_step_mean_per_rank,)}
SHORTCUTS = {
    "04a.1": {
        "builtin_all_reduce": (builtin_all_reduce,),
        "ring_half_then_builtin_all_gather": (ring_half_then_builtin_all_gather,),
        "process_group_allreduce": (process_group_allreduce,),
        "private_allreduce_with_dummy_ring": (private_allreduce_with_dummy_ring,),
        "everyone_sends_everything": (everyone_sends_everything,),
        "whole_tensor_around_the_ring": (whole_tensor_around_the_ring,),
        "ring_half_then_direct_all_gather": (ring_half_then_direct_all_gather,),
    },
    "04a.2": {
        "whole_batch_on_every_rank": (ddp_step_whole_batch_every_rank,),
        "whole_batch_on_a_deepcopy": (ddp_step_whole_batch_on_a_copy,),
        "rank0_rebuilt_with_the_graders_model": (ddp_step_rebuilt_from_grader,),
        "whole_batch_on_a_fresh_model": (ddp_step_fresh_model_whole_batch,),
        "whole_batch_through_the_weights": (ddp_step_whole_batch_through_the_weights,),
        "whole_batch_on_a_model_built_anew": (ddp_step_model_built_anew,),
    },
}
