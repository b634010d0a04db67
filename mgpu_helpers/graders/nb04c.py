"""Used by notebook 04c's exercises: exact distributed evaluation with a padded sampler (04c.1)
and a SyncBatchNorm written by hand with an all-reduce (04c.2), each run on 2 and 3 real gloo
processes started with :func:`mgpu_helpers.launching.launch`.

04c.1 hands the student's ``evaluate(model, dataset)`` a fixed linear classifier (a module that counts
the rows its ``forward`` sees) and a 25-sample dataset, which ``DistributedSampler`` pads with 1 repeat
on 2 ranks and 2 on 3 ranks, and compares every rank's ``(loss, accuracy)`` with one process's mean
cross-entropy and accuracy on the whole dataset. It calls ``evaluate`` again on a 73-sample dataset
and counts the bytes each rank's collectives carry (:class:`~mgpu_helpers.collectives.CollectiveSpy`):
a rank must communicate, and no more for 73 samples than for 25 — a few sums, not every prediction.

04c.2 gives each rank an uneven share of a float64 batch (3 + 5 rows, then 2 + 4 + 6) and a
``BatchNorm1d`` with non-trivial weight and bias, calls the student's ``sync_batch_norm(x, bn)``,
backpropagates a fixed weighted sum, and compares the outputs, the running statistics, the input
gradients and the summed weight and bias gradients with one ``BatchNorm1d`` on the whole batch. It
repeats the forward and backward pass with 10 times the rows and rejects work whose communicated bytes
(forward and backward, counted with ``CollectiveSpy``) grow with the rows: that gathers the batch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from ..collectives import CollectiveSpy
from ..exercises import Wrong, exercise
from ._ranks import run_ranks

# --- 04c.1: exact evaluation with a padded sampler -------------------------------------------------------

_N_EVAL = 25  # DistributedSampler pads it to 26 on 2 ranks (1 repeat) and to 27 on 3 ranks (2 repeats)
_N_LARGE = 73  # padded to 74 on 2 ranks and to 75 on 3: the same repeats, about 3 times the samples
_WRONGLY_LABELLED = (3, 5, 6, 9, 14, 17, 20, 22)  # samples 0 and 1 (the ones padding repeats) are right
_SLACK = 16  # bytes: pickled sums may differ by a byte or two; per-sample values grow by far more


class _CountingModel(nn.Module):
    """The model handed to the student: counts the rows it sees inside ``forward`` (so ``model(x)`` and
    ``model.forward(x)`` both count)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3).double()
        self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += len(x)
        return self.linear(x)


def _eval_dataset(n: int = _N_EVAL) -> TensorDataset:
    x = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = _CountingModel()(x).argmax(dim=1)
    for i in _WRONGLY_LABELLED + tuple(range(27, n, 4)):
        y[i] = (y[i] + 1) % 3
    return TensorDataset(x, y)


def _eval_truth() -> tuple[float, float]:
    x, y = _eval_dataset().tensors
    with torch.no_grad():
        logits = _CountingModel()(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(dim=1) == y).double().mean().item()


