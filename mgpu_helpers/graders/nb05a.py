"""Used by notebook 05a's exercises: an fp16 ``torch.autocast`` + ``GradScaler`` training step with
gradient clipping (05a.1), and the repair of a gradient-accumulation step (05a.2).

Both graders run the student's step for real, on the CPU with fp16 autocast and
``torch.amp.GradScaler("cpu")``, for a few steps on a small model, and compare how far the weights
moved with an fp32 reference computed here (same data, same SGD, same clipping; for 05a.2 one step on
the whole batch per group of micro-batches); the weights must still be fp32 (a model cast to fp16 is
not mixed precision), and backward, clipping and the optimizer step must run outside ``autocast``
(hooks look at ``torch.is_autocast_enabled`` during backward and at the step). Then one batch holds an
``inf``: the scaler must skip that optimizer step (weights unchanged and finite) and halve its scale,
once (a step without the scaler, or one that skips by hand, leaves the scale alone). For 05a.2 it
also counts the backward passes: one per micro-batch, not one on the summed losses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise

_LR = 0.5
_SCALE = 2.0**12
_STEPS = 4
_MICRO = 16  # 05a.2: each batch of 64 as 4 micro-batches


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (3 * torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)) for _ in range(_STEPS)
    ]


def _flat_change(model: nn.Module, start: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(p.detach() - w).flatten() for p, w in zip(model.parameters(), start, strict=True)])


def _reference_change(max_norm: float) -> torch.Tensor:
    """How far fp32 SGD with the same clipping moves the weights, one step per whole batch."""
    model = _model()
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=_LR)
    for x, y in _batches():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
    return _flat_change(model, start)


def _split(x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.split(_MICRO), y.split(_MICRO), strict=True))


def _run_and_compare(step: Callable[..., object], max_norm: float, micro: bool) -> str:
    """Run the student's step; raise Wrong unless it matches fp32 and skips an inf step."""
    model = _model()
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=_LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=_SCALE, growth_interval=10**6)
    dtypes: set[torch.dtype] = set()
    hook = model[0].register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    rows: list[int] = []  # rows of each forward pass: with micro-batches, one pass per micro-batch
    rows_hook = model.register_forward_pre_hook(lambda _m, inputs: rows.append(len(inputs[0])))
    under_autocast: set[str] = set()  # "backward", "the optimizer step": what ran inside autocast

    def note(what: str) -> None:
        if torch.is_autocast_enabled("cpu"):
            under_autocast.add(what)

    backwards: list[int] = []  # one entry per backward pass that reaches the first layer

    def on_grad(_g: torch.Tensor) -> None:
        backwards.append(1)
        note("backward")

    grad_hook = model[0].weight.register_hook(on_grad)
    step_hook = opt.register_step_pre_hook(lambda _o, _a, _k: note("the optimizer step"))

    def call(x: torch.Tensor, y: torch.Tensor) -> None:
        if micro:
            step(model, opt, scaler, _split(x, y), max_norm)
        else:
            step(model, opt, scaler, x, y, max_norm)

    try:
        for x, y in _batches():
            call(x, y)
    finally:
        for handle in (hook, rows_hook, grad_hook, step_hook):
            handle.remove()
    if under_autocast:
        raise Wrong(
            f"{' and '.join(sorted(under_autocast))} ran inside torch.autocast: autocast is for the forward "
            "pass and the loss; leave the with-block before backward (its backward ops follow the forward's "
            "dtypes on their own), clipping and the step."
        )
    if micro and max(rows) > _MICRO:
        raise Wrong(
            f"a forward pass ran on {max(rows)} rows: accumulation runs forward and backward on each "
            f"micro-batch of {_MICRO} rows in turn, never on the whole batch at once."
        )
    if micro and len(backwards) < _STEPS * (64 // _MICRO):
        raise Wrong(
            f"{_STEPS} calls of {64 // _MICRO} micro-batches ran only {len(backwards)} backward passes, not "
            "one per micro-batch: a backward on summed losses keeps every micro-batch's activations alive at "
            "once, the memory that accumulation exists to save."
        )
    kept = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()} - {"float32"})
    if kept:
        raise Wrong(
            f"after your steps the weights are {', '.join(kept)}: mixed precision keeps the weights in fp32 "
            "(small updates vanish in 16 bits) and lets autocast make the 16-bit copies."
        )
    if torch.float16 not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in sorted(dtypes, key=str)) or "nothing"
        raise Wrong(f"the first Linear layer computed in {names}, not in float16.")
    change, ref = _flat_change(model, start), _reference_change(max_norm)
    what = f"{_STEPS} steps" + (f" of {64 // _MICRO} micro-batches" if micro else "")
    if not torch.isfinite(change).all():
        raise Wrong(f"after {what} some weights are inf or nan.")
    error = ((change - ref).norm() / ref.norm()).item()
    if error > 0.05:
        ratio = (change.norm() / ref.norm()).item()
        raise Wrong(
            f"after {what} your weights moved {ratio:.3g}x as far as {_STEPS} fp32 SGD steps on the whole "
            f"batches with clipping to {max_norm} (off by {error:.0%} of that update; fp16 rounding "
            "accounts for under 5 %)."
        )
    before = [p.detach().clone() for p in model.parameters()]
    scale = scaler.get_scale()
    x, y = _batches()[0]
    x = x.clone()
    x[-1, 0] = float("inf")  # this batch (its last micro-batch) gives inf/nan gradients
    call(x, y)
    after = list(model.parameters())
    if not all(torch.isfinite(p).all() for p in after):
        raise Wrong("a batch with an inf in it turned weights into inf/nan: that step was not skipped.")
    if not all(torch.equal(b, p.detach()) for b, p in zip(before, after, strict=True)):
        raise Wrong("a batch with an inf in it still changed the weights: the step was not skipped.")
    if scaler.get_scale() != scale / 2:
        raise Wrong(
            f"after the skipped step the loss scale is {scaler.get_scale():g}; from {scale:g}, one skipped "
            f"step should leave {scale / 2:g}."
        )
    return (
        f"fp16 autocast; after {what} the weights are within {error:.1%} of fp32 SGD's update with "
        "clipping, and the step with an inf gradient was skipped with the scale halved"
    )


