"""Reference solutions of notebook 08's exercises (and typical wrong attempts), run by
tests/test_solutions.py. The helpers at the top are the notebook's own (sections 1 and 2)."""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ray import tune
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_model():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def evaluate(model, x, y, dtype):
    device = next(model.parameters()).device
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    xs, ys = x[rank::world].to(device), y[rank::world].to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
        correct = (model(xs).argmax(1) == ys).sum()
    counts = torch.stack([correct, torch.tensor(len(ys), device=device)]).double()
    if dist.is_initialized():
        dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def choose_precision(device):
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16, True
    return torch.bfloat16, False


def _train(rank, world_size, config, restore_all=True, shortcut=None):
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    dtype, use_scaler = choose_precision(device)
    torch.manual_seed(0)
    inner = make_model().to(device)
    model = DDP(inner, device_ids=[device.index] if nccl else None)
    if shortcut == "no_ddp":  # each rank trains on its own share, nothing is averaged
        model = inner
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    sampler = DistributedSampler(config["train_set"], shuffle=True, seed=0)
    loader = DataLoader(config["train_set"], batch_size=config["batch_size"] // world_size, sampler=sampler)
    scheduled = optimizer
    if shortcut == "dummy_schedule":  # the lrs come from a schedule on an optimizer that trains nothing
        scheduled = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=config["lr"], momentum=0.9)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        scheduled, max_lr=config["lr"], epochs=config["epochs"], steps_per_epoch=len(loader)
    )
    start, path = 0, config["checkpoint"]
    replay_until = 0
    if os.path.exists(path) and shortcut == "replay":  # read where the crash was, then train from scratch
        replay_until = torch.load(path, map_location=device, weights_only=True)["epochs_done"]
    elif os.path.exists(path):
        saved = torch.load(path, map_location=device, weights_only=True)
        inner.load_state_dict(saved["model"])
        if restore_all:
            optimizer.load_state_dict(saved["optimizer"])
            scaler.load_state_dict(saved["scaler"])
            schedule.load_state_dict(saved["schedule"])
        start = saved["epochs_done"]
    lrs, accuracy = [], None
    for epoch in range(start, config["epochs"]):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            if shortcut == "whole_batch":  # gather both ranks' samples, every rank computes all of them
                xs, ys = (
                    [torch.empty_like(x) for _ in range(world_size)],
                    [torch.empty_like(y) for _ in range(world_size)],
                )
                dist.all_gather(xs, x)
                dist.all_gather(ys, y)
                x, y = torch.cat(xs), torch.cat(ys)
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if epoch >= replay_until:
                lrs.append(scheduled.param_groups[0]["lr"])
            scaler.step(optimizer)
            scaler.update()
            if shortcut == "dummy_schedule":
                scheduled.step()
            schedule.step()
        if shortcut == "full_eval":  # all validation samples on every rank: exact, but no share per rank
            xv, yv = config["val"]
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
                accuracy = (model(xv.to(device)).argmax(1) == yv.to(device)).double().mean().item()
        elif shortcut in ("padded_eval", "mean_eval"):  # a share per rank, but not counted exactly
            val = TensorDataset(*config["val"])
            shares = DistributedSampler(val, shuffle=False)  # padded: 301 samples become 2 x 151
            ids = list(shares) if shortcut == "padded_eval" else list(range(rank, len(val), world_size))
            xs, ys = val[ids]
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
                acc = (model(xs.to(device)).argmax(1) == ys.to(device)).double().mean()
            dist.all_reduce(acc)  # the mean of the ranks' accuracies, not (correct, count) summed
            accuracy = (acc / world_size).item()
        else:
            accuracy = evaluate(model, *config["val"], dtype)
        if rank == 0:
            state = {
                "model": inner.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "schedule": schedule.state_dict(),
                "epochs_done": epoch + 1,  # epochs counted from 1: after epoch 2 this is 2
            }
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
    return {"accuracy": accuracy, "lrs": lrs, "model": inner}


def train_scheduled(rank, world_size, config):
    return _train(rank, world_size, config)


def train_scheduled_restoring_weights_only(rank, world_size, config):
    """The usual slip: the checkpoint's weights and epoch are restored, the optimizer and schedule are not."""
    return _train(rank, world_size, config, restore_all=False)


def _shortcut(name):
    def work(rank, world_size, config):
        return _train(rank, world_size, config, shortcut=name)

    work.__name__ = f"train_scheduled_{name}"
    return work


def _trial(config, data, every_epoch, train_first=False):
    """``train_first``: the shortcut that trains every epoch before its first report, then reports once per
    epoch with the final model (ASHA's early stop then saves nothing)."""
    x, y, xv, yv = data
    device = torch.device("cpu")
    dtype, use_scaler = choose_precision(device)
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    order = torch.Generator().manual_seed(0)
    for epoch in range(2 * config["epochs"] if train_first else config["epochs"]):
        if epoch < config["epochs"]:
            for idx in torch.randperm(len(y), generator=order).split(64):
                with torch.autocast(device.type, dtype=dtype):
                    loss = F.cross_entropy(model(x[idx].to(device)), y[idx].to(device))
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        if train_first and epoch < config["epochs"]:
            continue
        if every_epoch or epoch == config["epochs"] - 1:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                checkpoint = tune.Checkpoint.from_directory(folder)
                tune.report({"accuracy": evaluate(model, xv, yv, dtype)}, checkpoint=checkpoint)


def trainable(config, data):
    _trial(config, data, every_epoch=True)


def trainable_reporting_at_the_end(config, data):
    """The usual slip: one report when training is over, so a scheduler cannot stop a poor trial early."""
    _trial(config, data, every_epoch=False)


def trainable_training_before_reporting(config, data):
    _trial(config, data, every_epoch=True, train_first=True)


SOLUTIONS = {"08.1": (train_scheduled,), "08.2": (trainable,)}
WRONG = {"08.1": (train_scheduled_restoring_weights_only,), "08.2": (trainable_reporting_at_the_end,)}
#: Work that gets right-looking numbers without doing the lesson; each grader must reject it. 08.2 runs on
#: the shared Ray cluster of tests/test_tuning_ray.py (tests/test_solutions.py skips it).
SHORTCUTS = {
    "08.1": {
        "whole_batch_on_every_rank": (_shortcut("whole_batch"),),
        "no_ddp_each_rank_alone": (_shortcut("no_ddp"),),
        "whole_validation_set_on_every_rank": (_shortcut("full_eval"),),
        "replay_from_scratch_instead_of_resume": (_shortcut("replay"),),
        "lrs_from_a_schedule_that_trains_nothing": (_shortcut("dummy_schedule"),),
        "validation_shares_padded_by_distributed_sampler": (_shortcut("padded_eval"),),
        "mean_of_the_ranks_accuracies": (_shortcut("mean_eval"),),
    },
    "08.2": {"train_everything_then_report_each_epoch": (trainable_training_before_reporting,)},
}
