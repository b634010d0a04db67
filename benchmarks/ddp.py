"""DDP throughput with 2 processes over 1 process, at the same global batch, measured side by side.

Each process trains the same MLP with DistributedDataParallel on ``global_batch / nprocs`` samples per
step (so the work per step is fixed) and gets one core — as it would get one GPU — via
:func:`mgpu_helpers.ddp.measure_throughput` (gloo on CPU, NCCL when there is a GPU per process). The
1- and 2-process runs alternate, several rounds, and the medians are compared, so both see the same
machine load; the load average is printed because other programs on the machine make the ratio noisy.

    python benchmarks/ddp.py [--rounds 5] [--steps 20] [--quick]

Last line: ``RESULT ddp_speedup_2proc=<x>`` (median throughput of 2 processes / median of 1).
"""

from __future__ import annotations

import argparse
import os
import statistics

from mgpu_helpers.ddp import measure_throughput
from mgpu_helpers.hardware import hardware_label


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating 1- and 2-process runs (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, no timing claim")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.global_batch = 1, 2, 64
    print(f"hardware: {hardware_label()}")
    print(
        f"MLP 256-512-512-10, global batch {args.global_batch}, {args.steps} timed steps, "
        f"one core per process, {args.rounds} rounds"
    )
    rates: dict[int, list[float]] = {1: [], 2: []}
    loads = []
    for round_ in range(args.rounds):
        for nprocs in (1, 2):
            rate = measure_throughput(
                nprocs, global_batch=args.global_batch, steps=args.steps, warmup=3, threads_per_process=1
            )
            rates[nprocs].append(rate)
            loads.append(os.getloadavg()[0])
            print(f"round {round_ + 1}: {nprocs} process(es): {rate:,.0f} samples/s", flush=True)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"median 1 process : {one:,.0f} samples/s (measured on {hardware_label()})")
    print(f"median 2 processes: {two:,.0f} samples/s")
    print(f"load average during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
    print(f"RESULT ddp_speedup_2proc={two / one:.3f}")


if __name__ == "__main__":
    main()
