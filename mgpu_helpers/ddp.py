"""Used by notebook 04 (DistributedDataParallel) and ``benchmarks/ddp.py``: the notebook's plumbing.

The concepts (process groups, the ring all-reduce, the DDP training loop) are written out in the
notebook; this module holds what would only distract there:

* :func:`run_c10d_job` — a multi-"node" ``torchrun`` job on this machine that meets through the
  **c10d rendezvous** on ``127.0.0.1`` (every node runs the *same* command; the rendezvous hands out
  node ranks), with the same clean-up guarantees as :func:`mgpu_helpers.launching.run_torchrun`, which
  uses the static ``--master-addr``/``--node-rank`` style by default;
* :func:`plot_loss_per_rank` and :func:`plot_bytes_per_rank` — the two plots of the notebook;
* :func:`measure_throughput` — samples per second of DDP training with N processes at a fixed global
  batch, launched with :func:`mgpu_helpers.launching.launch` (shared by the notebook and the benchmark).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .launching import NodeRun, launch, run_torchrun

__all__ = [
    "measure_throughput",
    "plot_bytes_per_rank",
    "plot_loss_per_rank",
    "run_c10d_job",
]


def run_c10d_job(
    target: str,
    args: Sequence[str] = (),
    *,
    nnodes: int = 2,
    nproc_per_node: int = 1,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    module: bool = False,
    check: bool = True,
) -> list[NodeRun]:
    """Start ``nnodes`` torchrun agents on this machine that form one job through the c10d rendezvous.

    Every agent runs the *same* command (``--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:<port>``);
    the rendezvous numbers the nodes (the workers' ``GROUP_RANK``). This is
    :func:`mgpu_helpers.launching.run_torchrun` with ``rdzv="c10d"``: failures name the failing rank
    and quote its traceback, and every process is gone when it returns or raises.
    """
    return run_torchrun(
        target,
        args,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        timeout=timeout,
        env=env,
        module=module,
        check=check,
        rdzv="c10d",
    )


def _series(name: str, values: Any) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list, not {type(values).__name__}")
    return list(values)


def _numbers(name: str, values: Any) -> list[float]:
    values = _series(name, values)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name} must be a list of numbers, got {values!r}")
    return values


def plot_loss_per_rank(
    losses: Sequence[Sequence[float]],
    *,
    reference: Sequence[float] | None = None,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """One line per rank (loss on that rank's shard at each step), optionally the full-batch reference.

    Args:
        losses: ``losses[rank][step]``; every rank must have the same number of steps.
        reference: the loss of one process on the whole global batch at each step, drawn dashed.
        ax: matplotlib axes to draw on (a new figure when None).
        title: the plot's title.
    """
    losses = [_numbers(f"losses[{r}]", values) for r, values in enumerate(_series("losses", losses))]
    if not losses or any(len(r) != len(losses[0]) for r in losses):
        raise ValueError("losses must be a non-empty list with the same number of steps for every rank")
    if reference is not None and len(_numbers("reference", reference)) != len(losses[0]):
        raise ValueError(f"reference has {len(reference)} steps, the ranks have {len(losses[0])}")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 3))
    steps = range(len(losses[0]))
    for rank, values in enumerate(losses):
        ax.plot(steps, values, lw=1.2, alpha=0.85, label=f"rank {rank} (its shard)")
    if reference is not None:
        ax.plot(steps, reference, "k--", lw=1.5, label="one process, whole batch")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or "Loss per rank")
    ax.legend(fontsize=8, frameon=False)
    return ax


def plot_bytes_per_rank(
    ring: Mapping[int, Sequence[int]],
    naive: Mapping[int, Sequence[int]] | None = None,
    *,
    ax: Any = None,
    unit: str = "KiB",
    title: str | None = None,
) -> Any:
    """Bytes each rank sent in one all-reduce, for several world sizes: ring vs gather-to-rank-0.

    Args:
        ring: world size -> bytes sent by each rank with the ring algorithm.
        naive: world size -> bytes sent by each rank when rank 0 gathers, sums and sends back.
        ax: matplotlib axes to draw on (a new figure when None).
        unit: "B", "KiB" or "MiB".
        title: the plot's title.
    """
    units = {"B": 1, "KiB": 1024, "MiB": 1024**2}
    if unit not in units:
        raise ValueError(f"unit must be one of {sorted(units)}, not {unit!r}")
    if not isinstance(ring, Mapping) or not ring:
        raise ValueError(
            "ring must be a dict {world size: [bytes sent by each rank]} with at least one entry"
        )
    for name, data in (("ring", ring), ("naive", naive or {})):
        if not isinstance(data, Mapping):
            raise TypeError(
                f"{name} must be a dict {{world size: [bytes per rank]}}, not {type(data).__name__}"
            )
        for n, values in data.items():
            if (
                isinstance(n, bool)
                or not isinstance(n, int)
                or n < 1
                or len(_numbers(f"{name}[{n}]", values)) != n
            ):
                raise ValueError(
                    f"{name}[{n!r}] must list the bytes of each of the {n!r} ranks, got {values!r}"
                )
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 3))
    scale = units[unit]
    series = [("ring", ring, "#4C72B0")] + ([("gather to rank 0", naive, "#C44E52")] if naive else [])
    width = 0.8 / len(series)
    ticks, labels, x = [], [], 0.0
    for n in sorted(ring):
        for rank in range(n):
            for j, (name, data, color) in enumerate(series):
                values = data.get(n)
                if values is None:
                    continue
                ax.bar(x + j * width, values[rank] / scale, width, color=color, label=name)
            ticks.append(x + width * (len(series) - 1) / 2)
            labels.append(f"N={n}\nr{rank}" if rank == 0 else f"r{rank}")
            x += 1
        x += 0.6  # a gap between world sizes
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=8, frameon=False)
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel(f"bytes sent ({unit})")
    ax.set_title(title or "Bytes each rank sends in one all-reduce")
    return ax


def _throughput_worker(
    rank: int,
    world_size: int,
    global_batch: int,
    steps: int,
    warmup: int,
    in_features: int,
    hidden: int,
    depth: int,
) -> float:
    """Train an MLP with DDP on this rank's share of a fixed global batch; return seconds for ``steps``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .models import MLP

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(MLP(in_features, hidden, 10, depth).to(device), device_ids=[rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    local = global_batch // world_size
    x = torch.randn(local, in_features, generator=gen).to(device)
    y = torch.randint(0, 10, (local,), generator=gen).to(device)
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            if cuda:
                torch.cuda.synchronize(device)
            dist.barrier()
            start = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure_throughput(
    nprocs: int,
    *,
    global_batch: int = 512,
    steps: int = 10,
    warmup: int = 2,
    in_features: int = 256,
    hidden: int = 512,
    depth: int = 2,
    threads_per_process: int = 1,
) -> float:
    """Samples per second of DDP training with ``nprocs`` processes at a fixed global batch.

    Every process trains the same MLP on ``global_batch // nprocs`` samples per step (so the work per
    step is the same for any ``nprocs``); the time is the slowest rank's, after ``warmup`` steps.
    Processes are started with :func:`mgpu_helpers.launching.launch` (backend from
    :func:`mgpu_helpers.hardware.choose_backend`: gloo on CPU, NCCL with a GPU per process).
    ``threads_per_process=1`` gives each process one core, as it would get one GPU; more threads with
    fork are only safe if this process has not run multi-threaded ops (launch warns).
    """
    limits = [("nprocs", nprocs, 1), ("global_batch", global_batch, 1), ("steps", steps, 1)]
    limits += [("warmup", warmup, 0), ("in_features", in_features, 1), ("hidden", hidden, 1)]
    limits += [("depth", depth, 1), ("threads_per_process", threads_per_process, 1)]
    for name, value, minimum in limits:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a whole number, not {value!r}")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, not {value}")
    if global_batch < nprocs or global_batch % nprocs:
        raise ValueError(
            f"global_batch ({global_batch}) must be a positive multiple of nprocs ({nprocs}), "
            f"such as {nprocs * max(1, global_batch // nprocs)}"
        )
    seconds = launch(
        _throughput_worker,
        nprocs,
        args=(global_batch, steps, warmup, in_features, hidden, depth),
        threads_per_process=threads_per_process,
    )
    return global_batch * steps / max(seconds)
