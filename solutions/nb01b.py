"""Reference solutions of notebook 01b's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist


def global_mean(x):
    totals = torch.stack([x.sum(), torch.tensor(float(x.numel()), dtype=x.dtype)])  # [sum, count]
    dist.all_reduce(totals)
    return totals[0] / totals[1]


def mean_of_means(x):
    """Right only when every rank holds as many elements as the others."""
    m = x.mean()
    dist.all_reduce(m)
    return m / dist.get_world_size()


def ring_shift(x):
    rank, n = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(x)
    request = dist.isend(x, dst=(rank + 1) % n)  # start sending, do not wait yet
    dist.recv(received, src=(rank - 1) % n)
    request.wait()
    return received


def ring_shift_send_first(x):
    """Every rank sends first: each send waits for a recv that its partner never reaches."""
    rank, n = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(x)
    dist.send(x, dst=(rank + 1) % n)
    dist.recv(received, src=(rank - 1) % n)
    return received


SOLUTIONS = {"01b.1": (global_mean,), "01b.2": (ring_shift,)}
WRONG = {"01b.1": (mean_of_means,), "01b.2": (ring_shift_send_first,)}
