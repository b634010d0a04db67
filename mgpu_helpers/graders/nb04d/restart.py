"""Used by notebook 04d's exercise 04d.2 (:mod:`~mgpu_helpers.graders.nb04d` says how it is graded): the
repair of a training loop that is not restart-safe, checked in 2 ranks and in an elastic job."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...exercises import Wrong, exercise
from .._elastic import elastic_job
from .._ranks import run_ranks
from ._common import _SAMPLES, _differs, _flat
from ._crash import arm_crash

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
    task="Repair `train(model, optimizer, data, epochs, path)` and delete the marker line; each rank keeps "
    "its half of the data, in a new order every epoch. On 2 gloo ranks, `train(epochs=1)` then "
    "`train(epochs=4)` with a fresh model must resume and match 4 uninterrupted epochs; then, in an elastic "
    "job killed while rank 0 writes its second snapshot, the restart must resume from the last complete one "
    "with the same batches and final weights.",
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
