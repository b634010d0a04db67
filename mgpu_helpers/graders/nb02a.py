"""Used by notebook 02a's exercises: a model whose ``forward`` streams micro-batches across two devices,
as in PyTorch's model-parallel tutorial (02a.1), and one GPipe training step on ``p`` stage processes
(02a.2), run on real gloo processes started with :func:`mgpu_helpers.launching.launch`.

02a.1 builds the student's class on ``("cpu", "cpu")`` with ``split_size=64``, feeds it 200 rows (so the
last micro-batch is short), and compares output and gradients with the same layers applied to the whole
batch at once; forward pre-hooks record how many rows each part saw per call, and on which device. It
then builds the class on ``("cpu", "meta")``: on the meta device tensors have shapes but no values, so a
part used on the wrong device, a forgotten ``.to(dev1)`` or a result brought back to the host (which
would make a GPU wait) fails there.

02a.2 runs the student's ``gpipe_step(rank, world_size, stage, x, y, m)`` on 3 processes (so a middle
stage exists), a 3-stage model from :func:`~mgpu_helpers.pipeline.make_stages` with a seed of its own
(so the notebook's ``make_stages()`` cannot rebuild the other stages) and m = 4; only rank 0 gets the real
``x`` and only the last rank the real ``y`` (the others get NaN-filled tensors of the same shapes, so
a rank that computes the whole batch itself fails). Hooks record each stage's passes in order and check
that a later stage's input comes from ``recv`` (a leaf), not from layers run on that rank. It compares the
returned loss and every gradient with the unsplit model. ``torch.distributed.pipelining`` is not accepted:
the exercise is the send/recv by hand.

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
    task="forward of PipelinedTwoDeviceNet returns the unsplit model's output on dev1, computed in "
    "micro-batches of self.split_size rows, part1 on dev0, part2 and fc on dev1. Built on ('cpu', 'cpu') "
    "with split_size=64 and fed 200 rows: hooks count each part's rows per call, output and gradients are "
    "compared with the unsplit model; built on ('cpu', 'meta'): each part must get its input on its device.",
    hint="split x into chunks of split_size rows (the last may be shorter); each chunk goes through part1 "
    "on dev0, then part2 and fc on dev1; concatenate the outputs in order.",
)
def grade_pipelined_forward(cls: type) -> str:
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise Wrong(f"pass the class itself (an nn.Module subclass), not {type(cls).__name__}")
    net = cls("cpu", "cpu", split_size=64)
    calls = _record_calls(net)
    width = next(m for m in net.part1.modules() if isinstance(m, nn.Linear)).in_features
    x = torch.randn(200, width, generator=torch.Generator().manual_seed(3))
    out = net(x)
    seen = list(calls)
    reference = nn.Sequential(net.part1, net.part2, net.fc)
    with torch.no_grad():
        want = reference(x)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"for 200 input rows the output has shape {got}, expected {tuple(want.shape)}.")
    if not torch.allclose(out, want, rtol=1e-5, atol=1e-6):
        raise Wrong("the output differs from the model applied to the whole batch (are the rows in order?).")
    for part in ("part1", "part2", "fc"):
        rows = [n for name, n, _ in seen if name == part]
        if rows != [64, 64, 64, 8]:
            raise Wrong(
                f"{part} was called on row counts {rows}; with 200 rows and split_size=64 a pipelined "
                "forward calls it once per micro-batch."
            )
    out.pow(2).mean().backward()
    got = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad()
    reference(x).pow(2).mean().backward()
    compare_grads(got, {n: p.grad for n, p in net.named_parameters()}, "backward through your forward")
    _check_devices(cls, x)
    return (
        "4 micro-batches (64, 64, 64, 8 rows) through part1, then part2 and fc; output and gradients equal "
        "the unsplit model's; built on ('cpu', 'meta'), every part ran on its own device."
    )


def _record_calls(net: nn.Module) -> list[tuple[str, int, torch.device]]:
    """Forward hooks on part1, part2 and fc: (part, rows, device of the input) for every call, in order."""
    for part in ("part1", "part2", "fc"):
        if not isinstance(getattr(net, part, None), nn.Module):
            raise Wrong(f"the model has no module attribute {part!r}: keep TwoDeviceNet's parts")
    calls: list[tuple[str, int, torch.device]] = []
    for part in ("part1", "part2", "fc"):
        getattr(net, part).register_forward_pre_hook(
            lambda mod, args, part=part: calls.append((part, len(args[0]), args[0].device))
        )
    return calls


def _check_devices(cls: type, x: torch.Tensor) -> None:
    """Build on ("cpu", "meta") (two devices without a GPU): each part must see its inputs on its device."""
    net = cls("cpu", "meta", split_size=64)
    calls = _record_calls(net)
    try:
        out = net(x)
    except Exception as exc:  # e.g. a meta tensor meeting CPU weights, or .cpu()/.item() on a meta tensor
        raise Wrong(
            f"built as cls('cpu', 'meta') your forward raised {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. Each micro-batch must move to "
            "dev1 after part1, and stay there (no .cpu(), .item() or .to(x.device): each makes a GPU wait)."
        ) from None
    wrong = sorted({f"{part} got its input on {dev}" for part, _, dev in calls if dev != _DEVICE[part]})
    if wrong:
        raise Wrong(
            f"built as cls('cpu', 'meta'): {', '.join(wrong)}; part1 runs on dev0, part2 and fc on dev1."
        )
    if not isinstance(out, torch.Tensor) or out.device.type != "meta":
        where = out.device if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"built as cls('cpu', 'meta') the output is on {where}: return it on dev1, where fc ran.")


_DEVICE = {"part1": torch.device("cpu"), "part2": torch.device("meta"), "fc": torch.device("meta")}


# --- 02a.2: GPipe on p stage processes ----------------------------------------------------------------

_P, _M, _ROWS, _WIDTH = 3, 4, 24, 32
#: Seeds of the grader's own model and batch: the notebook's make_stages()/make_batch() defaults differ.
_MODEL_SEED, _BATCH_SEED = 2402, 2403


def _model(p: int) -> list[nn.Sequential]:
    return make_stages(p, _WIDTH, 1, seed=_MODEL_SEED)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return make_batch(_ROWS, _WIDTH, seed=_BATCH_SEED)


def _gpipe_rank(rank: int, world_size: int, gpipe_step: Callable[..., Any]) -> dict[str, Any]:
    stage = _model(world_size)[rank]
    x, y = _batch()
    if rank > 0:  # only the first stage reads the batch; the others only need its shape
        x = torch.full_like(x, float("nan"))
    if rank < world_size - 1:  # only the last stage computes the loss
        y = torch.full_like(y, float("nan"))
    passes: list[str] = []
    rows: list[int] = []
    computed_here: list[bool] = []
    no_grad_inputs: list[bool] = []

    def note(mod: nn.Module, args: tuple[Any, ...]) -> None:
        passes.append("F")
        rows.append(len(args[0]))
        computed_here.append(getattr(args[0], "grad_fn", None) is not None)
        no_grad_inputs.append(not getattr(args[0], "requires_grad", True))

    stage.register_forward_pre_hook(note)
    first = next(m for m in stage if isinstance(m, nn.Linear))
    first.weight.register_post_accumulate_grad_hook(lambda p: passes.append("B"))
    try:
        loss = gpipe_step(rank, world_size, stage, x, y, _M)
    except TypeError as exc:  # e.g. isend(inp.grad) with inp.grad None: the received input needs a gradient
        if rank == 0 or not any(no_grad_inputs):
            raise
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise TypeError(
            f"{first_line} — the received input does not require grad, so backward left its .grad None."
        ) from None
    grads = {f"{rank}.{n}": p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}
    loss = float(loss) if isinstance(loss, (torch.Tensor, float, int)) else loss
    return {
        "loss": loss,
        "grads": grads,
        "passes": "".join(passes),
        "rows": rows,
        "computed_here": any(computed_here),
    }


@exercise(
    "02a.2",
    "GPipe on p stages",
    task="gpipe_step(rank, world_size, stage, x, y, m): one GPipe step of this rank's stage with send/recv, "
    "returning the batch's MSE loss (a float) on the last stage, None elsewhere. On 3 gloo processes with m "
    "= 4, x real only on rank 0 and y only on the last: hooks record each stage's passes, loss and "
    "gradients are compared with the unsplit model. torch.distributed.pipelining is refused.",
    hint="a middle stage receives from rank - 1 and sends to rank + 1; run all m forwards before the first "
    "backward; the last stage's loss for each micro-batch counts 1/m of the batch's mean loss.",
    forbid=("run_order", "pipelining", "PipelineStage", "ScheduleGPipe", "Schedule1F1B", "build_stage"),
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
        if rank > 0 and res["computed_here"]:
            raise Wrong(
                f"stage {rank}'s input was computed on its own process (it has a grad_fn): a later stage's "
                "input must be what it received from rank - 1, not the output of layers run on this rank."
            )
    model = nn.Sequential(*_model(_P))
    x, y = _batch()
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
