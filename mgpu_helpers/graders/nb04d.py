"""Used by notebook 04d's exercises: snapshot functions for a full training state (04d.1) and the repair
of a training loop that is not restart-safe (04d.2), each graded by a real ``torchrun --max-restarts=1``
job of 2 gloo processes on this machine in which a worker dies once.

**04d.1.** The student's ``save_snapshot(path, model, optimizer, scheduler, epoch)`` and
``load_snapshot(path, model, optimizer, scheduler)`` (their source, as in the notebook) are written into
a worker script. It trains a float64 MLP with AdamW and a per-step warm-up/decay ``LambdaLR`` for 3
epochs under DDP, rank 0 saving a snapshot after every epoch; rank 1 dies (``os._exit(1)``) at the start
of epoch 2 in the first attempt, torchrun restarts both workers, and they resume. What the restarted
workers loaded (epoch, weights, AdamW's moments, learning rate) and the final weights are compared with
a single-process computation of the same training (float64: equal up to rounding, ``rtol=1e-9``).

**04d.2.** The student's repaired ``train(model, optimizer, data, epochs, path)`` runs once without a
crash (in forked processes, :func:`~mgpu_helpers.graders._ranks.run_ranks`) — the reference — and once
under torchrun, where the first attempt dies *while rank 0 writes its second snapshot* (the grader's
``torch.save`` writes half of the file, then the process exits). The restarted job must load a good
snapshot, continue after epoch 0 (not start over), see the same batches as the uninterrupted run, and
end with the same weights.

Both jobs run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (notebook 04d, section 2, says why) through
:mod:`mgpu_helpers.launching.agent` (stores on loopback, workers die with their agent), and every process
is stopped before the grader returns.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import re
import subprocess
import tempfile
import textwrap
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ..launching import RESULT_PREFIX, parse_results, torchrun_command
from ..launching.torchrun import PARENT_PID_ENV, SCRATCH_ENV, launch_env
from ..processes import die_with_parent, free_port, stop_processes, temp_prefix
from ._ranks import run_ranks

_TIMEOUT_S = 90.0
_HEADER = """\
import io, os, shutil, tempfile
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
"""


def _source(fn: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise Wrong(
            "the grader could not read your function's source; write it with def in a notebook cell."
        ) from exc


def _torchrun_once_restarted(body: str, folder: str) -> tuple[int | None, str]:
    """Run ``body`` as a script under ``torchrun --max-restarts=1`` with 2 workers in ``folder``.

    Returns the agent's exit code (None after a timeout) and everything it and its workers printed.
    """
    script = os.path.join(folder, "worker.py")
    with open(script, "w") as f:
        f.write(body)
    port = free_port()
    cmd = torchrun_command(
        script,
        nproc_per_node=2,
        master_port=port,
        module=False,
        rdzv="c10d",
        rdzv_id=f"mgpu-{port}",
        max_restarts=1,
    )
    scratch = tempfile.mkdtemp(prefix=temp_prefix("torchrun"), dir=folder)
    env = {
        **launch_env({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
        PARENT_PID_ENV: str(os.getpid()),
        SCRATCH_ENV: scratch,
    }
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [cmd[0], "-m", "mgpu_helpers.launching.agent", *cmd[3:]],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        code: int | None
        try:
            code = proc.wait(_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_processes([proc], grace_s=3.0)
        out.seek(0)
        return code, out.read().decode(errors="replace")


def _last_error(output: str) -> str:
    """The last 'SomethingError: message' line a worker printed (without torchrun's prefixes)."""
    lines = [re.sub(r"^(\[default\d\]:)?(\[rank\d+\]:)?\s*", "", ln) for ln in output.splitlines()]
    errors = [
        ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln) and "ChildFailedError" not in ln
    ]
    return errors[-1][:300] if errors else "no error message (see the worker's output)"


def _results(output: str, n: int) -> list[dict[str, Any]]:
    found = parse_results(output)
    if len(found) < n:
        raise Wrong(
            f"the torchrun job ended without the report of every attempt (got {len(found)} of {n}): "
            f"{_last_error(output)}"
        )
    return found


