"""Used by notebook 08's exercise 08.1 (:mod:`~mgpu_helpers.graders.nb08` says how it is graded): DDP
training with a learning-rate schedule on 2 gloo processes, with a crash and a resume."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

from ...exercises import Wrong, exercise
from .._ranks import run_ranks
from ._common import _N_TRAIN, _N_VAL, _digits, _full_accuracies

_CRASH_AT = 1000  # rank 1's 1000th item: halfway through epoch 3 (400 items per rank and epoch)

_MODEL_LR = " — the schedule must set the learning rate of the optimizer that trains the model."


class _Recorded:
    """A map-style dataset of ``(x, y)`` pairs that records the indices read, and can crash on rank 1."""

    def __init__(self, x: Any, y: Any, crash_at: int | None = None) -> None:
        self._x, self._y, self.crash_at, self.seen = x, y, crash_at, []

    def __len__(self) -> int:
        return len(self._y)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = int(index)
        self.seen.append(index)
        if self.crash_at and len(self.seen) >= self.crash_at and os.environ.get("RANK") == "1":
            raise RuntimeError("simulated crash of rank 1 (by the grader)")
        return self._x[index], self._y[index]


def _run_08_1(rank: int, world_size: int, fn: Callable[..., Any], config: dict[str, Any]) -> Any:
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    dtypes: set[str] = set()  # the output dtypes of every nn.Linear run with gradients on (training)
    rows = {"train": 0, "eval": 0}  # samples through the first layer (64 pixel inputs), with/without grad
    steps: list[tuple[Any, float]] = []  # (optimizer, its learning rate) at every optimizer step

    def note_forward(module: Any, inputs: Any, output: Any) -> None:
        if not isinstance(module, torch.nn.Linear):
            return
        if torch.is_grad_enabled():
            dtypes.add(str(output.dtype).removeprefix("torch."))
        if module.in_features == 64 and inputs and inputs[0].dim() == 2:
            rows["train" if torch.is_grad_enabled() else "eval"] += int(inputs[0].shape[0])

    def note_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        steps.append((optimizer, float(optimizer.param_groups[0]["lr"])))

    hooks = [
        torch.nn.modules.module.register_module_forward_hook(note_forward),
        register_optimizer_step_pre_hook(note_step),
    ]
    try:
        result = fn(rank, world_size, config)
    finally:
        for hook in hooks:
            hook.remove()
    if not isinstance(result, dict) or not {"accuracy", "lrs", "model"} <= set(result):
        raise TypeError("train_scheduled must return a dict with 'accuracy', 'lrs' and 'model'")
    if not isinstance(result["model"], torch.nn.Module):
        raise TypeError("result['model'] must be the trained nn.Module (the one DDP wraps: ddp_model.module)")
    trained = {id(p) for p in result["model"].parameters()}  # steps of the optimizer that trains the model
    used_lrs = [
        lr
        for opt, lr in steps
        if any(id(p) in trained for group in opt.param_groups for p in group["params"])
    ]
    model = result["model"].cpu()
    seen = config["train_set"].seen
    lrs = [float(v) for v in result["lrs"]]
    return float(result["accuracy"]), lrs, model, seen, sorted(dtypes), rows, used_lrs


def _expected_lrs(lr: float, epochs: int, steps: int) -> list[float]:
    import torch

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr, momentum=0.9)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, epochs=epochs, steps_per_epoch=steps)
    lrs = []
    for _ in range(epochs * steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def _check_work_per_rank(rows: list[dict[str, int]], epochs: int) -> None:
    """Each rank computes on its own share: its training batches, and its part of the validation set."""
    share = epochs * (_N_TRAIN // 2)
    for rank, r in enumerate(rows):
        if r["train"] > 1.5 * share:
            raise Wrong(
                f"rank {rank} ran its model on {r['train']} training samples in {epochs} epochs, but its "
                f"share is {share}: every rank computed the whole batch. In DDP each rank computes only "
                "its own share; the all-reduce of the gradients makes the update the one of the whole batch."
            )
    evaluated = [r["eval"] + max(r["train"] - share, 0) for r in rows]  # evaluation with or without no_grad
    if all(n > 0 and n % _N_VAL == 0 for n in evaluated):
        raise Wrong(
            f"every rank ran the model on all {_N_VAL} validation samples: each rank should evaluate only "
            "its own share, and every rank still report the exact accuracy of the whole set (section 2)."
        )
    if 0 in evaluated and max(evaluated) > 0:
        raise Wrong(
            f"only rank {evaluated.index(max(evaluated))} ran the model on validation samples: every rank "
            "should evaluate its own share of them (section 2)."
        )


def _check_lrs(got: list[float], want: list[float], what: str, source: str, fix: str = "") -> None:
    """``what`` made steps at the learning rates ``got``; ``source`` (OneCycleLR, or an uninterrupted run)
    made them at ``want``."""
    if len(got) != len(want) or not all(
        math.isclose(a, b, rel_tol=1e-6) for a, b in zip(got, want, strict=True)
    ):
        raise Wrong(
            f"{what} {len(got)} steps with learning rates {[round(v, 4) for v in got[:3]]}…, but {source} "
            f"{len(want)} steps with {[round(v, 4) for v in want[:3]]}…{fix}"
        )


def _check_shards(seen: list[list[int]], epochs: int) -> None:
    per_rank = _N_TRAIN // 2
    counts = [len(s) for s in seen]
    if not all(counts):
        raise Wrong(
            "no rank read an item through config['train_set'] (read the training data with a DataLoader "
            "over it, num_workers=0)."
        )
    if counts != [epochs * per_rank] * 2:
        raise Wrong(
            f"over {epochs} epochs the ranks read {counts} training items; each rank's share of "
            f"{_N_TRAIN} items is {per_rank} per epoch, {epochs * per_rank} in all."
        )
    epochs_of = [[s[e * per_rank : (e + 1) * per_rank] for e in range(epochs)] for s in seen]
    for e in range(epochs):
        a, b = set(epochs_of[0][e]), set(epochs_of[1][e])
        if a & b or len(a | b) != _N_TRAIN:
            raise Wrong(
                f"in epoch {e + 1} the two ranks read {len(a & b)} items in common and {len(a | b)} of "
                f"{_N_TRAIN} distinct items: their shares overlap."
            )
    if all(epochs_of[0][e] == epochs_of[0][0] for e in range(1, epochs)):
        raise Wrong(f"rank 0 read its items in the same order in all {epochs} epochs.")


@exercise(
    "08.1",
    "DDP training with a schedule that survives a crash",
    task="train_scheduled(rank, world_size, config): section 2's train with a OneCycleLR stepped after every "
    "optimizer step, resuming a crashed run exactly; it returns the dict the exercise names. On 2 gloo "
    "ranks, 4 epochs: data and evaluation shares, bf16 outputs, the accuracy (at least 0.85, exact for the "
    "returned model) and the learning rates are checked; then rank 1 crashes in epoch 3, and the resumed run "
    "must read only epochs 3 and 4 and end with an uninterrupted run's weights.",
    hint="start from section 2's train; a resumed run must continue exactly where the crashed one was: "
    "which objects change during training, and are they all in your checkpoint and restored from it?",
)
def grade_train_scheduled(train_scheduled: Callable[..., Any]) -> str:
    import torch

    if not callable(train_scheduled):
        raise Wrong(f"pass the function itself, not {type(train_scheduled).__name__}.")
    x, y, xv, yv = _digits()
    epochs, lr, batch = 4, 0.2, 64
    steps = math.ceil(_N_TRAIN // 2 / (batch // 2))
    with tempfile.TemporaryDirectory(prefix="grader-08-1-") as tmp:

        def config(name: str, crash_at: int | None = None) -> dict[str, Any]:
            return {
                "train_set": _Recorded(x, y, crash_at),
                "val": (xv, yv),
                "lr": lr,
                "batch_size": batch,
                "epochs": epochs,
                "checkpoint": os.path.join(tmp, f"{name}.pt"),
            }

        whole = run_ranks(_run_08_1, 2, train_scheduled, config("whole"), timeout_s=60)
        try:
            run_ranks(_run_08_1, 2, train_scheduled, config("crashed", _CRASH_AT), timeout_s=60)
        except Wrong as exc:
            if "simulated crash" not in str(exc):
                raise Wrong(f"in the run the grader crashes, {exc}") from None
        else:
            raise Wrong(
                "the grader's crash (rank 1, epoch 3) never happened: does your loop read its items from "
                "config['train_set']?"
            )
        if not os.path.exists(config("crashed")["checkpoint"]):
            raise Wrong("after two epochs and a crash there is no file at config['checkpoint'].")
        resumed = run_ranks(_run_08_1, 2, train_scheduled, config("crashed"), timeout_s=60)
    (acc0, lrs, model0, seen0, dtypes, rows0, used0), (acc1, _, model1, seen1, _, rows1, _) = whole
    if dtypes != ["bfloat16"]:  # the grader's ranks are gloo processes on the CPU: bf16 autocast
        raise Wrong(
            f"during training the linear layers produced {dtypes or 'no'} outputs; mixed precision on this "
            "CPU gives bfloat16."
        )
    state0, state1 = model0.state_dict(), model1.state_dict()
    for name, value in state0.items():
        if not torch.allclose(value, state1[name], atol=1e-6):
            raise Wrong(f"after training, '{name}' differs between rank 0 and rank 1.")
    _check_shards([seen0, seen1], epochs)
    _check_work_per_rank([rows0, rows1], epochs)
    if acc0 != acc1:
        raise Wrong(f"the ranks report different validation accuracies, {acc0:.4f} and {acc1:.4f}.")
    full = _full_accuracies(model0, xv, yv)
    if not any(abs(acc0 - a) < 1e-7 for a in full):  # 1e-7: the mean of 151 and 150 samples' accuracies fails
        raise Wrong(
            f"the reported validation accuracy is {acc0:.5f}, but the returned model classifies "
            f"{full[0]:.5f} of all {_N_VAL} validation samples correctly ({full[1]:.5f} under bf16 "
            "autocast): some samples were left out or counted twice."
        )
    if acc0 < 0.85:
        raise Wrong(f"after {epochs} epochs the validation accuracy is {acc0:.3f}, below 0.85.")
    expected, source = _expected_lrs(lr, epochs, steps), f"OneCycleLR ({epochs} epochs of {steps}) makes"
    _check_lrs(lrs, expected, "an uninterrupted run reported", source)
    _check_lrs(used0, expected, "in an uninterrupted run the optimizer of the model made", source, _MODEL_LR)
    acc_r, lrs_r, model_r, _, _, _, used_r = resumed[0]
    tail = expected[2 * steps :]
    done = 2 * (_N_TRAIN // 2)  # the items each rank read in epochs 1 and 2
    for rank, (run, before) in enumerate(zip(resumed, (seen0, seen1), strict=True)):
        if run[3] != before[done:]:
            raise Wrong(
                f"after the crash, rank {rank} read {len(run[3])} training items; resuming from the "
                f"checkpoint of epoch 2 leaves epochs 3 and 4: {len(before) - done} items, in the order of "
                "an uninterrupted run. Load the finished epochs from the checkpoint; do not train them again."
            )
    source = "in epochs 3 and 4 an uninterrupted run made"
    _check_lrs(lrs_r, tail, "after the crash in epoch 3 the resumed run reported", source)
    _check_lrs(used_r, tail, "in the resumed run the optimizer of the model made", source, _MODEL_LR)
    state_r = model_r.state_dict()
    gap = max((state_r[k] - v).abs().max().item() for k, v in state0.items())
    if gap > 1e-6:
        raise Wrong(
            f"the resumed run's final weights differ from the uninterrupted run's by up to {gap:.2g}."
        )
    return (
        "2 ranks trained under bf16 autocast, shared the data in a new order every epoch, reported the "
        f"exact validation accuracy ({acc0:.3f}) and followed OneCycleLR; crashed in epoch 3 and resumed, "
        "the final weights equal an uninterrupted run's"
    )
