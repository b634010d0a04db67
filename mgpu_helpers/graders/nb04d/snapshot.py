"""Used by notebook 04d's exercise 04d.1 (:mod:`~mgpu_helpers.graders.nb04d` says how it is graded):
snapshot functions for a full training state with Dropout, checked in the kernel and in an elastic job."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...exercises import Wrong, exercise
from .._elastic import elastic_job
from ._common import _SAMPLES, _differs, _flat
from ._crash import Crash, interrupted_write

_EPOCHS, _CRASH_EPOCH, _BATCH = 3, 2, 8  # per rank and step: _BATCH samples
_LATER_EPOCH = 6  # a second snapshot's epoch: load_snapshot must read the epoch from the file
_RANK_SEED = 1000  # rank r's global RNG is seeded with _RANK_SEED + r after the model is built


def _setup_041(rank: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, Any, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_SAMPLES, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (_SAMPLES,), generator=gen)
    torch.manual_seed(0)  # the same weights on every rank
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.25), nn.Linear(16, 3)).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.8**step
    )
    torch.manual_seed(_RANK_SEED + rank)  # then each rank its own Dropout masks, as in a fresh process
    return model, optimizer, scheduler, x, y


def _shards(epoch: int, world_size: int = 2) -> list[torch.Tensor]:
    order = torch.randperm(_SAMPLES, generator=torch.Generator().manual_seed(epoch))
    return [order[r::world_size] for r in range(world_size)]


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    moments = [optimizer.state[p].get("exp_avg") for p in model.parameters()]
    return {
        "weights": _flat(p.detach() for p in model.parameters()),
        "exp_avg": None if any(m is None for m in moments) else _flat(moments),
        "lr": optimizer.param_groups[0]["lr"],
        "rng": torch.get_rng_state().tolist(),
    }


def _epoch_041(
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    epoch: int,
    rng1: torch.Tensor,
) -> tuple[list[float], torch.Tensor]:
    """One epoch of 2 ranks in one process: rank 0 draws its Dropout masks from the global RNG, rank 1 from
    the state ``rng1``; the learning rates used and rank 1's RNG state afterwards."""
    lrs = []
    for parts in zip(*(s.split(_BATCH) for s in _shards(epoch)), strict=True):
        rngs, losses = [torch.get_rng_state(), rng1], []
        for rank, b in enumerate(parts):
            torch.set_rng_state(rngs[rank])
            losses.append(F.cross_entropy(model(x[b]), y[b]))
            rngs[rank] = torch.get_rng_state()
        torch.set_rng_state(rngs[0])
        rng1 = rngs[1]
        optimizer.zero_grad()
        (sum(losses) / len(losses)).backward()
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs, rng1


def _check_lrs(got: list[float], want: list[float], when: str) -> None:
    for step, (a, b) in enumerate(zip(got, want, strict=False)):
        if _differs([a], [b]) is not None:
            raise Wrong(
                f"{when}, the learning rate at step {step} of epoch {_CRASH_EPOCH} was {a:.4g}; the "
                f"uninterrupted run used {b:.4g}."
            )


def _check_loaded(start: Any, got: dict[str, Any], want: dict[str, Any], when: str) -> None:
    if start != _CRASH_EPOCH or isinstance(start, bool):
        raise Wrong(
            f"{when}, with the snapshot of epoch {_CRASH_EPOCH - 1} on disk, your load_snapshot returned "
            f"{start!r} as the epoch to go on at."
        )
    if _differs(got["weights"], want["weights"]) is not None:
        raise Wrong(
            f"{when}, the weights after load_snapshot differ from those after epoch {_CRASH_EPOCH - 1}."
        )
    if got["exp_avg"] is None or _differs(got["exp_avg"], want["exp_avg"]) is not None:
        raise Wrong(
            f"{when}, AdamW's moments (exp_avg) after load_snapshot are not those of the uninterrupted run."
        )
    if _differs([got["lr"]], [want["lr"]]) is not None:
        raise Wrong(
            f"{when}, the learning rate after load_snapshot was {got['lr']:.4g}; the uninterrupted run "
            f"went on with {want['lr']:.4g}."
        )
    if got["rng"] != want["rng"]:
        raise Wrong(
            f"{when}, the random number generator after load_snapshot was not where this rank's "
            f"uninterrupted run had it, so epoch {_CRASH_EPOCH}'s Dropout masks differ."
        )


