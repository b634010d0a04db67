"""Used by notebook 03a's exercises: ``nn.DataParallel``'s forward pass written by hand (03a.1) and a
repaired DataParallel training loop whose model computes the loss itself (03a.2).

Both run on the backend the notebook uses, :func:`mgpu_helpers.data_parallel.backend`: the real
``torch.nn.parallel`` / ``nn.DataParallel`` with two or more GPUs (up to 4 of them), virtual devices
otherwise (4 of them: real threads, chunks and copies, every tensor's device known to a tracker).

03a.1 calls the student's ``data_parallel_forward(module, x, device_ids, output_device, dim)`` on a batch
of 30 on 2 devices, a batch smaller than "two per device" (fewer chunks than devices), a subset of the
devices with the output gathered on another one, and batch-second RNN input with ``dim=1``. It checks
which devices the model's copies ran on, what they received, that each ran with weights on its own device
(a replica, not the original model fed chunks from elsewhere) and in a thread of its own when there are
several (``parallel_apply``), where the output lives, and that outputs and gradients equal those of the
unsplit model (float64).

03a.2 trains a small float64 MLP for three steps with the student's ``train(model, batches, device_ids)``
(batches of 12, 12 and 7 samples, so the last one splits unevenly) and compares every step's loss and
the final weights with plain single-device training on the same batches. A hook on the model's first
layer records every forward call: each batch must have been split over all the devices, one chunk per
device as ``nn.DataParallel`` cuts it, and never run whole (plain training gets the same numbers without
any data parallelism). Every gather of the loop (``DataParallel.gather`` and ``parallel.gather``, watched
for the duration) must receive per-device losses, not the model's outputs: the loss is computed inside
the wrapped module, which is what makes the exercise's question (when is the mean of the gathered losses
the batch's loss?) arise.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..exercises import Wrong, calls_during, exercise
from ..memory import MemoryTracker

_TIGHT = {"rtol": 1e-9, "atol": 1e-10}


def _backend() -> tuple[Any, list[int]]:
    """The notebook's backend and the device indices to use (up to 4)."""
    from ..data_parallel import backend

    b = backend()
    return b, list(range(min(b.gpus, 4) if b.real else 4))


def _ready_made() -> set[Any]:
    """The code of every ready-made DataParallel forward: 03a.1 is refused when the student's function runs
    one, under any name (``forbid`` sees only names written in the source)."""
    from ..data_parallel import VirtualDataParallel, VirtualDataParallelModel

    owners = (VirtualDataParallel, VirtualDataParallelModel, nn.DataParallel)
    return {cls.forward.__code__ for cls in owners} | {torch.nn.parallel.data_parallel.__code__}


def _close(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().cpu(), b.detach().cpu(), **_TIGHT)