def _eval_rank(rank: int, world_size: int, evaluate: Callable[..., Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, key in ((_N_EVAL, ""), (_N_LARGE, "large ")):
        model = _CountingModel()
        with CollectiveSpy() as spy:
            out[key + "answer"] = evaluate(model, _eval_dataset(n))
        out[key + "rows"], out[key + "bytes"] = model.rows, spy.bytes()
    return out


def _pair(answer: Any) -> tuple[float, float] | None:
    """``(loss, accuracy)`` as two floats, or None."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return None
    out = []
    for v in answer:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        out.append(float(v))
    return out[0], out[1]


@exercise(
    "04c.1",
    "exact evaluation with a padded sampler",
    task="`evaluate(model, dataset)` → `(loss, accuracy)` on every rank: the mean cross-entropy and the "
    "accuracy over the whole dataset, each sample counted once, the model run on the rank's padded "
    "`DistributedSampler` share. Checked on 2 and 3 gloo ranks with 25 samples against one process; each "
    "model may see at most its share, and each rank must communicate, no more bytes for 73 samples than for "
    "25.",
    hint="Where in the sampler's padded list of total_size indices does your rank's i-th sample sit, and "
    "which positions there are repeats? And when the ranks hold different numbers of real samples, is "
    "the mean of their means the mean over all samples?",
)
def grade_evaluate(evaluate: Callable[..., Any]) -> str:
    """2 and 3 gloo ranks on 25 samples: every rank's (loss, accuracy) equals one process's."""
    if not callable(evaluate):
        raise Wrong(f"pass the function evaluate itself, not {type(evaluate).__name__}")
    truth = _eval_truth()
    for world_size in (2, 3):
        ranks = run_ranks(_eval_rank, world_size, evaluate)
        share = math.ceil(_N_EVAL / world_size)
        repeats = share * world_size - _N_EVAL
        for rank, out in enumerate(ranks):
            if out["rows"] > share:
                raise Wrong(
                    f"with {world_size} ranks, rank {rank} ran the model on {out['rows']} samples; its "
                    f"share of the padded sampler is {share}: run the model once, on that share only."
                )
            answer = _pair(out["answer"])
            if answer is None:
                raise Wrong(
                    f"rank {rank} returned {out['answer']!r:.60}; return (loss, accuracy), two numbers."
                )
            for name, got, want in zip(("mean cross-entropy", "accuracy"), answer, truth, strict=True):
                if not abs(got - want) <= 1e-6 * max(abs(want), 1.0):
                    raise Wrong(
                        f"with {world_size} ranks on {_N_EVAL} samples ({repeats} of them repeated by the "
                        f"sampler's padding), rank {rank} reported {name} {got:.6f}, but one process on the "
                        f"whole dataset measures {want:.6f}."
                    )
        if sum(out["rows"] for out in ranks) < _N_EVAL:
            raise Wrong(f"with {world_size} ranks, some of the {_N_EVAL} samples were never evaluated.")
        for rank, out in enumerate(ranks):
            if out["bytes"] == 0:
                raise Wrong(
                    f"with {world_size} ranks, rank {rank} never communicated: it cannot know the other "
                    "ranks' results, so it did not evaluate only its own share."
                )
            if out["large bytes"] > out["bytes"] + _SLACK:
                raise Wrong(
                    f"with {world_size} ranks, rank {rank}'s collectives carried {out['bytes']} bytes for "
                    f"{_N_EVAL} samples but {out['large bytes']} for {_N_LARGE}: what it sends grows with "
                    "the dataset, so it sends per-sample values. A few sums per rank are enough."
                )
    return (
        f"on 2 and 3 real gloo processes, each rank evaluated at most its padded share of {_N_EVAL} samples, "
        "communicated a few numbers (no more for a larger dataset), and every rank reported exactly the "
        "single-process mean cross-entropy and accuracy."
    )


# --- 04c.2: SyncBatchNorm by hand --------------------------------------------------------------------------

_FEATURES = 6
_ROWS = {2: (3, 5), 3: (2, 4, 6)}
_MORE_ROWS = 10  # the second pass: 10 times each rank's rows, to see whether the communication grows


def _bn() -> nn.BatchNorm1d:
    bn = nn.BatchNorm1d(_FEATURES).double()
    with torch.no_grad():
        bn.weight.copy_(1 + 0.1 * torch.arange(_FEATURES))
        bn.bias.copy_(0.05 * torch.arange(_FEATURES))
        bn.running_mean.fill_(0.5)  # not the defaults, so that a forgotten update shows
        bn.running_var.fill_(2.0)
    return bn


def _batch(world_size: int, scale: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(world_size + 10 * scale)
    n = scale * sum(_ROWS[world_size])
    x = 3 + 2 * torch.randn(n, _FEATURES, dtype=torch.float64, generator=gen)
    return x, torch.randn(n, _FEATURES, dtype=torch.float64, generator=gen)  # inputs, loss weights


def _bn_pass(rank: int, world_size: int, sync_batch_norm: Callable[..., Any], scale: int) -> dict[str, Any]:
    x, coef = _batch(world_size, scale)
    start = scale * sum(_ROWS[world_size][:rank])
    rows = slice(start, start + scale * _ROWS[world_size][rank])
    mine = x[rows].clone().requires_grad_(True)
    bn = _bn().train()
    with warnings.catch_warnings(), CollectiveSpy() as spy:  # a plain dist.all_reduce's backward warns
        warnings.simplefilter("ignore")
        out = sync_batch_norm(mine, bn)
        if not isinstance(out, torch.Tensor) or out.shape != mine.shape:
            return {"bad": repr(out)[:60]}
        (out * coef[rows]).sum().backward()  # this rank's part of the loss
    return {
        "out": out.detach(),
        "running": (bn.running_mean.clone(), bn.running_var.clone()),
        "x_grad": None if mine.grad is None else mine.grad.clone(),
        "wb_grad": [None if p.grad is None else p.grad.clone() for p in (bn.weight, bn.bias)],
        "bytes": spy.bytes(),
    }


def _bn_rank(rank: int, world_size: int, sync_batch_norm: Callable[..., Any]) -> dict[str, Any]:
    out = _bn_pass(rank, world_size, sync_batch_norm, 1)
    if "bad" not in out:  # the same pass on 10 times the rows: only the communicated bytes are compared
        out["more bytes"] = _bn_pass(rank, world_size, sync_batch_norm, _MORE_ROWS).get("bytes", 0)
    return out


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@exercise(
    "04c.2",
    "SyncBatchNorm by hand",
    task="`sync_batch_norm(x, bn)` → what `bn` (training mode) outputs on all ranks' rows together, updating "
    "its running statistics as it would, with the whole batch's gradients. Checked in float64 on 2 ranks (3 "
    "+ 5 rows) and 3 (2 + 4 + 6) against one `BatchNorm1d` on the whole batch: outputs, running statistics, "
    "input and summed weight/bias gradients; the bytes each rank sends may not grow with 10 times the rows.",
    hint="Which sums must every rank know to get the statistics of the whole batch, and how many samples "
    "are there in all? Which variance goes into running_var? And does the backward pass of your "
    "all-reduce reach the other ranks?",
)
def grade_sync_batch_norm(sync_batch_norm: Callable[..., Any]) -> str:
    """2 and 3 gloo ranks with uneven rows: outputs, running stats and gradients vs the full batch."""
    if not callable(sync_batch_norm):
        raise Wrong(f"pass the function sync_batch_norm itself, not {type(sync_batch_norm).__name__}")
    for world_size in (2, 3):
        ranks = run_ranks(_bn_rank, world_size, sync_batch_norm)
        x, coef = _batch(world_size)
        full = _bn().train()
        x = x.clone().requires_grad_(True)
        expected = full(x)
        (expected * coef).sum().backward()
        starts = [sum(_ROWS[world_size][:r]) for r in range(world_size)]
        setting = f"with {world_size} ranks holding {'+'.join(map(str, _ROWS[world_size]))} rows"
        for rank, out in enumerate(ranks):
            if "bad" in out:
                raise Wrong(f"rank {rank}'s sync_batch_norm returned {out['bad']}; return the normalised x.")
            rows = slice(starts[rank], starts[rank] + _ROWS[world_size][rank])
            diff = _max_diff(out["out"], expected[rows].detach())
            if not diff < 1e-9:
                raise Wrong(
                    f"{setting}, rank {rank}'s output differs from BatchNorm on the whole batch by "
                    f"{diff:.3g}."
                )
            for name, got, want in zip(
                ("running_mean", "running_var"),
                out["running"],
                (full.running_mean, full.running_var),
                strict=True,
            ):
                diff = _max_diff(got, want)
                if not diff < 1e-9:
                    raise Wrong(
                        f"{setting}, rank {rank}'s {name} differs from the whole batch's by {diff:.3g}."
                    )
            if out["x_grad"] is None:
                raise Wrong(f"{setting}, rank {rank}'s input got no gradient: the output must depend on x.")
            diff = _max_diff(out["x_grad"], x.grad[rows])
            if not diff < 1e-9:
                raise Wrong(
                    f"{setting}, the outputs are right but rank {rank}'s input gradient differs from the "
                    f"whole batch's by {diff:.3g}."
                )
        for i, name in enumerate(("weight", "bias")):
            if any(out["wb_grad"][i] is None for out in ranks):
                raise Wrong(f"{setting}, bn.{name} got no gradient: use bn.weight and bn.bias in the output.")
            diff = _max_diff(sum(out["wb_grad"][i] for out in ranks), (full.weight.grad, full.bias.grad)[i])
            if not diff < 1e-9:
                raise Wrong(
                    f"{setting}, the ranks' {name} gradients add up to something else than the whole "
                    f"batch's (off by {diff:.3g})."
                )
        for rank, out in enumerate(ranks):
            n = _ROWS[world_size][rank]
            if out["more bytes"] > out["bytes"] + _SLACK:
                raise Wrong(
                    f"{setting}, rank {rank}'s collectives (forward and backward) carried {out['bytes']} "
                    f"bytes for its {n} rows but {out['more bytes']} bytes for {_MORE_ROWS * n} rows: what "
                    "it sends grows with its rows, so it moves rows. Send a few numbers per feature instead."
                )
    return (
        "on 2 and 3 real gloo processes with uneven batches, outputs, running statistics, input gradients "
        "and (summed over ranks) weight and bias gradients equal one BatchNorm on the whole batch, and what "
        "each rank sends does not grow with its rows."
    )
