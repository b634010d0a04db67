"""What the launcher's forkserver costs against a plain fork of the kernel (notebooks 02a–08, every grader).

``launch()`` starts its ranks from a forkserver that preloads torch, never by forking the notebook's
kernel (:mod:`mgpu_helpers.launching.server` says why: a fork fails at its first backward once autograd
owns a thread, as it does on every GPU machine). This measures, in one run, a 2-rank launch of one DDP
training step:

* the **first** launch in a fresh process, which starts the forkserver (it imports torch);
* **warm** launches from the running forkserver;
* the same launches with a **plain fork** of this process, which is safe only while this process has
  never run autograd (it imports ``torch._dynamo`` first, as the old launcher did, so fork children
  inherit it). Where it has (on a GPU machine any ``backward()`` does that; CI's benchmark test puts its
  process in that state on purpose), the whole measurement runs again in a fresh interpreter.

Warm and fork launches alternate, so both see the same machine load; the medians are compared.

    python benchmarks/launch.py [--repeats 9] [--quick]

Last line: ``RESULT warm_over_fork=<x> first_launch_s=<s>`` (goal on 2 cores: warm ≤ 1.2× fork, first ≤ 4 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_helpers.hardware import choose_backend, hardware_label
from mgpu_helpers.launching import launch
from mgpu_helpers.launching.notebook import _run


def ddp_step(rank: int, world_size: int) -> float:
    """One DDP training step of a small MLP on this rank's half of a batch; the loss."""
    cuda = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = DDP(mlp.to(device), device_ids=[rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32, device=device), torch.randint(0, 4, (16,), device=device)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def fork_is_safe() -> bool:
    """Whether a forked child of this process can run ``backward()`` (not once autograd owns a thread)."""
    pid = os.fork()
    if pid == 0:  # the child
        try:
            torch.ones(1, requires_grad=True).sum().backward()
            os._exit(0)
        except RuntimeError:
            os._exit(3)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def timed(method: str | None, backend: str) -> float:
    start = time.perf_counter()
    if method is None:
        losses = launch(ddp_step, 2, backend=backend)
    else:
        losses = _run(ddp_step, 2, (), backend, True, 120.0, 60.0, 1, None, method=method)
    assert losses[0] == losses[1], losses  # DDP: the same model on both ranks
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="warm and fork launches, each")
    parser.add_argument("--quick", action="store_true", help="1 repeat (CI: runs the code, claims nothing)")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    if not fork_is_safe():  # this process ran autograd: the fork path would fail, not be timed
        print(
            "This process already ran autograd, so a plain fork of it cannot: timing both launchers in a "
            "fresh interpreter instead.",
            file=sys.stderr,
        )
        fresh = subprocess.run([sys.executable, __file__, *sys.argv[1:]], capture_output=True, text=True)
        sys.stderr.write(fresh.stderr)
        print(fresh.stdout, end="")
        if fresh.returncode:
            raise SystemExit(fresh.returncode)
        return
    backend = choose_backend(2)

    first = timed(None, backend)  # starts the forkserver
    import torch._dynamo  # noqa: F401 - what the old launcher imported before forking

    timed("fork", backend)  # the fork path's own first run (lazy imports in this process)
    warm, fork = [], []
    for _ in range(repeats):
        warm.append(timed(None, backend))
        fork.append(timed("fork", backend))
    w, f = statistics.median(warm), statistics.median(fork)
    print(f"2-rank launch of a DDP step ({backend}), measured on {hardware_label()}, median of {repeats}:")
    print(f"  first launch (starts the forkserver): {first:.2f} s")
    print(f"  warm forkserver launch:               {w:.3f} s")
    print(f"  plain fork of this process:           {f:.3f} s")
    print(f"RESULT warm_over_fork={w / f:.3f} first_launch_s={first:.3f}")


if __name__ == "__main__":
    main()
