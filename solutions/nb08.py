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
from torch.utils.data import DataLoader, DistributedSampler


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


def _train(rank, world_size, config, restore_all=True):
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    dtype, use_scaler = choose_precision(device)
    torch.manual_seed(0)
    model = DDP(make_model().to(device), device_ids=[device.index] if nccl else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    sampler = DistributedSampler(config["train_set"], shuffle=True, seed=0)
    loader = DataLoader(config["train_set"], batch_size=config["batch_size"] // world_size, sampler=sampler)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config["lr"], epochs=config["epochs"], steps_per_epoch=len(loader)
    )
    start, path = 0, config["checkpoint"]
    if os.path.exists(path):
        saved = torch.load(path, map_location=device, weights_only=True)
        model.module.load_state_dict(saved["model"])
        if restore_all:
            optimizer.load_state_dict(saved["optimizer"])
            scaler.load_state_dict(saved["scaler"])
            schedule.load_state_dict(saved["schedule"])
        start = saved["epoch"]
    lrs, accuracy = [], None
    for epoch in range(start, config["epochs"]):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            lrs.append(optimizer.param_groups[0]["lr"])
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
        accuracy = evaluate(model, *config["val"], dtype)
        if rank == 0:
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "schedule": schedule.state_dict(),
                "epoch": epoch + 1,
            }
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
    return {"accuracy": accuracy, "lrs": lrs, "model": model.module}


def train_scheduled(rank, world_size, config):
    return _train(rank, world_size, config)


def train_scheduled_restoring_weights_only(rank, world_size, config):
    """The usual slip: the checkpoint's weights and epoch are restored, the optimizer and schedule are not."""
    return _train(rank, world_size, config, restore_all=False)


def _trial(config, data, every_epoch):
    x, y, xv, yv = data
    device = torch.device("cpu")
    dtype, use_scaler = choose_precision(device)
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    order = torch.Generator().manual_seed(0)
    for epoch in range(config["epochs"]):
        for idx in torch.randperm(len(y), generator=order).split(64):
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(x[idx].to(device)), y[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
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


SOLUTIONS = {"08.1": (train_scheduled,), "08.2": (trainable,)}
WRONG = {"08.1": (train_scheduled_restoring_weights_only,), "08.2": (trainable_reporting_at_the_end,)}
