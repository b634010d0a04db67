"""Equal-budget comparison of hyperparameter search methods, over several seeds.

Grid, random search, ASHA (random proposals, asynchronous successive halving), TPE (Bayesian) and
TPE+ASHA (BOHB-style) each get the same budget of training epochs on notebook 06's toy task and
search space; every method runs once per seed (the seed drives its sampler and its trials' initial
weights). For each run we record the best validation accuracy found after every epoch spent, and
count the epochs until it came within 1 percentage point of the best accuracy any run found.

    python benchmarks/tuning.py                    # 5 seeds, budget = 6 full trainings of 8 epochs
    python benchmarks/tuning.py --seeds 10 --budget-trials 12
    python benchmarks/tuning.py --quick            # smoke test: tiny budget, no claim

A run that never reaches the target counts as the whole budget (so such means are lower bounds; the
table says how many seeds got there). Last line:
``RESULT asha_epochs_to_1pct=<a> grid_epochs_to_1pct=<g> ratio=<a/g>``.
"""

from __future__ import annotations

import argparse
import time

import torch

from mgpu_helpers.hardware import hardware_label
from mgpu_helpers.tuning import METHODS, compare_methods, method_summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per method (at least 3)")
    parser.add_argument(
        "--budget-trials", type=int, default=6, help="budget, in full trainings of --max-t epochs"
    )
    parser.add_argument("--max-t", type=int, default=8, help="epochs of a full training (ASHA's max_t)")
    parser.add_argument("--tolerance", type=float, default=0.01, help="'within' this of the best (absolute)")
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, no timing claim")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.budget_trials, args.max_t = 3, 2, 2
    if args.seeds < 3:
        parser.error("use at least 3 seeds: single runs of a search are mostly luck")

    torch.set_num_threads(1)
    budget = args.budget_trials * args.max_t
    print(f"hardware: {hardware_label()} (the study runs on the CPU, one trial at a time)")
    print(f"budget: {budget} epochs per run ({args.budget_trials} x {args.max_t}); seeds 0..{args.seeds - 1}")
    start = time.perf_counter()
    comparison = compare_methods(
        METHODS, budget=budget, seeds=range(args.seeds), max_t=args.max_t, progress=False
    )
    elapsed = time.perf_counter() - start
    target = comparison.reference - args.tolerance
    print(f"{len(comparison.traces)} runs in {elapsed:.1f} s (measured)")
    print(f"best accuracy found by any run: {comparison.reference:.4f}; target: {target:.4f}\n")
    print(method_summary(comparison, args.tolerance))
    print("\nepochs to target per seed ('-' = not reached within the budget):")
    for method in comparison.methods:
        values = comparison.epochs_to_target(method, args.tolerance)
        print(f"  {method:>9}: " + " ".join(f"{v:>3}" if v is not None else "  -" for v in values))
    asha, _ = comparison.mean_epochs_to_target("asha", args.tolerance)
    grid, _ = comparison.mean_epochs_to_target("grid", args.tolerance)
    print(f"RESULT asha_epochs_to_1pct={asha:.1f} grid_epochs_to_1pct={grid:.1f} ratio={asha / grid:.3f}")


if __name__ == "__main__":
    main()
