"""Used by notebook 01's exercises: ``whoami(env, gpus_per_node)`` run inside a real torchrun job (01.1)
and ``training_bytes(model, optimizer)`` checked against the memory tracker (01.2).

**01.1.** The student's function is written (its source, as in the notebook) into a small worker
script, and :func:`mgpu_helpers.launching.run_torchrun` starts a real job of 2 nodes × 2 processes each
on 127.0.0.1. Every rank calls the function with ``os.environ`` and 0, 1, 2 and 4 GPUs per node and prints
its answers; each is compared with what torchrun itself said about that rank (``RANK``, ``LOCAL_RANK``,
``GROUP_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) and with the node the grader started it on. The
worker imports torch only if the function mentions it, so the job takes a few seconds. Then the function
is called here with the environment a larger job (3 nodes × 8 processes each, 24 ranks) would give some of
its ranks, so that an answer written for the 2 × 2 job alone (``rank // 2``, ``cuda:{rank % 2}``) is
refused, and so is one that reaches for this grader's own ``_expected`` (its answer key).

**01.2.** For a few real models and optimizers (fp32 and fp64, SGD with and without momentum, Adam and
AdamW, a frozen layer) the student's prediction, made before the first step, is compared with what
:class:`mgpu_helpers.memory.MemoryTracker` measures after one real ``backward()`` and ``step()``. The layer
widths are drawn anew at every grading, so numbers copied from earlier feedback do not fit; and a function
that measures instead of predicting (one real step on a copy of the model, however it is reached) is
refused: while it runs, no optimizer ``step``, autograd ``backward``/``grad`` or memory tracker may run.
"""

from __future__ import annotations

import inspect
import os
import pathlib
import random
import tempfile
import textwrap
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..exercises import Wrong, calls_during, exercise
from ..launching import RESULT_PREFIX, TorchrunError, run_torchrun
from ..memory import MemoryTracker

_NNODES, _NPROC = 2, 2
_GPU_COUNTS = (0, 1, 2, 4)
_ENV_KEYS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
#: A larger job than the one the grader starts: (nnodes, nproc_per_node), and ranks asked about it.
_LARGER_JOB, _LARGER_RANKS, _LARGER_GPUS = (3, 8), (0, 13, 23), (0, 4, 8)


def _larger_job_env(rank: int) -> dict[str, str]:
    """The torchrun variables of ``rank`` in a job of 3 nodes × 8 processes each (rest of os.environ kept)."""
    nnodes, nproc = _LARGER_JOB
    node, local = divmod(rank, nproc)
    numbers = {
        "RANK": rank,
        "LOCAL_RANK": local,
        "GROUP_RANK": node,
        "ROLE_RANK": rank,
        "WORLD_SIZE": nnodes * nproc,
        "ROLE_WORLD_SIZE": nnodes * nproc,
        "LOCAL_WORLD_SIZE": nproc,
        "GROUP_WORLD_SIZE": nnodes,
    }
    return {**os.environ, **{k: str(v) for k, v in numbers.items()}}


_WORKER = """\
import json
import os
{imports}
{source}

report = {{"env": {{k: os.environ[k] for k in {keys!r}}}, "answers": {{}}}}
for gpus in {gpu_counts!r}:
    try:
        answer = {name}(os.environ, gpus)
    except Exception as exc:
        answer = {{"error": f"{{type(exc).__name__}}: {{exc}}"}}
    report["answers"][str(gpus)] = answer
print({prefix!r} + json.dumps(report, default=str), flush=True)
"""