class _Tagger(nn.Module):
    """An RNN that tags every time step: (time, batch, 4) -> (time, batch, 3), batch second in and out."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.rnn(x)[0])


# --- 03a.1: the forward pass by hand ----------------------------------------------------------------


def _forward_case(
    fn: Callable[..., Any],
    b: Any,
    model: nn.Module,
    x: Tensor,
    ids: list[int],
    out_dev: int,
    dim: int,
    what: str,
) -> None:
    from ..data_parallel import chunk_sizes

    torch.manual_seed(1)
    expected = model(x)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    # A copy of the model records where its input and its weights live, how many items it got, and
    # whether it ran in the caller's thread (replicas carry the hook: replicate copies hooks along).
    first = next(name for name, _ in model.named_parameters())
    caller = threading.get_ident()
    seen: list[tuple[str, int]] = []
    weights_on: list[tuple[str, str]] = []
    threads: list[bool] = []

    def record(m: nn.Module, args: tuple[Any, ...]) -> None:
        seen.append((b.where(args[0]), args[0].shape[dim]))
        weights_on.append((b.where(args[0]), b.where(functools.reduce(getattr, first.split("."), m))))
        threads.append(threading.get_ident() == caller)

    hook = model.register_forward_pre_hook(record)
    with b.home(0):
        tracker = MemoryTracker(model)
    try:
        with tracker, warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # e.g. "RNN module weights are not part of single contiguous chunk"
            out, ran = calls_during(fn, _ready_made().__contains__, model, b.to(x, 0), ids, out_dev, dim)
            if ran:
                raise Wrong(
                    f"{what}: your function ran a ready-made DataParallel ({ran[0].co_qualname}): write its "
                    "steps yourself."
                )
            if not isinstance(out, Tensor):
                raise Wrong(
                    f"{what}: data_parallel_forward returned {type(out).__name__}, not the output tensor."
                )
            where = b.where(out)
            if out.requires_grad:
                (out * weights.to(out.device)).sum().backward()
    finally:
        hook.remove()
        tracker.close()

    sizes = chunk_sizes(x.shape[dim], len(ids))
    wanted = sorted((str(b.device(i)), n) for i, n in zip(ids, sizes, strict=False))
    if sorted(seen) != wanted:
        got = ", ".join(f"{n} on {d}" for d, n in sorted(seen)) or "nothing"
        want = ", ".join(f"{n} on {d}" for d, n in wanted)
        raise Wrong(
            f"{what}: the model's copies received {got} (items along dim={dim}); "
            f"nn.DataParallel would give {want}."
        )
    for data_on, weight_on in weights_on:
        if data_on != weight_on:
            raise Wrong(
                f"{what}: the model ran on a chunk on {data_on} with its weights on {weight_on}: each "
                "device needs its own copy of the model (a replica), run on that device's chunk."
            )
    if len(seen) > 1 and any(threads):
        raise Wrong(
            f"{what}: the model's copies ran one after the other in your own thread: nn.DataParallel runs "
            "them at the same time, one thread per device."
        )
    if out.shape != expected.shape:
        raise Wrong(
            f"{what}: the output has shape {tuple(out.shape)}, the unsplit model's {tuple(expected.shape)}."
        )
    if not _close(out, expected):
        raise Wrong(f"{what}: the output differs from the unsplit model's (largest gap "
                    f"{(out.detach().cpu() - expected.detach().cpu()).abs().max().item():.3g}).")  # fmt: skip
    if where != str(b.device(out_dev)):
        raise Wrong(f"{what}: the output lives on {where}, but output_device is {b.device(out_dev)}.")
    for (name, p), g in zip(model.named_parameters(), grads, strict=True):
        if p.grad is None:
            raise Wrong(
                f"{what}: after backward, {name} has no gradient: "
                "the output is not connected to the model's weights."
            )
        if not _close(p.grad, g):
            raise Wrong(f"{what}: the gradient of {name} differs from the unsplit model's.")
    model.zero_grad(set_to_none=True)


@exercise(
    "03a.1",
    "nn.DataParallel's forward by hand",
    task="data_parallel_forward(module, x, device_ids, output_device, dim=0) does what "
    "nn.DataParallel(module, device_ids, output_device, dim)(x) does, without calling it. Up to four cases "
    "(a batch of 30 on 2 devices, fewer chunks than devices, batch-second RNN input with dim=1, a subset of "
    "3+ devices): hooks check each chunk ran on its own device's replica, in threads of their own; output "
    "on output_device; outputs and gradients equal the unsplit model's.",
    hint="the four calls of section 3, in the order nn.DataParallel makes them (scatter first); a small "
    "batch can give fewer chunks than devices, and dim and output_device are arguments, not constants.",
    forbid=("DataParallel", "data_parallel", "VirtualDataParallel"),
)
def grade_forward(data_parallel_forward: Callable[..., Any]) -> str:
    """Run the student's forward pass on four cases; compare with the unsplit model."""
    b, ids = _backend()
    dev = b.device(0) if b.real else "cpu"
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double().to(dev)
    n = len(ids)
    small = 1 if n == 2 else n + 1  # torch.chunk makes fewer than n chunks of it
    cases = [
        ("batch 30 on 2 devices", mlp, torch.randn(30, 5), ids[:2], ids[0], 0),
        (
            f"batch {small} on {n} devices (fewer chunks than devices), gathered on the last",
            mlp,
            torch.randn(small, 5),
            ids,
            ids[-1],
            0,
        ),
    ]
    if n >= 3:
        cases.append(
            (f"batch 9 on devices {[ids[0], ids[-1]]}", mlp, torch.randn(9, 5), [ids[0], ids[-1]], ids[0], 0)
        )
    tagger = _Tagger().double().to(dev)
    cases.append(
        (
            "batch-second RNN input (time 7, batch 6) with dim=1",
            tagger,
            torch.randn(7, 6, 4),
            ids[:2],
            ids[0],
            1,
        )
    )
    for what, model, x, case_ids, out_dev, dim in cases:
        _forward_case(data_parallel_forward, b, model, x.double().to(dev), case_ids, out_dev, dim, what)
    return (
        f"{len(cases)} cases on {b.kind} ({', '.join(c[0] for c in cases)}): replicas on the right devices, "
        "output on output_device, outputs and gradients equal to the unsplit model's"
    )


# --- 03a.2: repair the training loop ------------------------------------------------------------------


@contextlib.contextmanager
def _watch_gathers(b: Any, dims: list[list[int]]) -> Iterator[None]:
    """Record, for every gather while active, the number of dimensions of each replica's output.

    Wraps the backend's ``DataParallel.gather`` method and its ``parallel.gather`` function (a hand-built
    loop calls the latter), restoring both afterwards.
    """

    def wrap(original: Callable[..., Any], is_method: bool) -> Callable[..., Any]:
        @functools.wraps(original)
        def recording(*args: Any, **kwargs: Any) -> Any:
            given = args[1:] if is_method else args
            outputs = given[0] if given else kwargs.get("outputs", ())
            dims.append([o.dim() for o in outputs if isinstance(o, Tensor)])
            return original(*args, **kwargs)

        return recording

    targets = [(b.DataParallel, "gather", True), (b.parallel, "gather", False)]
    saved = [(owner, name, vars(owner).get(name)) for owner, name, _ in targets]
    try:
        for owner, name, is_method in targets:
            setattr(owner, name, wrap(getattr(owner, name), is_method))
        yield
    finally:
        for owner, name, original in saved:
            if original is None:  # it was inherited: remove the wrapper to uncover it again
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def _batches(dev: Any) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        (
            torch.randn(n, 5, generator=gen, dtype=torch.float64).to(dev),
            torch.randint(0, 3, (n,), generator=gen).to(dev),
        )
        for n in (12, 12, 7)
    ]


