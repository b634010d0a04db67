"""Used by notebook 04d's exercises: snapshot functions for a full training state with Dropout (04d.1) and
the repair of a training loop that is not restart-safe (04d.2).

Each grader first runs a cheap check that catches the usual mistakes in a second or two, and only code
that passes it goes on to one real **elastic** job: torchelastic's ``LocalElasticAgent`` (what torchrun
runs) with 2 gloo workers, ``--max-restarts=1`` and a c10d rendezvous on 127.0.0.1, in which a worker dies
once. The agent runs in a child of the launcher's forkserver and its workers fork from the agent
(:mod:`~mgpu_helpers.graders._elastic`), so functions defined in the notebook run as they are — no script.

**04d.1.** In the kernel: train 2 epochs of a float64 MLP with Dropout, AdamW and a per-step ``LambdaLR``
on 2 simulated ranks whose global RNGs are seeded differently (the kernel's generator plays rank 0),
``save_snapshot``, build a fresh model, optimizer and scheduler (rank 0's RNG re-seeded, as in a new
process), ``load_snapshot``, train epoch 2, and compare what was loaded (epoch, weights, AdamW's moments,
learning rate, RNG state) and the final weights with the uninterrupted run (``rtol=1e-9``); a second
snapshot, of epoch 6, must load as epoch 7 (the epoch comes from the file, not from the code). Then each
write of one more ``save_snapshot`` in turn writes half its bytes and "dies" (:mod:`._nb04d_crash`):
``load_snapshot`` must still load a complete snapshot (a non-atomic save fails here). Then the elastic
job: every rank calls ``save_snapshot`` after every epoch, rank 1 dies at the start of epoch 2, both
workers restart and resume; what each rank loaded (its **own** RNG state included: loading rank 0's on
every rank fails) and the final weights are compared with the single-process computation.

**04d.2.** In 2 ranks (:func:`~mgpu_helpers.graders._ranks.run_ranks`): ``train(epochs=4)`` (the
reference), and ``train(epochs=1)`` followed by ``train(epochs=4)`` on the same path with a fresh model (it
must resume at epoch 1 with the reference's batches and weights); in the reference rank 0 must see its half
of the samples once per epoch, in a new order every epoch (no shuffle, or every rank on all the data, is
not the repair). Then the elastic job, where rank 0's
first attempt dies while writing its **second** snapshot, whatever route the write takes (``torch.save``
to the path, or a file opened for writing in the snapshot's folder): half the bytes reach the file, then
``os._exit(1)``. The restarted job must resume from the last complete snapshot, see the reference's
batches and end with its weights.

Both jobs set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (notebook 04d's Going deeper says why), keep every
store and socket on loopback (:mod:`mgpu_helpers.launching.loopback`), tie the agent to the kernel and the
workers to the agent (``PR_SET_PDEATHSIG``), and stop every process before the grader returns.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ._elastic import elastic_job
from ._nb04d_crash import Crash, arm_crash, interrupted_write
from ._ranks import run_ranks


def _flat(tensors: Any) -> list[float]:
    return torch.cat([torch.as_tensor(t, dtype=torch.float64).reshape(-1) for t in tensors]).tolist()


def _differs(a: Any, b: Any) -> float | None:
    """Largest absolute difference between two lists of numbers, None when equal up to float64 rounding."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        return float("inf")
    return None if torch.allclose(a, b, rtol=1e-9, atol=1e-12) else float((a - b).abs().max())


# --- 04d.1: snapshot a full training state -------------------------------------------------------------

_EPOCHS, _CRASH_EPOCH, _SAMPLES, _BATCH = 3, 2, 64, 8  # per rank and step: _BATCH samples
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


# --- 04d.2: repair a training loop that is not restart-safe -----------------------------------------------

_EPOCHS_2 = 4


def _setup_042() -> tuple[
    nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, torch.Tensor], dict[float, int]
]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(_SAMPLES, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (_SAMPLES,), generator=gen)
    torch.manual_seed(0)  # the same weights on every rank; the global RNG is then in step on all ranks
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, (x, y), {float(v): i for i, v in enumerate(x[:, 0].tolist())}


