"""Reference solutions of notebook 02b's exercises, and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe


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


# --- shortcuts: the right numbers without the lesson ---------------------------------------------------


def one_f_one_b_from_the_package(p, m):
    """The course's simulator already knows the 1F1B order."""
    from mgpu_helpers.pipeline import stage_order

    return [[(kind, i) for kind, i, _ in stage_order("1f1b", s, p, m)] for s in range(p)]


def one_f_one_b_from_the_package_helper(p, m):
    """The simulator's private helper builds 1F1B from the forwards, the backwards and the warm-up count."""
    from mgpu_helpers.pipeline.schedules import _one_f_one_b

    return [
        _one_f_one_b([("F", i) for i in range(m)], [("B", i) for i in range(m)], p - s - 1) for s in range(p)
    ]


def one_f_one_b_warmup_not_capped(p, m):
    """Warm-up of p - s - 1 forwards even when m is smaller: for p=4, m=2 stage 0 runs F 2, which does
    not exist."""
    orders = []
    for s in range(p):
        warmup = p - s - 1
        order = [("F", i) for i in range(warmup)]
        for i in range(warmup, m):
            order += [("F", i), ("B", i - warmup)]
        order += [("B", i) for i in range(m - warmup, m)]
        orders.append(order)
    return orders


def one_f_one_b_from_torch(p, m):
    """PyTorch's Schedule1F1B computes its order from p and m alone: read its F/B pattern without a real
    stage, and number each kind's passes 0, 1, 2, ... (its micro-batch numbers are off on the last stage)."""
    schedule = Schedule1F1B.__new__(Schedule1F1B)
    schedule._num_stages, schedule._n_microbatches = p, m
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B"}
    orders = []
    for _, actions in sorted(schedule._get_pipeline_order().items()):
        pattern = [kinds[a.computation_type.name] for a in actions if a and a.computation_type.name in kinds]
        orders.append([(kind, pattern[:n].count(kind)) for n, kind in enumerate(pattern)])
    return orders


def gpipe_order(p, m):
    """All forwards, then all backwards: as fast as 1F1B, but every stage holds all m micro-batches."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def one_microbatch_at_a_time(p, m):
    """Little memory, no pipeline: each micro-batch goes forward and back before the next starts."""
    return [[(kind, i) for i in range(m) for kind in "FB"] for _ in range(p)]


def train_stage_with_gpipe(rank, world_size, stage_module, x, y, m, steps, lr):
    """The right parameters with ScheduleGPipe: not the 1F1B order the exercise asks for."""
    stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()


def train_stage_alone_on_every_rank(rank, world_size, stage_module, x, y, m, steps, lr):
    """No pipeline: every rank rebuilds the unsplit model and the batch with the notebook's helpers and
    trains it by itself, micro-batch by micro-batch; only its own stage's result is kept."""
    from mgpu_helpers.pipeline import make_batch, make_stages

    stages = make_stages(world_size, x.shape[1], 1)
    stages[rank] = stage_module
    model = nn.Sequential(*stages)
    x, y = make_batch(len(x), x.shape[1], y.shape[1])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xi), yi) / m).backward()
        optimizer.step()


SOLUTIONS = {"02b.1": (one_f_one_b,), "02b.2": (train_stage,)}
WRONG = {"02b.1": (one_f_one_b_one_warmup_too_many,), "02b.2": (train_stage_without_zero_grad,)}
SHORTCUTS = {
    "02b.1": {
        "stage_order from mgpu_helpers": (one_f_one_b_from_the_package,),
        "_one_f_one_b from mgpu_helpers.pipeline.schedules": (one_f_one_b_from_the_package_helper,),
        "warm-up not capped at m": (one_f_one_b_warmup_not_capped,),
        "torch's Schedule1F1B order": (one_f_one_b_from_torch,),
        "GPipe's order": (gpipe_order,),
        "one micro-batch at a time": (one_microbatch_at_a_time,),
    },
    "02b.2": {
        "ScheduleGPipe": (train_stage_with_gpipe,),
        "every rank trains the whole model": (train_stage_alone_on_every_rank,),
    },
}