def _source(fn: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise Wrong(
            "the grader could not read your function's source; write it with def in a notebook cell."
        ) from exc


def _expected(env: dict[str, str], gpus: int) -> dict[str, Any]:
    local_rank = int(env["LOCAL_RANK"])
    return {
        "rank": int(env["RANK"]),
        "local_rank": local_rank,
        "node_rank": int(env["GROUP_RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "device": f"cuda:{local_rank}" if gpus >= int(env["LOCAL_WORLD_SIZE"]) else "cpu",
    }


def _compare(answer: Any, env: dict[str, str], gpus: int) -> None:
    want = _expected(env, gpus)
    who = f"rank {want['rank']} (node {want['node_rank']}, local rank {want['local_rank']})"
    where = f"{gpus} GPU(s) per node"
    if isinstance(answer, dict) and "error" in answer and len(answer) == 1:
        raise Wrong(f"in the torchrun worker of {who}, with {where}, your function raised {answer['error']}.")
    if not isinstance(answer, dict) or set(want) - set(answer):
        raise Wrong(f"{who} returned {answer!r}: a dict with the keys {', '.join(want)} was expected.")
    for key in ("rank", "local_rank", "node_rank", "world_size"):
        if type(answer[key]) is not int:
            raise Wrong(f"{who} reported {key}={answer[key]!r}, a {type(answer[key]).__name__}, not an int.")
        if answer[key] != want[key]:
            raise Wrong(f"{who} reported {key}={answer[key]!r}, but torchrun numbered it {want[key]}.")
    got, n = str(answer["device"]), int(env["LOCAL_WORLD_SIZE"])
    if got != want["device"]:
        node = f"its node has {gpus} GPU(s) for {n} processes"
        if want["device"] == "cpu":
            raise Wrong(f"{who} answered device {got!r}, but {node}.")
        raise Wrong(
            f"{who} answered device {got!r}; {node}, numbered cuda:0 to cuda:{gpus - 1} on that node."
        )


@exercise(
    "01.1",
    "who am I in a torchrun job",
    task="whoami(env, gpus_per_node) returns a dict: the ints rank, local_rank, node_rank and world_size, "
    "and device, 'cuda:<k>' (the GPU this process should use) when its node has a GPU for each of its "
    "processes, else 'cpu'. Run in every rank of a real 2-node × 2-process torchrun job for 0, 1, 2 and 4 "
    "GPUs per node, then for three ranks of a 3 × 8 job.",
    hint="torchrun describes each process in environment variables (section 5's table); the GPU index "
    "counts within a node, and NCCL needs a GPU for every process on the node",
    forbid=("_expected", "_compare"),  # this grader's answer key
)
def _grade_whoami(whoami: Callable[[Any, int], dict[str, Any]]) -> str:
    source = _source(whoami)
    imports = "import torch" if "torch" in source else ""
    script = _WORKER.format(
        imports=imports,
        source=source,
        keys=_ENV_KEYS,
        gpu_counts=_GPU_COUNTS,
        name=whoami.__name__,
        prefix=RESULT_PREFIX,
    )
    with tempfile.TemporaryDirectory(prefix="mgpu-01-") as folder:
        path = os.path.join(folder, "whoami_worker.py")
        with open(path, "w") as f:
            f.write(script)
        try:
            runs = run_torchrun(path, nnodes=_NNODES, nproc_per_node=_NPROC, module=False, timeout=90)
        except TorchrunError as exc:
            lines = str(exc).strip().splitlines()
            last = f" — {lines[-1].strip()}" if len(lines) > 1 else ""
            raise Wrong(f"the torchrun job failed: {lines[0]}{last}.") from None
    reports = []
    for run in runs:
        if len(run.results) != _NPROC:
            raise Wrong(f"node {run.node_rank} printed {len(run.results)} reports instead of {_NPROC}.")
        for report in run.results:
            if int(report["env"]["GROUP_RANK"]) != run.node_rank:  # torchrun's numbering, checked once more
                raise RuntimeError(
                    f"torchrun put GROUP_RANK={report['env']['GROUP_RANK']} on node {run.node_rank}"
                )
            reports.append(report)
    reports.sort(key=lambda r: int(r["env"]["RANK"]))
    for report in reports:
        for gpus in _GPU_COUNTS:
            _compare(report["answers"][str(gpus)], report["env"], gpus)
    seen = [int(r["env"]["RANK"]) for r in reports]
    if sorted(seen) != list(range(_NNODES * _NPROC)):
        raise Wrong(f"the job reported ranks {sorted(seen)} instead of 0..{_NNODES * _NPROC - 1}.")
    nnodes, nproc = _LARGER_JOB
    for rank in _LARGER_RANKS:
        env = _larger_job_env(rank)
        for gpus in _LARGER_GPUS:
            try:
                answer = whoami(env, gpus)
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                _compare(answer, env, gpus)
            except Wrong as exc:
                raise Wrong(f"in a larger job ({nnodes} nodes × {nproc} processes each), {exc}") from None
    return (
        f"all {_NNODES * _NPROC} ranks of a real torchrun job of {_NNODES} nodes × {_NPROC} processes each "
        f"answered right with {', '.join(map(str, _GPU_COUNTS))} GPUs per node, and so did ranks of a job of "
        f"{nnodes} nodes × {nproc} processes each ({nnodes * nproc} ranks)."
    )


# --- 01.2 ----------------------------------------------------------------------------------------------


def _cases() -> list[tuple[str, nn.Module, Callable[[list[nn.Parameter]], torch.optim.Optimizer]]]:
    """(description, model, optimizer factory) — the factory gets model.parameters() as a list. The widths
    are drawn anew at every call (never the 16, 32, 8 of earlier versions), so no table of numbers fits."""
    torch.manual_seed(0)
    draw = random.Random()
    a, b, c = draw.randint(10, 24), draw.randint(33, 64), draw.randint(4, 12)

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c))

    def frozen_first() -> nn.Module:
        model = mlp()
        model[0].requires_grad_(False)
        return model

    return [
        (
            f"Linear({a}, {b}) → ReLU → Linear({b}, {c}), Adam",
            mlp(),
            lambda ps: torch.optim.Adam(ps, lr=1e-3),
        ),
        (
            f"Linear({a}, {b}) with SGD(momentum=0.9)",
            nn.Linear(a, b),
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        ),
        (f"Linear({a}, {b}) with plain SGD", nn.Linear(a, b), lambda ps: torch.optim.SGD(ps, lr=0.1)),
        (
            "the same Linear → ReLU → Linear with its first layer frozen, Adam over all parameters",
            frozen_first(),
            lambda ps: torch.optim.Adam(ps, lr=1e-3),
        ),
        (
            f"Linear({a}, {b}) in float64 (.double()), AdamW",
            nn.Linear(a, b).double(),
            lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        ),
    ]


_TORCH = pathlib.Path(torch.__file__).parent
#: Folder → functions in it that measure instead of predicting (the tracker: any of its functions).
_MEASURING = {
    _TORCH / "optim": ("step",),
    _TORCH / "autograd": ("backward", "grad"),
    pathlib.Path(__file__).parent.parent / "memory": None,
}


def _measures(code: Any) -> bool:
    """An optimizer step, an autograd backward pass or the memory tracker: measuring, not predicting."""
    folder = pathlib.Path(code.co_filename).parent
    return folder in _MEASURING and (_MEASURING[folder] is None or code.co_name in _MEASURING[folder])


def _measure(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes per category after one real backward and step (gradients not yet zeroed)."""
    first = next(iter(model.parameters()))
    x = torch.randn(4, first.shape[-1], dtype=first.dtype)
    tracker = MemoryTracker(model, optimizer)
    with tracker:
        model(x).square().mean().backward()
        optimizer.step()
    tracker.close()
    return {k: tracker.current[k] for k in ("parameters", "gradients", "optimizer")}


@exercise(
    "01.2",
    "training bytes by category",
    task="training_bytes(model, optimizer) predicts, before training, the bytes of 'parameters', "
    "'gradients' and 'optimizer' state right after the first backward() and step(). Compared exactly with "
    "MemoryTracker after one real step of five models and optimizers (Adam, AdamW, SGD with and without "
    "momentum, a frozen layer, float64), widths drawn at grading time; running a step or the tracker "
    "yourself, even on a copy, is refused.",
    hint="count numel × element_size() per parameter tensor; only parameters that require grad get "
    "gradients and optimizer state; what does each optimizer keep per parameter, and per tensor?",
    forbid=("MemoryTracker", "backward", "step", "deepcopy", "load_state_dict"),  # predict, do not measure
)
def _grade_training_bytes(training_bytes: Callable[[nn.Module, torch.optim.Optimizer], Any]) -> str:
    for what, model, make_optimizer in _cases():
        optimizer = make_optimizer(list(model.parameters()))
        before = [p.detach().clone() for p in model.parameters()]
        predicted, measuring = calls_during(training_bytes, _measures, model, optimizer)
        if measuring:
            raise Wrong(
                f"for {what} your function ran {measuring[0].co_name}() (a training step or the tracker) to "
                "measure the bytes: predict them from the parameters and the optimizer instead."
            )
        if any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True)):
            raise Wrong(f"for {what} your function changed the weights: predict, do not train.")
        if not isinstance(predicted, dict):
            raise Wrong(f"for {what} it returned {predicted!r}, not a dict of bytes per category.")
        measured = _measure(model, optimizer)
        for key, value in measured.items():
            if predicted.get(key) != value:
                raise Wrong(
                    f"for {what} you predicted {key}: {predicted.get(key)!r} bytes, "
                    f"but the tracker measured {value:,} bytes after one step."
                )
    return (
        "parameters, gradients and optimizer state matched the tracker for Adam, AdamW, SGD with and "
        "without momentum, a frozen layer and a float64 model."
    )
