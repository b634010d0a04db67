"""Reference solutions of notebook 02b's exercises, and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


def one_f_one_b(p, m):
    orders = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        order = [("F", i) for i in range(warmup)]
        for i in range(warmup, m):  # steady state: one forward, then the oldest backward
            order += [("F", i), ("B", i - warmup)]
        order += [("B", i) for i in range(m - warmup, m)]  # cool-down: the backwards still owed
        orders.append(order)
    return orders


def one_f_one_b_one_warmup_too_many(p, m):
    """Warm-up of p - s forwards instead of p - s - 1: stage s holds one micro-batch more than needed."""
    orders = []
    for s in range(p):
        warmup = min(p - s, m)
        order = [("F", i) for i in range(warmup)]
        for i in range(warmup, m):
            order += [("F", i), ("B", i - warmup)]
        order += [("B", i) for i in range(m - warmup, m)]
        orders.append(order)
    return orders


def train_stage(rank, world_size, stage_module, x, y, m, steps, lr):
    stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world_size - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        optimizer.step()


def train_stage_without_zero_grad(rank, world_size, stage_module, x, y, m, steps, lr):
    """Never clears the gradients: each step adds its gradients to all the previous ones."""
    stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=lr)
    for _ in range(steps):
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()


SOLUTIONS = {"02b.1": (one_f_one_b,), "02b.2": (train_stage,)}
WRONG = {"02b.1": (one_f_one_b_one_warmup_too_many,), "02b.2": (train_stage_without_zero_grad,)}
