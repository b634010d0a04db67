"""bf16 autocast vs fp32 training steps, side by side in one run: time and peak memory.

For each case the same model (same initial weights) is trained in fp32 and under
``torch.autocast(device, dtype=torch.bfloat16)``; steps are timed in alternating rounds
(``compare_step_times``), so a change in machine load hits both alike, and the peak live bytes of one
step are counted by ``MemoryTracker``. On a GPU (``--device cuda``, the default when one is visible)
fp16 autocast with ``GradScaler`` is timed too.

    python benchmarks/amp.py [--repeats 5] [--device cpu|cuda] [--threads N] [--quick]

Last line: ``RESULT bf16_speedup=<x> memory_ratio=<y>`` (``fp16_speedup`` on a GPU without bf16, e.g. a
T4) — fp32 step time over bf16 step time, and bf16
peak step memory over fp32 peak step memory; each the geometric mean over the cases.

On the CPU the steps run on one thread by default (``--threads``), as in notebook 05a §4: on a small
machine shared with other programs, one thread is disturbed far less than several.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

import torch

from mgpu_helpers.hardware import hardware_label
from mgpu_helpers.memory import MemoryTracker
from mgpu_helpers.models import MLP, TinyTransformer
from mgpu_helpers.precision import compare_step_times, cpu_has_native_bf16

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def cases(device: torch.device) -> dict[str, Callable[[], tuple[torch.nn.Module, Callable]]]:
    """name -> factory returning (model, loss function of the model) with fixed data on ``device``."""

    def mlp():
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(1024, 256, generator=g), torch.randint(0, 10, (1024,), generator=g)
        x, y = x.to(device), y.to(device)
        return MLP(256, 1024, 10, depth=3), lambda m: torch.nn.functional.cross_entropy(m(x), y)

    def transformer():
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 1000, (32, 64), generator=g).to(device)

        def loss(m):
            logits = m(tokens)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())

        return TinyTransformer(vocab_size=1000, d_model=128, n_heads=4, n_layers=2), loss

    return {"MLP 256-1024x3, batch 1024": mlp, "TinyTransformer d128 L2, 32x64 tokens": transformer}


def make_step(
    model: torch.nn.Module, loss_fn: Callable, mode: str, device: torch.device
) -> Callable[[], None]:
    """One Adam training step in ``mode`` (fp32, bf16 autocast, or fp16 autocast + GradScaler)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")
    dtype = DTYPES[mode]

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    step.model, step.opt = model, opt  # type: ignore[attr-defined]
    return step


def peak_step_bytes(step: Callable[[], None]) -> int:
    """Peak live bytes (all categories) during one step, counted by the tracker."""
    tracker = MemoryTracker(step.model, step.opt)  # type: ignore[attr-defined]
    with tracker:
        step()
    tracker.close()
    return tracker.peak_total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 on the CPU)")
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, no timing claim")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    device = torch.device(args.device)
    if args.threads is not None or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    # The 16-bit format measured against fp32: bf16, except on a GPU that only emulates it (a T4, compute
    # capability < 8.0), where fp16 + GradScaler is what one would train with (as notebook 05a does).
    no_bf16 = device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False)
    half = "fp16" if no_bf16 else "bf16"
    modes = ["fp32", half] + (["fp16"] if device.type == "cuda" and half == "bf16" else [])
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"hardware: {hardware_label()} | device {device} | torch {torch.__version__}")
    print(f"torch threads: {torch.get_num_threads()} | load average before: {load}")
    if device.type == "cpu":
        print(f"CPU has native bf16 instructions (avx512_bf16/amx_bf16): {cpu_has_native_bf16()}")
    speedups, ratios = [], []
    for name, factory in list(cases(device).items())[: 1 if args.quick else None]:
        steps = {}
        for mode in modes:
            torch.manual_seed(0)
            model, loss_fn = factory()
            steps[mode] = make_step(model.to(device), loss_fn, mode, device)
        times = compare_step_times(steps, repeats=args.repeats, warmup=1)
        peaks = {mode: peak_step_bytes(step) for mode, step in steps.items()}
        speedups.append(times["fp32"] / times[half])
        ratios.append(peaks[half] / peaks["fp32"])
        print(f"\n{name}")
        for mode in modes:
            print(
                f"  {mode:5} step {times[mode] * 1e3:8.1f} ms (median of {args.repeats})"
                f"   peak {peaks[mode] / 2**20:7.2f} MiB"
            )
        print(f"  {half}: {speedups[-1]:.2f}x the speed of fp32, {ratios[-1]:.2f}x its peak memory")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"\nload average after: {load}")
    speedup = math.prod(speedups) ** (1 / len(speedups))
    ratio = math.prod(ratios) ** (1 / len(ratios))
    print(f"RESULT {half}_speedup={speedup:.2f} memory_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
