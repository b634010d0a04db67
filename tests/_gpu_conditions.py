"""What a GPU machine does to a notebook kernel, reproduced on a CPU: autograd owns a worker thread.

On a machine with a GPU, autograd starts its per-device threads at the first ``backward()`` of a process,
even a CPU-only one, and PyTorch then refuses autograd in any *forked* child ("Unable to handle autograd's
threading in combination with fork-based multiprocessing"). On a CPU, autograd starts such a thread when
re-entrant backward nests deeper than its limit (about 60 levels): :func:`start_autograd_thread` does
that, so that CPU CI runs every test and notebook in the state a GPU machine creates, and any code path
that still forks a process that ran autograd fails here as it would there.

The root ``conftest.py`` calls it in the test process and in every notebook kernel (it sends this file's
source to the kernel), and ``tests/test_gpu_conditions.py`` shows that a plain fork then fails.
"""

import torch


class _Nest(torch.autograd.Function):
    """Identity whose backward runs another backward, ``depth`` levels deep."""

    @staticmethod
    def forward(ctx, x, depth):
        ctx.depth = depth
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.depth > 0:
            with torch.enable_grad():
                inner = torch.zeros((), requires_grad=True)
                _Nest.apply(inner, ctx.depth - 1).backward()
        return grad, None


def start_autograd_thread(depth: int = 100) -> None:
    """Nest re-entrant backward ``depth`` deep: past autograd's limit it hands the work to a new thread."""
    x = torch.zeros((), requires_grad=True)
    _Nest.apply(x, depth).backward()