@exercise(
    "03a.2",
    "repair a DataParallel training loop",
    task="train(model, batches, device_ids), the loss kept inside the wrapped module, returns each step's "
    "loss; losses and final weights must equal plain training with F.cross_entropy on each whole batch, to "
    "1e-9. Three steps on float64 batches of 12, 12 and 7 over all your devices: a hook checks each batch "
    "was split one chunk per device, and DataParallel must gather per-device losses, not outputs.",
    hint="compare each step's loss with the plain model's on the same batch; what does the gathered "
    "vector hold, and how big is each device's chunk of the last batch?",
)
def grade_train(train: Callable[..., Any]) -> str:
    """Train with the student's loop and with a plain loop; losses and final weights must agree."""
    from ..data_parallel import chunk_sizes, current_device

    b, ids = _backend()
    dev = b.device(0) if b.real else "cpu"
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double().to(dev)
    reference, student = copy.deepcopy(start), copy.deepcopy(start)
    batches = _batches(dev)

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    expected = []
    for x, y in batches:
        loss = F.cross_entropy(reference(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        expected.append(loss.item())

    # Every forward call of the first layer, in the student's model and in every replica of it (replicate
    # copies hooks along): on which device it ran and on how many samples.
    calls: list[tuple[str, int]] = []

    def record(_m: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0]
        where = str(x.device) if b.real else current_device() or "no device (your own thread)"
        calls.append((where, len(x)))

    hook = student[0].register_forward_pre_hook(record)
    gathered: list[list[int]] = []  # per gather call: the dimensions of what each replica returned
    try:
        with warnings.catch_warnings(), _watch_gathers(b, gathered):
            # real GPUs: "Was asked to gather along dimension 0, but ... scalars"
            warnings.simplefilter("ignore")
            losses = train(student, batches, ids)
    finally:
        hook.remove()
    wanted = sorted(
        (str(b.device(i)), n)
        for x, _ in batches
        for i, n in zip(ids, chunk_sizes(len(x), len(ids)), strict=False)
    )
    if sorted(calls) != wanted:
        whole = [(d, n) for d, n in calls if n in {len(x) for x, _ in batches}]
        if not calls:
            why = "the model never ran its forward pass through its layers."
        elif whole:
            why = (
                f"it ran on a whole batch of {whole[0][1]} on {whole[0][0]}: that is single-device "
                "training, not data parallelism."
            )
        else:
            got = ", ".join(f"{n} on {d}" for d, n in calls[:5]) + (", …" if len(calls) > 5 else "")
            why = f"it ran {len(calls)} times, for {len(wanted)} chunks: {got}."
        raise Wrong(
            f"every batch must be split over the {len(ids)} devices {[str(b.device(i)) for i in ids]}, one "
            f"chunk each as nn.DataParallel cuts it, and the model run once per chunk; {why}"
        )
    logits = [d for d in gathered if any(n >= 2 for n in d)]
    if logits or len(gathered) < len(batches):
        why = (
            f"DataParallel gathered the model's outputs ({logits[0][0]}-dimensional, one row per sample) "
            "and the loss was computed after the gather, on one device"
            if logits
            else f"{len(gathered)} gathers for {len(batches)} steps: the per-device losses were not gathered"
        )
        raise Wrong(
            f"{why}. The exercise keeps the loss inside the wrapped module (WithLoss): each device computes "
            "the loss of its own chunk, and DataParallel gathers losses."
        )
    try:
        losses = [float(v) for v in losses]
    except (TypeError, ValueError):
        raise Wrong(f"train should return one float per step, not {losses!r:.80}.") from None
    if len(losses) != len(batches):
        raise Wrong(f"train returned {len(losses)} losses for {len(batches)} batches: one per step.")
    for step, ((x, _), got, want) in enumerate(zip(batches, losses, expected, strict=True), start=1):
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            split = " + ".join(map(str, chunk_sizes(len(x), len(ids))))
            raise Wrong(
                f"step {step} (a batch of {len(x)}, split {split}): the recorded loss is {got:.6f}, but the "
                f"plain model's loss on that batch is {want:.6f} ({got / want:.3f}×)."
            )
    for (name, p), q in zip(student.named_parameters(), reference.parameters(), strict=True):
        if not _close(p, q):
            raise Wrong(
                f"the losses match, but after {len(batches)} steps {name} differs from single-device "
                f"training by up to {(p.detach() - q.detach()).abs().max().item():.3g}: "
                "the gradients were not the batch's."
            )
    return (
        f"3 steps on {len(ids)} {b.kind} (batches of 12, 12 and 7) give the same losses and weights as "
        "training on one device"
    )