def _run_042(train: Callable[..., Any], epochs: int, path: str) -> dict[str, Any]:
    """A fresh model and optimizer (as in a new process), ``train`` on them; the batches and weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, optimizer, data, index = _setup_042()
    seen: list[list[int]] = []
    model.register_forward_pre_hook(
        lambda _m, inputs: seen.append([index.get(v, -1) for v in inputs[0][:, 0].tolist()])
    )
    train(DDP(model), optimizer, data, epochs, path)
    return {"seen": seen, "final": _flat(p.detach() for p in model.parameters())}


def _ranks_042(rank: int, world_size: int, train: Callable[..., Any], folder: str) -> dict[str, Any]:
    reference = _run_042(train, _EPOCHS_2, os.path.join(folder, "a", "snapshot.pt"))
    _run_042(train, 1, os.path.join(folder, "b", "snapshot.pt"))
    return {
        "reference": reference,
        "resumed": _run_042(train, _EPOCHS_2, os.path.join(folder, "b", "snapshot.pt")),
    }


def _worker_042(train: Callable[..., Any], folder: str) -> dict[str, Any]:
    """Runs in each elastic worker: the student's train(); in attempt 0 rank 0 dies in its 2nd snapshot."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and dist.get_rank() == 0:
        arm_crash(folder)
    report = {"attempt": attempt, **_run_042(train, _EPOCHS_2, os.path.join(folder, "snapshot.pt"))}
    dist.destroy_process_group()
    return report


def _check_shuffle_042(seen: list[list[int]]) -> None:
    """Rank 0's batches in the uninterrupted run: its half of the samples, in a new order every epoch."""
    per_epoch = len(seen) // _EPOCHS_2
    epochs = [sum(seen[e * per_epoch : (e + 1) * per_epoch], []) for e in range(_EPOCHS_2)]
    for e, order in enumerate(epochs):
        if len(order) != _SAMPLES // 2 or len(set(order)) != len(order):
            raise Wrong(
                f"without any crash, rank 0 saw {len(order)} samples ({len(set(order))} different) in epoch "
                f"{e}; with 2 ranks each sees its own half ({_SAMPLES // 2}) once per epoch."
            )
    if any(epochs[e] == epochs[0] for e in range(1, _EPOCHS_2)):
        raise Wrong(
            "without any crash, rank 0 saw its samples in the same order in two epochs: keep a new shuffle "
            "every epoch (one that a restarted job can reproduce)."
        )


def _compare_042(seen: list[list[int]], final: list[float], reference: dict[str, Any], when: str) -> None:
    per_epoch = len(reference["seen"]) // _EPOCHS_2
    if len(seen) >= len(reference["seen"]):
        raise Wrong(
            f"{when}, your train() started over at epoch 0 instead of going on after the last snapshot."
        )
    if len(seen) != (_EPOCHS_2 - 1) * per_epoch:
        raise Wrong(f"{when}, rank 0 ran {len(seen)} forward passes; epochs 1 to 3 have {3 * per_epoch}.")
    for step, (got, want) in enumerate(zip(seen, reference["seen"][per_epoch:], strict=True)):
        if got != want:
            raise Wrong(
                f"{when}, rank 0's batch {step % per_epoch} of epoch {1 + step // per_epoch} held samples "
                f"{got[:4]} …; in the uninterrupted run that batch held {want[:4]} …."
            )
    if _differs(final, reference["final"]) is not None:
        raise Wrong(f"{when}, the final weights differ from the uninterrupted run's.")


@exercise(
    "04d.2",
    "repair a training loop that is not restart-safe",
    hint="Imagine the process killed at any line: while torch.save is writing, what is left on disk for the "
    "restart? And after a restart, which random numbers does the shuffle draw — the ones an uninterrupted "
    "run would have drawn in that epoch?",
)
def grade_restart_safe(train: Callable[..., Any]) -> str:
    """A resume without a crash in 2 ranks first, then an elastic job that dies mid-save."""
    if not callable(train):
        raise Wrong(f"pass the function train itself, not {type(train).__name__}")
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
        os.makedirs(os.path.join(folder, "a")), os.makedirs(os.path.join(folder, "b"))
        runs = run_ranks(_ranks_042, 2, train, folder, timeout_s=60.0)[0]
    reference, resumed = runs["reference"], runs["resumed"]
    per_epoch = len(reference["seen"]) // _EPOCHS_2
    if len(reference["seen"]) != _EPOCHS_2 * per_epoch or per_epoch == 0:
        raise Wrong(
            f"without any crash, rank 0 ran {len(reference['seen'])} forward passes in {_EPOCHS_2} epochs."
        )
    _check_shuffle_042(reference["seen"])
    _compare_042(resumed["seen"], resumed["final"], reference, "called again after train(epochs=1)")
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
        report = elastic_job(
            "the first attempt died half-way through writing the snapshot of epoch 1",
            _worker_042,
            train,
            folder,
            fresh=folder,
        )[0]
    if report["attempt"] == 0:
        raise Wrong(
            "your first attempt never crashed: write the snapshot with torch.save to the path you were given."
        )
    _compare_042(
        report["seen"], report["final"], reference, "after a crash half-way through the 2nd snapshot"
    )
    return (
        "resumed after train(epochs=1), and in a real elastic job that died half-way through writing a "
        "snapshot, restarted, resumed from the last complete one, saw the batches of an uninterrupted run "
        "and ended with its weights."
    )
