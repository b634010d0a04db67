"""Reference solutions of notebook 04d's exercises and typical wrong attempts (for
tests/test_solutions.py)."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _rank():
    return dist.get_rank() if dist.is_initialized() else 0  # the grader's first check runs in one process


def _save_atomically_to(obj, path):
    torch.save(obj, path + ".tmp")  # a crash while writing leaves the previous file intact
    os.replace(path + ".tmp", path)


def save_snapshot(path, model, optimizer, scheduler, epoch):
    rank = _rank()
    if rank == 0:  # one writer for what all ranks share
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
        }
        _save_atomically_to(state, path)
    _save_atomically_to(torch.get_rng_state(), f"{path}.rng{rank}")  # each rank its own Dropout masks


def load_snapshot(path, model, optimizer, scheduler):
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(torch.load(f"{path}.rng{_rank()}", weights_only=True))
    return state["epoch"] + 1


def save_without_rng(path, model, optimizer, scheduler, epoch):
    """Model, optimizer, scheduler and epoch, but not the RNG: Dropout's masks change after a restart."""
    if _rank() == 0:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
        }
        _save_atomically_to(state, path)


def load_without_rng(path, model, optimizer, scheduler):
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["epoch"] + 1


def save_rank0_rng(path, model, optimizer, scheduler, epoch):
    """Rank 0 writes everything, its own RNG state included; every rank then loads rank 0's state."""
    if _rank() == 0:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "epoch": epoch,
        }
        _save_atomically_to(state, path)


def load_rank0_rng(path, model, optimizer, scheduler):
    start = load_without_rng(path, model, optimizer, scheduler)
    if start:
        torch.set_rng_state(torch.load(path, map_location="cpu", weights_only=True)["rng"])
    return start


def save_not_atomic(path, model, optimizer, scheduler, epoch):
    """Everything each rank needs, but written in place: a crash mid-write leaves half a file."""
    rank = _rank()
    if rank == 0:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
        }
        torch.save(state, path)
    torch.save(torch.get_rng_state(), f"{path}.rng{rank}")


def train(model, optimizer, data, epochs, path):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    start = 0
    if os.path.exists(path):
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
        model.module.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        start = snapshot["epoch"] + 1
    x, y = data
    for epoch in range(start, epochs):
        order = torch.randperm(
            len(x), generator=torch.Generator().manual_seed(epoch)
        )  # a function of the epoch
        for batch in order[rank::world_size].split(8):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()


def train_atomic_but_replayed_shuffle(model, optimizer, data, epochs, path):
    """Saves atomically, but the shuffle still comes from the global RNG: a restart replays epoch 0's
    order."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    start = 0
    if os.path.exists(path):
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
        model.module.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        start = snapshot["epoch"] + 1
    x, y = data
    for epoch in range(start, epochs):
        order = torch.randperm(len(x))
        for batch in order[rank::world_size].split(8):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()


def load_with_written_in_epoch(path, model, optimizer, scheduler):
    """Restores the state but returns the epoch the grader happens to crash in, not the file's."""
    if not os.path.exists(path):
        return 0
    load_snapshot(path, model, optimizer, scheduler)
    return 2


def save_reseeding(path, model, optimizer, scheduler, epoch):
    save_without_rng(path, model, optimizer, scheduler, epoch)


def load_reseeding(path, model, optimizer, scheduler):
    """Instead of the saved RNG state, re-seeds from the epoch: Dropout's masks differ from the run's."""
    start = load_without_rng(path, model, optimizer, scheduler)
    torch.manual_seed(start)
    return start


def _resume(model, optimizer, path):
    if not os.path.exists(path):
        return 0
    snapshot = torch.load(path, map_location="cpu", weights_only=True)
    model.module.load_state_dict(snapshot["model"])
    optimizer.load_state_dict(snapshot["optimizer"])
    return snapshot["epoch"] + 1


def _save_atomically(path, model, optimizer, epoch):
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def train_without_shuffle(model, optimizer, data, epochs, path):
    """Atomic and resumable, but drops the shuffle: every epoch sees the same order."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    start = _resume(model, optimizer, path)
    x, y = data
    for epoch in range(start, epochs):
        for batch in torch.arange(len(x))[rank::world_size].split(8):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            _save_atomically(path, model, optimizer, epoch)
        dist.barrier()


def train_all_data_on_every_rank(model, optimizer, data, epochs, path):
    """Atomic, shuffled by epoch, but every rank trains on the whole epoch: no data parallelism."""
    rank = dist.get_rank()
    start = _resume(model, optimizer, path)
    x, y = data
    for epoch in range(start, epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for batch in order.split(8):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            _save_atomically(path, model, optimizer, epoch)
        dist.barrier()


def train_starting_over_on_a_broken_file(model, optimizer, data, epochs, path):
    """Writes in place and, when the snapshot cannot be read, starts over instead of losing nothing."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        start = _resume(model, optimizer, path)
    except Exception:
        start = 0
    x, y = data
    for epoch in range(start, epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for batch in order[rank::world_size].split(8):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, path)
        dist.barrier()


SOLUTIONS = {"04d.1": (save_snapshot, load_snapshot), "04d.2": (train,)}
WRONG = {
    "04d.1": (save_without_rng, load_without_rng),
    "04d.2": (train_atomic_but_replayed_shuffle,),
}
SHORTCUTS = {
    "04d.1": {
        "epoch_written_in": (save_snapshot, load_with_written_in_epoch),
        "rng_reseeded_from_the_epoch": (save_reseeding, load_reseeding),
        "rank0_rng_loaded_on_every_rank": (save_rank0_rng, load_rank0_rng),
        "torch_save_in_place": (save_not_atomic, load_snapshot),
    },
    "04d.2": {
        "no_shuffle": (train_without_shuffle,),
        "every_rank_on_all_the_data": (train_all_data_on_every_rank,),
        "start_over_on_a_broken_snapshot": (train_starting_over_on_a_broken_file,),
    },
}
