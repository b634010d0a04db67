"""Hyperparameter search at equal budgets: when does ASHA's early stopping pay?

Part 1 (notebook 06b, section 3, with more seeds): random search with and without Ray's
``ASHAScheduler`` (driven by hand, one trial at a time, so budgets are exact) in two regimes of
``mgpu_helpers.tuning.REGIMES``:

* ``toy`` — the notes' widths and learning rates (batch sizes 16–64), 8-epoch trainings: most
  configurations are fine;
* ``favourable`` — 27-epoch trainings, a learning rate from 1e-6 to 100: most configurations learn
  nothing or diverge early.

A search's result is the best model among trials that trained all ``max_t`` epochs within the
budget. Per regime: ``asha_ratio`` = ASHA's mean shortfall from the best model any search found,
divided by random search's (below 1: ASHA got closer; about 1: no gain).

Part 2 (with ``--methods``): the five-method comparison (grid, random, ASHA, TPE, TPE+ASHA) with
Optuna on the toy task, as a table.

    python benchmarks/tuning.py                  # 12 seeds per regime and method
    python benchmarks/tuning.py --seeds 20 --methods
    python benchmarks/tuning.py --quick          # smoke test: tiny budgets, no claim

Last line: ``RESULT asha_ratio_favourable=<f> asha_ratio_toy=<t>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from mgpu_helpers.hardware import hardware_label
from mgpu_helpers.tuning import METHODS, REGIMES, asha_gain, compare_methods, method_summary, search


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=12, help="seeds per regime and method (at least 3)")
    parser.add_argument("--methods", action="store_true", help="also run the five-method comparison")
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny budgets, no claim")
    args = parser.parse_args()
    if args.seeds < 3:
        parser.error("use at least 3 seeds: single runs of a search are mostly luck")
    regimes = dict(REGIMES)
    if args.quick:
        args.seeds = 3
        regimes = {
            name: dataclasses.replace(r, budget_trainings=2, max_t=min(r.max_t, 4))
            for name, r in regimes.items()
        }

    torch.set_num_threads(1)
    print(f"hardware: {hardware_label()} (the studies run on the CPU, one trial at a time)")
    ratios = {}
    for name, regime in regimes.items():
        start = time.perf_counter()
        random = [search(regime, s, early_stopping=False) for s in range(args.seeds)]
        asha = [search(regime, s, early_stopping=True) for s in range(args.seeds)]
        g = asha_gain(random, asha)
        ratios[name] = g["ratio"]
        print(
            f"\n{name}: budget {regime.budget} epochs ({regime.budget_trainings} x {regime.max_t}), "
            f"{args.seeds} seeds, {time.perf_counter() - start:.1f} s (measured)"
        )
        print(f"  configurations tried: random {g['tried_random']:.1f}, ASHA {g['tried_asha']:.1f}")
        print(
            f"  mean best accuracy  : random {g['random']:.4f}, ASHA {g['asha']:.4f} (gain {g['gain']:+.4f})"
        )
        print(f"  per seed, random: {' '.join(f'{r.best:.3f}' for r in random)}")
        print(f"  per seed, ASHA  : {' '.join(f'{r.best:.3f}' for r in asha)}")
        print(f"  shortfall ratio ASHA / random: {g['ratio']:.3f}")
    if args.methods:
        budget, max_t = (8, 2) if args.quick else (48, 8)
        comparison = compare_methods(
            METHODS, budget=budget, seeds=range(args.seeds), max_t=max_t, progress=False
        )
        print(f"\nfive methods, toy task, budget {budget} epochs:\n{method_summary(comparison)}")
    print(f"RESULT asha_ratio_favourable={ratios['favourable']:.3f} asha_ratio_toy={ratios['toy']:.3f}")


if __name__ == "__main__":
    main()