def _flat(tensors: Any) -> torch.Tensor:
    return torch.cat([torch.as_tensor(t, dtype=torch.float64).reshape(-1) for t in tensors])


def _differs(a: Any, b: Any) -> float | None:
    """Largest absolute difference between two lists of numbers, None when equal up to float64 rounding."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        return float("inf")
    return None if torch.allclose(a, b, rtol=1e-9, atol=1e-12) else float((a - b).abs().max())


# --- 04d.1: snapshot a full training state -------------------------------------------------------------

_EPOCHS, _CRASH_EPOCH, _SAMPLES, _BATCH = 3, 2, 64, 8  # per rank and step: _BATCH samples


def _setup_041() -> tuple[nn.Module, torch.optim.Optimizer, Any, torch.Tensor, torch.Tensor]:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_SAMPLES, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (_SAMPLES,), generator=gen)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.8**step
    )
    return model, optimizer, scheduler, x, y


def _shards(epoch: int, world_size: int = 2) -> list[torch.Tensor]:
    order = torch.randperm(_SAMPLES, generator=torch.Generator().manual_seed(epoch))
    return [order[r::world_size] for r in range(world_size)]


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    moments = [optimizer.state[p].get("exp_avg") for p in model.parameters()]
    return {
        "weights": _flat(p.detach() for p in model.parameters()).tolist(),
        "exp_avg": None if any(m is None for m in moments) else _flat(moments).tolist(),
        "lr": optimizer.param_groups[0]["lr"],
    }


def _worker_041(save_snapshot: Callable[..., Any], load_snapshot: Callable[..., Any]) -> None:
    """Runs in each torchrun worker: resume, train under DDP, die once, report (rank 0)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    model, optimizer, scheduler, x, y = _setup_041()
    path = "snapshot.pt"
    start = load_snapshot(path, model, optimizer, scheduler)
    report: dict[str, Any] = {"attempt": attempt, "start": start if isinstance(start, int) else repr(start)}
    report["resumed"] = _state(model, optimizer)
    if not isinstance(start, int) or isinstance(start, bool):
        start = _EPOCHS  # nothing to train: the grader reports the return value
    ddp = DDP(model)
    lrs = []
    for epoch in range(start, _EPOCHS):
        if rank == 1 and epoch == _CRASH_EPOCH and attempt == 0:
            os._exit(1)  # the simulated failure
        mine = _shards(epoch, world_size)[rank]
        for batch in mine.split(_BATCH):
            lrs.append(optimizer.param_groups[0]["lr"])
            loss = F.cross_entropy(ddp(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        if rank == 0:
            save_snapshot(path, model, optimizer, scheduler, epoch)
        dist.barrier()
    report["lrs"], report["final"] = lrs, _state(model, optimizer)["weights"]
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(report), flush=True)
    dist.destroy_process_group()


def _reference_041() -> dict[str, Any]:
    """The same training in one process: each step's mean loss over both ranks' batches."""
    model, optimizer, scheduler, x, y = _setup_041()
    states, lrs = [], []
    for epoch in range(_EPOCHS):
        shards = _shards(epoch)
        for parts in zip(*(s.split(_BATCH) for s in shards), strict=True):
            lrs.append(optimizer.param_groups[0]["lr"])
            loss = sum(F.cross_entropy(model(x[b]), y[b]) for b in parts) / len(parts)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        states.append(_state(model, optimizer))
    return {"after_epoch": states, "lrs": lrs, "final": states[-1]["weights"]}


def _check_resume(got: dict[str, Any], want: dict[str, Any]) -> None:
    start = got["start"]
    if start != _CRASH_EPOCH:
        raise Wrong(
            f"rank 1 died at the start of epoch {_CRASH_EPOCH}, after rank 0 had saved the snapshot of epoch "
            f"{_CRASH_EPOCH - 1}; after the restart your load_snapshot returned {start!r} as the "
            f"epoch to go on at."
        )
    resumed = got["resumed"]
    diff = _differs(resumed["weights"], want["weights"])
    if diff is not None:
        raise Wrong(
            f"the weights after load_snapshot differ from those after epoch {_CRASH_EPOCH - 1} "
            f"by up to {diff:.3g}."
        )
    if resumed["exp_avg"] is None:
        raise Wrong(
            "after load_snapshot AdamW had no state (no exp_avg): it would start its moment estimates afresh."
        )
    diff = _differs(resumed["exp_avg"], want["exp_avg"])
    if diff is not None:
        raise Wrong(
            f"AdamW's first moments (exp_avg) after load_snapshot differ from the uninterrupted "
            f"run's by {diff:.3g}."
        )


@exercise(
    "04d.1",
    "snapshot a full training state",
    hint="List every object whose state changes while training and decides what the next step does — the "
    "weights are only one of them. And once the snapshot of epoch e is on disk, which epoch must the job "
    "go on at?",
)
def grade_snapshot(save_snapshot: Callable[..., Any], load_snapshot: Callable[..., Any]) -> str:
    """A torchrun job with a crash and --max-restarts=1 vs a single-process run of the same training."""
    for name, fn in (("save_snapshot", save_snapshot), ("load_snapshot", load_snapshot)):
        if not callable(fn):
            raise Wrong(f"pass the function {name} itself, not {type(fn).__name__}")
    body = (
        _HEADER
        + _source(save_snapshot)
        + "\n"
        + _source(load_snapshot)
        + "\n\nfrom mgpu_helpers.graders.nb04d import _worker_041\n"
        + f"_worker_041({save_snapshot.__name__}, {load_snapshot.__name__})\n"
    )
    want = _reference_041()
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
        code, output = _torchrun_once_restarted(body, folder)
    if code is None:
        raise Wrong(f"the torchrun job did not finish within {_TIMEOUT_S:g} s.")
    reports = {r["attempt"]: r for r in parse_results(output)}
    if 0 not in reports and code != 0:
        raise Wrong(f"the first attempt failed before training: {_last_error(output)}")
    if 1 not in reports:
        raise Wrong(f"the restarted workers failed: {_last_error(output)}")
    first, second = reports.get(0), reports[1]
    if first is not None and first["start"] != 0:
        raise Wrong(
            f"with no snapshot on disk your load_snapshot returned {first['start']!r} instead of epoch 0."
        )
    _check_resume(second, want["after_epoch"][_CRASH_EPOCH - 1])
    steps_done = len(want["lrs"]) - len(second["lrs"])
    for k, (got, lr) in enumerate(zip(second["lrs"], want["lrs"][steps_done:], strict=False)):
        if _differs([got], [lr]) is not None:
            raise Wrong(
                f"after the restart the learning rate at step {steps_done + k} (counting from 0) "
                f"was {got:.4g}; "
                f"the uninterrupted run used {lr:.4g} at that step."
            )
    diff = _differs(second["final"], want["final"])
    if diff is not None:
        raise Wrong(f"the final weights differ from an uninterrupted run's by up to {diff:.3g}.")
    return (
        f"a real torchrun job lost rank 1 at the start of epoch {_CRASH_EPOCH}, restarted both "
        f"workers, and they "
        "resumed with the weights, AdamW's moments and the learning rate of the uninterrupted run; the final "
        "weights equal a single-process run's (float64, up to rounding)."
    )


# --- 04d.2: repair a training loop that is not restart-safe -----------------------------------------------

_EPOCHS_2 = 4


def _setup_042() -> tuple[
    nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, torch.Tensor], dict[float, int]
]:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(_SAMPLES, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (_SAMPLES,), generator=gen)
    torch.manual_seed(0)  # the same weights on every rank; the global RNG is then in step on all ranks
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, (x, y), {float(v): i for i, v in enumerate(x[:, 0].tolist())}