def _worker_041(
    save_snapshot: Callable[..., Any], load_snapshot: Callable[..., Any], path: str
) -> dict[str, Any]:
    """Runs in each elastic worker: resume, train under DDP, rank 1 dies once; returns what it saw."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    model, optimizer, scheduler, x, y = _setup_041(rank)
    start = load_snapshot(path, model, optimizer, scheduler)
    report = {"attempt": attempt, "start": start, "resumed": _state(model, optimizer)}
    ddp = DDP(model)
    for epoch in range(start if isinstance(start, int) else _EPOCHS, _EPOCHS):
        if rank == 1 and epoch == _CRASH_EPOCH and attempt == 0:
            os._exit(1)  # the simulated failure
        for batch in _shards(epoch, world_size)[rank].split(_BATCH):
            loss = F.cross_entropy(ddp(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            report.setdefault("lrs", []).append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        save_snapshot(path, model, optimizer, scheduler, epoch)  # every rank
        dist.barrier()
    report["final"] = _state(model, optimizer)["weights"]
    dist.destroy_process_group()
    return report


def _check_atomic_041(
    save_snapshot: Callable[..., Any], load_snapshot: Callable[..., Any], path: str, saved: dict[str, Any]
) -> None:
    """Interrupt each write of one more save_snapshot half-way (each time in a copy of the folder that holds
    the snapshot of epoch 1): load_snapshot must then load a complete snapshot, the old or the new one."""
    folder = os.path.dirname(path)
    files = [f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f))]
    for nth in range(1, 9):
        copy = os.path.join(folder, f"crash{nth}")
        os.makedirs(copy)
        for name in files:
            shutil.copyfile(os.path.join(folder, name), os.path.join(copy, name))
        target = os.path.join(copy, os.path.basename(path))
        model, optimizer, scheduler, _, _ = _setup_041()
        try:
            with interrupted_write(copy, nth):
                save_snapshot(target, model, optimizer, scheduler, _LATER_EPOCH)
        except Crash:
            pass
        else:
            return  # save_snapshot wrote fewer than nth files: each of its writes was interrupted once
        model, optimizer, scheduler, _, _ = _setup_041()
        try:
            start = load_snapshot(target, model, optimizer, scheduler)
        except Exception as error:  # noqa: BLE001 - any failure to load is the finding
            raise Wrong(
                "in one process, the machine died half-way through a file that save_snapshot was writing; "
                f"then your load_snapshot failed ({type(error).__name__}) instead of loading the previous "
                "snapshot: a crash must never leave a half-written file where a complete one was."
            ) from None
        if start != _LATER_EPOCH + 1:
            _check_loaded(start, _state(model, optimizer), saved, "after a crash half-way through a save")


@exercise(
    "04d.1",
    "snapshot a full training state",
    task="`save_snapshot(path, model, optimizer, scheduler, epoch)`, and `load_snapshot(path, model, "
    "optimizer, scheduler)` → the epoch to go on at (0 without a file). In one process, a load must restore "
    "an uninterrupted run's epoch, weights, AdamW moments, learning rate and RNG state, and a save killed "
    "half-way through any write must leave a complete snapshot; then, in an elastic job where rank 1 dies, "
    "each rank must resume its own state and end with the uninterrupted weights.",
    hint="List everything whose state changes while training and decides what the next step does — the "
    "weights are only one of them, and Dropout draws random numbers, different ones on each rank. Once the "
    "snapshot of epoch e is on disk, which epoch must the job go on at? And what is on disk if the machine "
    "dies half-way through a write?",
)
def grade_snapshot(save_snapshot: Callable[..., Any], load_snapshot: Callable[..., Any]) -> str:
    """Save/load in the kernel first, then an elastic job with a crash and one restart."""
    for name, fn in (("save_snapshot", save_snapshot), ("load_snapshot", load_snapshot)):
        if not callable(fn):
            raise Wrong(f"pass the function {name} itself, not {type(fn).__name__}")
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder, torch.random.fork_rng(devices=[]):
        path = os.path.join(folder, "snapshot.pt")
        _setup_041(1)
        rng1 = torch.get_rng_state()  # rank 1's generator, where a fresh process has it
        model, optimizer, scheduler, x, y = _setup_041()
        start = load_snapshot(path, model, optimizer, scheduler)
        if start != 0 or isinstance(start, bool):
            raise Wrong(f"with no file at path, your load_snapshot returned {start!r} instead of epoch 0.")
        for epoch in range(_CRASH_EPOCH):
            rng1 = _epoch_041(model, optimizer, scheduler, x, y, epoch, rng1)[1]
        save_snapshot(path, model, optimizer, scheduler, _CRASH_EPOCH - 1)
        saved = [_state(model, optimizer), {**_state(model, optimizer), "rng": rng1.tolist()}]
        want_lrs = _epoch_041(model, optimizer, scheduler, x, y, _CRASH_EPOCH, rng1)[0]
        final = _state(model, optimizer)["weights"]
        model, optimizer, scheduler, x, y = _setup_041()  # a fresh process (rank 0)
        start = load_snapshot(path, model, optimizer, scheduler)
        _check_loaded(start, _state(model, optimizer), saved[0], "in one process")
        lrs = _epoch_041(
            model, optimizer, scheduler, x, y, _CRASH_EPOCH, torch.tensor(saved[1]["rng"], dtype=torch.uint8)
        )[0]
        _check_lrs(lrs, want_lrs, "in one process")
        if _differs(_state(model, optimizer)["weights"], final) is not None:
            raise Wrong(
                "in one process, the weights after the resumed epoch differ from the uninterrupted run's."
            )
        later = os.path.join(folder, "later", "snapshot.pt")  # another epoch: it must come from the file
        os.makedirs(os.path.dirname(later))
        save_snapshot(later, model, optimizer, scheduler, _LATER_EPOCH)
        start = load_snapshot(later, *_setup_041()[:3])
        if start != _LATER_EPOCH + 1 or isinstance(start, bool):
            raise Wrong(
                f"in one process, after save_snapshot(..., epoch={_LATER_EPOCH}) your load_snapshot returned "
                f"{start!r} as the epoch to go on at."
            )
        _check_atomic_041(save_snapshot, load_snapshot, path, saved[0])
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
        reports = elastic_job(
            f"rank 1 died at the start of epoch {_CRASH_EPOCH}",
            _worker_041,
            save_snapshot,
            load_snapshot,
            os.path.join(folder, "snapshot.pt"),
            fresh=folder,
        )
    for rank in (0, 1):
        report = reports[rank]
        if report["attempt"] != 1:
            raise Wrong("the elastic job ended without a restart: rank 1 never reached epoch 2.")
        when = f"after the real restart, on rank {rank}"
        _check_loaded(report["start"], report["resumed"], saved[rank], when)
        _check_lrs(report.get("lrs", []), want_lrs, when)
    if any(_differs(reports[rank]["final"], final) is not None for rank in (0, 1)):
        raise Wrong("after the real restart, the final weights differ from an uninterrupted run's.")
    return (
        "resumed in one process, after a crash half-way through a save, and after a real elastic restart "
        "(rank 1 lost at the start of epoch 2) with the weights, AdamW's moments, the learning rate and each "
        "rank's own RNG state of the uninterrupted run, and ended with its weights."
    )