@exercise(
    "05a.1",
    "an fp16 autocast + GradScaler training step with clipping",
    task="`amp_step(model, optimizer, scaler, x, y, max_norm)` takes one fp16 mixed-precision step on `(x, "
    "y)`, gradient norm clipped to `max_norm`. Run 4 times on the CPU (the grader's model, SGD, "
    '`GradScaler("cpu")` at 2¹², max_norm 0.25): weights stay fp32 and move within 5 % of clipped fp32 '
    "SGD, backward and the step run outside autocast, and a batch holding an inf is skipped, halving the "
    "scale.",
    hint="only the forward pass and the loss belong inside torch.autocast; section 2 of the notebook says "
    "what the gradients still carry when backward returns, which matters to clipping and to the step.",
)
def grade_amp_step(amp_step: Callable[..., object]) -> str:
    """Run ``amp_step(model, optimizer, scaler, x, y, max_norm)`` with ``max_norm=0.25``."""
    if not callable(amp_step):
        raise Wrong(f"pass your function amp_step itself, not {type(amp_step).__name__}.")
    return _run_and_compare(amp_step, 0.25, micro=False)


@exercise(
    "05a.2",
    "repair a gradient-accumulation step",
    task="Repaired, `accumulated_amp_step(model, optimizer, scaler, micro_batches, max_norm)` equals one "
    "step on the whole batch (the mean loss over all micro-batches). Checked on 4 calls of 4 micro-batches "
    "of 16 rows, max_norm 2: a forward and a backward per micro-batch, weights within 5 % of 4 fp32 SGD "
    "steps on the whole batches, and a call with an inf in one micro-batch skipped as a whole, the scale "
    "halved once.",
    hint="compare what one call does with one step on the whole batch: the gradient that reaches the "
    "optimizer, and how many times the weights and the loss scale change.",
)
def grade_accumulated_step(accumulated_amp_step: Callable[..., object]) -> str:
    """Run ``accumulated_amp_step(model, optimizer, scaler, micro_batches, max_norm)``, ``max_norm=2``."""
    if not callable(accumulated_amp_step):
        raise Wrong(
            f"pass your function accumulated_amp_step itself, not {type(accumulated_amp_step).__name__}."
        )
    return _run_and_compare(accumulated_amp_step, 2.0, micro=True)
