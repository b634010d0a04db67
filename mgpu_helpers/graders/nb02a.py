"""Used by notebook 02a's exercises: a model whose ``forward`` streams micro-batches across two devices,
as in PyTorch's model-parallel tutorial (02a.1), and one GPipe training step on ``p`` stage processes
(02a.2), run on real gloo processes started with :func:`mgpu_helpers.launching.launch`.

02a.1 builds the student's class on ``("cpu", "cpu")`` with ``split_size=64``, feeds it 200 rows (so the
last micro-batch is short), and compares output and gradients with the same layers applied to the whole
batch at once; forward hooks count how many rows each part saw per call.

02a.2 runs the student's ``gpipe_step(rank, world_size, stage, x, y, m)`` on 3 processes (so a middle
stage exists), a 3-stage model from :func:`~mgpu_helpers.pipeline.make_stages` and m = 4; hooks record
each stage's passes in order. It compares the returned loss and every gradient with the unsplit model.

"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ..pipeline import make_batch, make_stages
from ._ranks import run_ranks


def compare_grads(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], what: str) -> None:
    """Raise :class:`Wrong` naming the first gradient that differs from the reference, and by how much."""
    for name, want in ref.items():
        have = got.get(name)
        if have is None:
            raise Wrong(f"{what}: the parameter {name} got no gradient (was its backward run?)")
        if not torch.allclose(have, want, rtol=1e-4, atol=1e-6):
            ratio = (have.norm() / want.norm()).item() if want.norm() > 0 else float("inf")
            raise Wrong(
                f"{what}: the gradient of {name} differs from the unsplit model's "
                f"(its norm is {ratio:.3g}× the expected one)."
            )


# --- 02a.1: micro-batches across two devices, in one forward ------------------------------------------


@exercise(
    "02a.1",
    "micro-batches across two devices",
    hint="split x into chunks of split_size rows (the last may be shorter); each chunk goes through part1 "
    "on dev0, then part2 and fc on dev1; concatenate the outputs in order.",
)
def grade_pipelined_forward(cls: type) -> str:
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise Wrong(f"pass the class itself (an nn.Module subclass), not {type(cls).__name__}")
    net = cls("cpu", "cpu", split_size=64)
    for part in ("part1", "part2", "fc"):
        if not isinstance(getattr(net, part, None), nn.Module):
            raise Wrong(f"the model has no module attribute {part!r}: keep TwoDeviceNet's parts")
    rows: dict[str, list[int]] = {"part1": [], "part2": []}
    for part in rows:
        getattr(net, part).register_forward_hook(
            lambda mod, args, out, part=part: rows[part].append(len(args[0]))
        )
    width = next(m for m in net.part1.modules() if isinstance(m, nn.Linear)).in_features
    x = torch.randn(200, width, generator=torch.Generator().manual_seed(3))
    out = net(x)
    rows_seen = {part: list(seen) for part, seen in rows.items()}
    reference = nn.Sequential(net.part1, net.part2, net.fc)
    with torch.no_grad():
        want = reference(x)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"for 200 input rows the output has shape {got}, expected {tuple(want.shape)}.")
    if not torch.allclose(out, want, rtol=1e-5, atol=1e-6):
        raise Wrong("the output differs from the model applied to the whole batch (are the rows in order?).")
    for part, seen in rows_seen.items():
        if seen != [64, 64, 64, 8]:
            raise Wrong(
                f"{part} was called on row counts {seen}; with 200 rows and split_size=64 a pipelined "
                "forward calls it once per micro-batch."
            )
    out.pow(2).mean().backward()
    got = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad()
    reference(x).pow(2).mean().backward()
    compare_grads(got, {n: p.grad for n, p in net.named_parameters()}, "backward through your forward")
    return (
        "4 micro-batches (64, 64, 64, 8 rows) through both parts; "
        "output and gradients equal the unsplit model's."
    )


# --- 02a.2: GPipe on p stage processes ----------------------------------------------------------------

_P, _M, _ROWS, _WIDTH = 3, 4, 24, 32


def _gpipe_rank(rank: int, world_size: int, gpipe_step: Callable[..., Any]) -> dict[str, Any]:
    stage = make_stages(world_size, _WIDTH, 1)[rank]
    x, y = make_batch(_ROWS, _WIDTH)
    passes: list[str] = []
    rows: list[int] = []

    def note(mod: nn.Module, args: tuple[Any, ...]) -> None:
        passes.append("F")
        rows.append(len(args[0]))

    stage.register_forward_pre_hook(note)
    first = next(m for m in stage if isinstance(m, nn.Linear))
    first.weight.register_post_accumulate_grad_hook(lambda p: passes.append("B"))
    loss = gpipe_step(rank, world_size, stage, x, y, _M)
    grads = {f"{rank}.{n}": p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}
    loss = float(loss) if isinstance(loss, (torch.Tensor, float, int)) else loss
    return {"loss": loss, "grads": grads, "passes": "".join(passes), "rows": rows}


@exercise(
    "02a.2",
    "GPipe on p stages",
    hint="a middle stage receives from rank - 1 and sends to rank + 1; run all m forwards before the first "
    "backward; the last stage's loss for each micro-batch counts 1/m of the batch's mean loss.",
    forbid=("run_order",),
)
def grade_gpipe_step(gpipe_step: Callable[..., Any]) -> str:
    if not callable(gpipe_step):
        raise Wrong(f"pass the function itself, not {type(gpipe_step).__name__}")
    results = run_ranks(_gpipe_rank, _P, gpipe_step, who="stage processes")
    rows = _ROWS // _M
    for rank, res in enumerate(results):
        if res["rows"] != [rows] * _M:
            raise Wrong(
                f"stage {rank} ran forwards on row counts {res['rows']}, "
                f"expected {_M} micro-batches of {rows}."
            )
        if res["passes"] != "F" * _M + "B" * _M:
            raise Wrong(
                f"stage {rank} ran its passes in the order {res['passes']} (F = forward, B = backward)."
            )
    model = nn.Sequential(*make_stages(_P, _WIDTH, 1))
    x, y = make_batch(_ROWS, _WIDTH)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    last = results[-1]["loss"]
    if not isinstance(last, float) or abs(last - loss.item()) > 1e-5:
        raise Wrong(
            f"the last stage returned the loss {last!r}; the unsplit model's batch loss is {loss.item():.6f}."
        )
    got = {k: g for res in results for k, g in res["grads"].items()}
    compare_grads(
        got, {n: p.grad for n, p in model.named_parameters()}, "after the step"
    )  # "1.0.weight": stage 1
    return (
        f"{_P} stage processes, {_M} micro-batches, every stage FFFFBBBB; "
        "loss and all gradients equal the unsplit model's."
    )
