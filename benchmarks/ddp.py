"""DDP speed-up with 2 processes over 1, at a fixed global batch, in two regimes (notebook 04b §4).

* compute-bound: an MLP with few parameters and much work per parameter (width 256, 4 hidden layers,
  global batch 8,192; on GPUs width 1,024 and 16,384 samples) — the speed-up should near 2;
* communication-bound: many parameters and little work (width 2,048, 2 hidden layers, 8 samples) —
  the all-reduce of 34 MB dominates and the speed-up falls far below, often below 1.

Every process gets one core (as it would get one GPU); gloo on CPU, NCCL when there is a GPU per process
(:func:`mgpu_helpers.hardware.choose_backend`). In the same processes, step by step, it times a training
step without communication ("alone"), the same step under DDP, and an all-reduce of the whole gradient,
after warm-up steps; 1- and 2-process runs alternate for several rounds and the medians are compared.
"alone x2" is what two processes can give on this machine now (below 2 when other programs share the
cores), and ``T1 / (T_half + T_allreduce)`` the predicted speed-up.

    python benchmarks/ddp.py [--rounds 3] [--steps 8] [--quick]

Last line: ``RESULT ddp_speedup_compute_bound=<x> ddp_speedup_comm_bound=<x>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_helpers.hardware import choose_backend, hardware_label
from mgpu_helpers.launching import launch
from mgpu_helpers.models import MLP


def _timed(fn: Any, device: torch.device) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def step_times(
    rank: int, world_size: int, width: int, depth: int, global_batch: int, warmup: int, steps: int
) -> dict[str, list[float]]:
    """Per-step seconds on this rank: training alone, training under DDP, an all-reduce of the gradient."""
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    alone = MLP(width, width, 10, depth).to(device)
    ddp = DDP(MLP(width, width, 10, depth).to(device), device_ids=[device.index] if cuda else None)
    x = torch.randn(global_batch // world_size, width, device=device)
    y = torch.randint(0, 10, (global_batch // world_size,), device=device)
    gradient = torch.zeros(sum(p.numel() for p in alone.parameters()), device=device)

    def train_step(model: torch.nn.Module) -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad

    times: dict[str, list[float]] = {"alone": [], "DDP": [], "all_reduce": []}
    for step in range(warmup + steps):
        t = {"alone": _timed(lambda: train_step(alone), device)}
        if world_size > 1:
            t["DDP"] = _timed(lambda: train_step(ddp), device)
            t["all_reduce"] = _timed(lambda: dist.all_reduce(gradient), device)
        if step >= warmup:
            for kind, seconds in t.items():
                times[kind].append(seconds)
    return times


def measure(
    shape: tuple[int, int, int], rounds: int, warmup: int, steps: int, backend: str
) -> dict[str, float]:
    """Medians over rounds of alternating 1- and 2-process runs; speed-up, prediction, 'alone x2'."""
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for nprocs in (1, 2):
            ranks = launch(step_times, nprocs, args=(*shape, warmup, steps), backend=backend)
            for kind in ranks[0]:
                per_rank = [r[kind] for r in ranks]
                samples.setdefault((kind, nprocs), []).extend(max(s) for s in zip(*per_rank, strict=True))
    t1, half, ar, ddp = (
        statistics.median(samples[k]) for k in [("alone", 1), ("alone", 2), ("all_reduce", 2), ("DDP", 2)]
    )
    return {
        "t1": t1,
        "half": half,
        "ar": ar,
        "ddp": ddp,
        "speedup": t1 / ddp,
        "predicted": t1 / (half + ar),
        "alone": t1 / half,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating 1- and 2-process runs (default 3)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run (default 8)")
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, no timing claim")
    args = parser.parse_args(argv)
    backend = choose_backend(2)
    on_gpu = backend == "nccl"
    regimes = {
        "compute_bound": (1024, 4, 16384) if on_gpu else (256, 4, 8192),
        "comm_bound": (2048, 2, 8),
    }
    warmup = 2
    if args.quick:
        regimes = {"compute_bound": (64, 2, 256), "comm_bound": (256, 1, 4)}
        args.rounds, args.steps, warmup = 1, 2, 1
    print(f"hardware: {hardware_label()}; backend {backend}; one core (or GPU) per process")
    print(
        f"{'regime':<15}{'T1 ms':>8}{'T_half':>8}{'T_ar':>8}{'T_DDP':>8}"
        f"{'speed-up':>10}{'predicted':>10}{'alone x2':>9}"
    )
    found = {}
    for name, shape in regimes.items():
        r = measure(shape, args.rounds, warmup, args.steps, backend)
        found[name] = r["speedup"]
        print(
            f"{name:<15}{r['t1'] * 1e3:>8.1f}{r['half'] * 1e3:>8.1f}{r['ar'] * 1e3:>8.1f}"
            f"{r['ddp'] * 1e3:>8.1f}"
            f"{r['speedup']:>9.2f}x{r['predicted']:>9.2f}x{r['alone']:>8.2f}x",
            flush=True,
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        f"RESULT ddp_speedup_compute_bound={found['compute_bound']:.3f} "
        f"ddp_speedup_comm_bound={found['comm_bound']:.3f}"
    )


if __name__ == "__main__":
    main()
