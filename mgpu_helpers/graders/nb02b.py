"""Used by notebook 02b's exercises: the 1F1B order written by hand (02b.1) and a few training steps
with ``PipelineStage`` and ``Schedule1F1B`` (02b.2), run for real.

02b.1 calls the student's ``one_f_one_b(p, m)`` for several (p, m) — also m < p — and runs the orders in
the simulator (:func:`mgpu_helpers.pipeline.simulate_orders`, equal costs, backward = 2 × forward):
they must not deadlock, must take no longer than GPipe, and stage ``s`` must never hold the activations
of more than ``p - s`` micro-batches. Then it runs the orders for p = 2, m = 4 on two gloo processes
(:func:`mgpu_helpers.pipeline.run_order`) and compares the gradients with the unsplit model's. The
package's and PyTorch's own 1F1B orders (``stage_order``, ``_one_f_one_b``, ``Schedule1F1B``) are not
accepted.

02b.2 runs the student's ``train_stage(rank, world_size, stage_module, x, y, m, steps, lr)`` on two gloo
processes and compares each stage's parameters after 3 steps with the unsplit model trained by plain
SGD on the whole batch; hooks check that the last step ran 1F1B's order. Both exercises use a model and
a batch with seeds of their own (the notebook's ``make_stages()``/``make_batch()`` cannot rebuild them),
and in 02b.2 only rank 0 gets the real ``x`` and only the last rank the real ``y`` (NaN elsewhere), so a
rank that trains the whole model by itself fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ..pipeline import (
    make_batch,
    make_stages,
    peaks_in_flight,
    run_order,
    simulate,
    simulate_orders,
    stage_order,
)
from ._ranks import run_ranks
from .nb02a import compare_grads

_WIDTH, _ROWS = 32, 16
#: Seeds of the grader's own model and batch: the notebook's make_stages()/make_batch() defaults differ.
_MODEL_SEED, _BATCH_SEED = 2404, 2405


def _model(p: int) -> list[nn.Sequential]:
    return make_stages(p, _WIDTH, 1, seed=_MODEL_SEED)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return make_batch(_ROWS, _WIDTH, seed=_BATCH_SEED)


# --- 02b.1: the 1F1B order ------------------------------------------------------------------------------


def _orders(one_f_one_b: Callable[[int, int], Any], p: int, m: int) -> list[list[tuple[str, int]]]:
    orders = one_f_one_b(p, m)
    if not isinstance(orders, (list, tuple)) or len(orders) != p:
        got = len(orders) if isinstance(orders, (list, tuple)) else type(orders).__name__
        raise Wrong(f"one_f_one_b({p}, {m}) must return one list per stage ({p} lists), got {got}.")
    return [[tuple(a) if isinstance(a, list) else a for a in order] for order in orders]


def _run_orders_rank(
    rank: int, world_size: int, orders: list[list[tuple[str, int]]]
) -> dict[str, torch.Tensor]:
    stage = _model(world_size)[rank]
    x, y = _batch()
    m = len(orders[rank]) // 2
    run_order(
        stage, [(k, i, 0) for k, i in orders[rank]], rank, world_size, list(x.chunk(m)), list(y.chunk(m))
    )
    return {f"{rank}.{n}": p.grad.clone() for n, p in stage.named_parameters()}


@exercise(
    "02b.1",
    "the 1F1B order",
    task="one_f_one_b(p, m) returns, per stage, its passes in 1F1B order as ('F', i) and ('B', i), i = 0 "
    "... m - 1. Seven (p, m), some with m < p, run in the simulator (a backward costs 2 forwards): no "
    "deadlock, no slower than GPipe, stage s never holding over p - s micro-batches; p = 2, m = 4 also runs "
    "on 2 gloo processes against the unsplit model's gradients.",
    hint="a stage warms up with just enough forwards to keep the stages after it busy, then alternates one "
    "forward and one backward, and ends with the backwards it still owes; F and B of each micro-batch once.",
    forbid=(
        "stage_order",
        "_one_f_one_b",
        "simulate",
        "simulate_orders",
        "pipelining",
        "Schedule1F1B",
        "ScheduleInterleaved1F1B",
        "pipeline_order",
        "_get_pipeline_order",
        "_calculate_single_rank_operations",
    ),
)
def grade_one_f_one_b(one_f_one_b: Callable[[int, int], Any]) -> str:
    if not callable(one_f_one_b):
        raise Wrong(f"pass the function itself, not {type(one_f_one_b).__name__}")
    cases = [(2, 4), (4, 8), (3, 2), (4, 2), (4, 4), (1, 3), (5, 7)]
    for p, m in cases:
        orders = _orders(one_f_one_b, p, m)
        try:
            tasks = simulate_orders(orders)
        except (TypeError, ValueError) as exc:
            raise Wrong(f"for p={p}, m={m}: {exc}.") from None
        except RuntimeError:
            raise Wrong(
                f"for p={p}, m={m} the orders deadlock: every stage waits for an input another stage "
                "produces only later in its own order."
            ) from None
        span, gpipe = max(t.end for t in tasks), simulate("gpipe", p, m).makespan
        if span > gpipe + 1e-9:
            raise Wrong(
                f"for p={p}, m={m} a step takes {span:g} time units in the simulator, GPipe's {gpipe:g}: "
                "the orders leave stages idle longer than needed."
            )
        for s, peak in enumerate(peaks_in_flight(tasks, p)):
            if peak > p - s:
                raise Wrong(
                    f"for p={p}, m={m} stage {s} holds the activations of {peak} micro-batches at once; "
                    f"1F1B needs at most p - s = {p - s} there."
                )
    orders = _orders(one_f_one_b, 2, 4)
    got = {k: g for res in run_ranks(_run_orders_rank, 2, orders) for k, g in res.items()}
    model = nn.Sequential(*_model(2))
    x, y = _batch()
    F.mse_loss(model(x), y).backward()
    compare_grads(got, {n: p.grad for n, p in model.named_parameters()}, "run on 2 processes")
    return (
        "no deadlock, as fast as GPipe and at most p - s micro-batches held on stage s "
        f"for (p, m) in {cases}; "
        "on 2 gloo processes the gradients equal the unsplit model's."
    )


# --- 02b.2: training with PipelineStage and Schedule1F1B ------------------------------------------------

_M, _STEPS, _LR = 4, 3, 0.1


def _train_rank(rank: int, world_size: int, train_stage: Callable[..., Any]) -> dict[str, Any]:
    stage = _model(world_size)[rank]
    x, y = _batch()
    if rank > 0:  # only the first stage reads the batch
        x = torch.full_like(x, float("nan"))
    if rank < world_size - 1:  # only the last stage computes the loss
        y = torch.full_like(y, float("nan"))
    passes: list[str] = []
    stage.register_forward_pre_hook(lambda mod, args: passes.append("F"))
    stage[0].weight.register_post_accumulate_grad_hook(lambda p: passes.append("B"))
    train_stage(rank, world_size, stage, x, y, _M, _STEPS, _LR)
    return {
        "params": {f"{rank}.{n}": p.detach().clone() for n, p in stage.named_parameters()},
        "passes": "".join(passes),
    }


@exercise(
    "02b.2",
    "train with Schedule1F1B",
    task="train_stage(rank, world_size, stage_module, x, y, m, steps, lr) trains this rank's piece with "
    "PipelineStage, Schedule1F1B (m micro-batches, MSE loss) and SGD at learning rate lr for steps steps; x "
    "is real only on rank 0, y only on the last. On 2 gloo processes, 3 steps with m = 4: hooks check the "
    "order of passes, and every parameter is compared with the unsplit model trained by SGD.",
    hint="§1 built one pipeline step with the real API; training repeats it, and an optimizer can only "
    "update the parameters this rank holds. What must happen to the gradients between two steps?",
    forbid=("run_order", "stage_order"),
)
def grade_train_stage(train_stage: Callable[..., Any]) -> str:
    if not callable(train_stage):
        raise Wrong(f"pass the function itself, not {type(train_stage).__name__}")
    results = run_ranks(_train_rank, 2, train_stage)
    for rank, res in enumerate(results):
        want = "".join(k for k, _, _ in stage_order("1f1b", rank, 2, _M))
        if not res["passes"].endswith(want) or res["passes"].count("B") != _STEPS * _M:
            raise Wrong(
                f"stage {rank} ran the passes {res['passes']}; "
                f"{_STEPS} steps of 1F1B with m={_M} end with {want} "
                f"and run {_STEPS * _M} backwards in all."
            )
    model = nn.Sequential(*_model(2))
    x, y = _batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=_LR)
    for _ in range(_STEPS):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    got = {k: v for res in results for k, v in res["params"].items()}
    for name, want in model.named_parameters():
        if not torch.allclose(got[name], want.detach(), rtol=1e-4, atol=1e-6):
            drift = (got[name] - want.detach()).abs().max().item()
            raise Wrong(
                f"after {_STEPS} steps the parameter {name} differs from the unsplit model trained with SGD "
                f"(largest difference {drift:.2g})."
            )
    return (
        f"{_STEPS} steps of 1F1B on 2 gloo processes; "
        "every parameter equals the unsplit model trained with SGD."
    )
