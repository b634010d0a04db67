"""GPipe vs the same micro-batches run one at a time, measured on 2 CPU processes (one thread each).

The longer version of notebook 02a §4. Both runs use the same two-stage model and the *same* m
micro-batches, so every forward and backward pass does the same work in both; only the order differs:

* sequential — micro-batch 0 goes forward through both stages and back, then micro-batch 1, …
  (the naive split with gradient accumulation: one stage works at a time);
* GPipe — all m forwards stream through the stages, then all m backwards.

With p equal stages and free communication the speed-up is at most m·p / (m + p − 1) (1.78 for p = 2,
m = 8). Comparing against the naive split over the *whole* batch instead would mix two effects:
pipelining, and the different per-row speed of smaller matrix products.

    python benchmarks/pipeline.py [--width 1024] [--layers 3] [--rows 512] [--m 8] [--repeats 7] [--quick]

Runs are interleaved round-robin (sequential, GPipe, sequential, …) after one warm-up round; the
median step of each is kept. "pass slowdown" compares the median pass time under GPipe with the one
under the sequential run: about 1.0 when each stage had a core of its own; well above 1 means other
programs competed for the cores, and the speed-up then understates what two free cores give. Last line:
``RESULT gpipe_speedup=<x> theory=<y> fraction_of_theory=<x/y>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from mgpu_helpers.hardware import hardware_label
from mgpu_helpers.pipeline import PipelineSpec, pipeline_speedup, run_pipeline


def _median_pass(run, kind: str) -> float:
    return statistics.median(t.duration for t in run.timeline.tasks if t.kind == kind)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3, help="Linear+ReLU layers per stage")
    parser.add_argument("--rows", type=int, default=512, help="rows per micro-batch")
    parser.add_argument("--m", type=int, default=8, help="micro-batches per step")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, no timing claim")
    args = parser.parse_args()
    if args.quick:
        args.width, args.layers, args.rows, args.m, args.repeats = 64, 1, 16, 2, 1

    p = 2
    spec = PipelineSpec(
        runs=[("sequential", args.m), ("gpipe", args.m)],
        width=args.width,
        layers_per_stage=args.layers,
        batch=args.rows * args.m,
        repeats=args.repeats,
        warmup=1,
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"hardware: {hardware_label()}; load average before: {load:.2f} on {os.cpu_count()} cores")
    print(
        f"model: {p} stages × {args.layers} × Linear({args.width}, {args.width}) + ReLU; "
        f"{args.m} micro-batches "
        f"of {args.rows} rows; median of {args.repeats} steps each, interleaved"
    )
    start = time.monotonic()
    sequential, gpipe = run_pipeline(spec, p)
    wall = time.monotonic() - start
    for run in (sequential, gpipe):
        tl = run.timeline
        idle = ", ".join(f"stage {s} idle {tl.idle_fraction(s):.0%}" for s in range(p))
        share = ", ".join(f"{tl.cpu_share(s):.0%}" for s in range(p))
        print(
            f"{tl.label:>16}: step {tl.makespan * 1e3:7.1f} ms (measured)  {idle};  median F "
            f"{_median_pass(run, 'F') * 1e3:.1f} ms, B {_median_pass(run, 'B') * 1e3:.1f} ms per pass; "
            f"CPU share of a core while computing, per stage: {share}"
        )
    slowdown = max(_median_pass(gpipe, k) / _median_pass(sequential, k) for k in "FB")
    print(f"pass slowdown under GPipe: ×{slowdown:.2f} (about 1.0 when each stage has a core of its own)")
    speedup = sequential.timeline.makespan / gpipe.timeline.makespan
    theory = pipeline_speedup(p, args.m)
    print(f"losses agree: sequential {sequential.loss:.6f}, GPipe {gpipe.loss:.6f}")
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"wall time {wall:.1f} s; load average after: {load_after:.2f}")
    print(f"RESULT gpipe_speedup={speedup:.3f} theory={theory:.3f} fraction_of_theory={speedup / theory:.3f}")


if __name__ == "__main__":
    main()
