"""Tracked vs analytic memory, and the tracker's cost, for several models and optimizers.

For each case the same training steps run twice in this process — without and with the tracker — so
the overhead is a ratio of two measurements taken side by side. The tracker's persistent categories
(parameters + gradients + optimizer state, read right after ``optimizer.step()``) are compared with
the analytic estimate; the peak (which adds activations and temporaries) is shown against it too.

    python benchmarks/memory_tracker.py [--quick]

Last line: ``RESULT tracker_over_analytic=<x> peak_over_analytic=<y> tracking_overhead=<z>``, each the
geometric mean over the cases.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch

from mgpu_helpers.hardware import hardware_label
from mgpu_helpers.memory import MemoryTracker, estimate_training_memory
from mgpu_helpers.models import MLP, SmallCNN, TinyTransformer

STEPS = 5


def cases() -> list[tuple[str, Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer, Callable]]]]:
    """(name, factory) where factory returns model, optimizer and a function computing one loss."""

    def linear_adam():
        m = torch.nn.Linear(1000, 1000)
        x = torch.randn(64, 1000)
        return m, torch.optim.Adam(m.parameters()), lambda: m(x).pow(2).mean()

    def mlp_sgd():
        m = MLP(20, 512, 4, depth=3)
        x, y = torch.randn(256, 20), torch.randint(0, 4, (256,))
        return (
            m,
            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
            lambda: torch.nn.functional.cross_entropy(m(x), y),
        )

    def cnn_adamw():
        m = SmallCNN(3, 4, width=32)
        x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 4, (64,))
        return m, torch.optim.AdamW(m.parameters()), lambda: torch.nn.functional.cross_entropy(m(x), y)

    def transformer_adam():
        m = TinyTransformer(vocab_size=1000, d_model=64, n_heads=4, n_layers=2)
        x = torch.randint(0, 1000, (16, 32))
        return (
            m,
            torch.optim.Adam(m.parameters()),
            lambda: torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()),
        )

    return [
        ("Linear(1000,1000)+Adam", linear_adam),
        ("MLP+SGD(momentum)", mlp_sgd),
        ("SmallCNN+AdamW", cnn_adamw),
        ("TinyTransformer+Adam", transformer_adam),
    ]


def train(
    model, opt, loss_fn, tracker: MemoryTracker | None, steps: int = STEPS
) -> tuple[float, dict[str, int] | None]:
    after_step = None
    start = time.perf_counter()
    for _ in range(steps):
        loss_fn().backward()
        opt.step()
        if tracker is not None and after_step is None:
            after_step = tracker.mark("after step").bytes
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start, after_step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: two cases, no timing claim")
    args = parser.parse_args()
    steps = 2 if args.quick else STEPS
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ratios, peaks, overheads = [], [], []
    print(f"{'case':26}{'analytic B':>14}{'tracked B':>14}{'ratio':>8}{'peak/analytic':>15}{'overhead':>10}")
    for name, factory in cases()[: 2 if args.quick else None]:
        model, opt, loss_fn = factory()
        train(model, opt, loss_fn, None, steps)  # warm-up, also creates the optimizer state
        plain, _ = train(model, opt, loss_fn, None, steps)
        tracker = MemoryTracker(model, opt)
        with tracker:
            tracked_time, after_step = train(model, opt, loss_fn, tracker, steps)
        tracker.close()
        est = estimate_training_memory(model, opt)
        persistent = after_step["parameters"] + after_step["gradients"] + after_step["optimizer"]
        ratio, peak, overhead = persistent / est.total, tracker.peak_total / est.total, tracked_time / plain
        ratios.append(ratio)
        peaks.append(peak)
        overheads.append(overhead)
        print(f"{name:26}{est.total:>14,}{persistent:>14,}{ratio:>8.4f}{peak:>15.3f}{overhead:>9.2f}x")

    def gmean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    print(
        f"overhead measured on {hardware_label()}, 1 thread: tracked / untracked wall time of the same steps"
    )
    print(
        f"RESULT tracker_over_analytic={gmean(ratios):.4f} peak_over_analytic={gmean(peaks):.3f} "
        f"tracking_overhead={gmean(overheads):.2f}"
    )


if __name__ == "__main__":
    main()