def _watch(model: nn.Module, index: dict[float, int]) -> list[list[int]]:
    seen: list[list[int]] = []

    def record(_module: nn.Module, inputs: tuple[Any, ...]) -> None:
        seen.append([index.get(float(v), -1) for v in inputs[0][:, 0].tolist()])

    model.register_forward_pre_hook(record)
    return seen


def _dying_save(real_save: Callable[..., Any]) -> Callable[..., Any]:
    """torch.save that, on its second call, writes half of the file and ends the process (a crash)."""
    calls = [0]

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] != 2:
            real_save(obj, f, *args, **kwargs)
            return
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(data)
        else:
            f.write(data)
            f.flush()
        os._exit(1)

    return save


def _worker_042(train: Callable[..., Any]) -> None:
    """Runs in each torchrun worker: the student's train(), rank 0 dying in its second save (first
    attempt)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0:
        torch.save = _dying_save(torch.save)  # type: ignore[assignment]
    model, optimizer, data, index = _setup_042()
    seen = _watch(model, index)
    train(DDP(model), optimizer, data, _EPOCHS_2, os.path.abspath("snapshot.pt"))
    report = {
        "attempt": attempt,
        "seen": seen,
        "final": _flat(p.detach() for p in model.parameters()).tolist(),
    }
    if dist.get_rank() == 0:
        print(RESULT_PREFIX + json.dumps(report), flush=True)
    dist.destroy_process_group()


def _reference_rank_042(rank: int, world_size: int, train: Callable[..., Any], folder: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, optimizer, data, index = _setup_042()
    seen = _watch(model, index)
    train(DDP(model), optimizer, data, _EPOCHS_2, os.path.join(folder, "snapshot.pt"))
    return {"seen": seen, "final": _flat(p.detach() for p in model.parameters()).tolist()}


@exercise(
    "04d.2",
    "repair a training loop that is not restart-safe",
    hint="Imagine the process killed at any line: while torch.save is writing, what is left on disk for the "
    "restart? And after a restart, which random numbers does the shuffle draw — the ones an uninterrupted "
    "run would have drawn in that epoch?",
)
def grade_restart_safe(train: Callable[..., Any]) -> str:
    """Uninterrupted run (forked ranks) vs a torchrun job that dies mid-save and restarts once."""
    if not callable(train):
        raise Wrong(f"pass the function train itself, not {type(train).__name__}")
    body = (
        _HEADER
        + _source(train)
        + f"\n\nfrom mgpu_helpers.graders.nb04d import _worker_042\n_worker_042({train.__name__})\n"
    )
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
        reference = run_ranks(_reference_rank_042, 2, train, folder, timeout_s=60.0)[0]
    per_epoch = len(reference["seen"]) // _EPOCHS_2
    if len(reference["seen"]) != _EPOCHS_2 * per_epoch or per_epoch == 0:
        raise Wrong(
            f"without any crash, rank 0 ran {len(reference['seen'])} forward passes in {_EPOCHS_2} epochs."
        )
    with tempfile.TemporaryDirectory(prefix="mgpu-04d-") as folder:
        code, output = _torchrun_once_restarted(body, folder)
    if code is None:
        raise Wrong(f"the torchrun job did not finish within {_TIMEOUT_S:g} s.")
    reports = {r["attempt"]: r for r in parse_results(output)}
    if 1 not in reports:
        raise Wrong(
            "the first attempt died while rank 0 was writing the snapshot of epoch 1 (a crash "
            "half-way through "
            f"torch.save); then the restarted job failed: {_last_error(output)}"
        )
    seen = reports[1]["seen"]
    if len(seen) >= len(reference["seen"]):
        raise Wrong(
            "the first attempt died while writing the snapshot of epoch 1, so the snapshot of "
            "epoch 0 was the "
            "last complete one; the restarted job nevertheless trained all epochs from the beginning."
        )
    tail = reference["seen"][len(reference["seen"]) - len(seen) :]
    for step, (got, want) in enumerate(zip(seen, tail, strict=True)):
        if got != want:
            epoch = (len(reference["seen"]) - len(seen) + step) // per_epoch
            raise Wrong(
                f"after the restart, rank 0's batch {step % per_epoch} of epoch {epoch} held "
                f"samples {got[:4]} …; "
                f"in the uninterrupted run that batch held {want[:4]} …."
            )
    diff = _differs(reports[1]["final"], reference["final"])
    if diff is not None:
        raise Wrong(f"the final weights differ from the uninterrupted run's by up to {diff:.3g}.")
    return (
        "a real torchrun job died half-way through writing a snapshot, restarted, resumed from "
        "the last complete "
        "snapshot, saw the same batches as an uninterrupted run and ended with the same weights."
    )
