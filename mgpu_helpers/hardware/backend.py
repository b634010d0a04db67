"""Used by every notebook that starts processes (01, 02, 04, 05, 06, 07), by the launchers and the
torchrun worker, and by ``python -m mgpu_helpers``: the course's one backend rule,
:func:`choose_backend`, and the device to train on, :func:`recommended_device`.

Both check CUDA fork-safely (see the package docstring, "Fork safety"), so a notebook can ask them
before it starts fork-based workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import sources as _src
from .node import NodeInfo

if TYPE_CHECKING:
    import torch

__all__ = ["BACKENDS", "choose_backend", "recommended_device"]

#: The distributed backends the course uses: gloo (CPU, anywhere) and NCCL (one CUDA GPU per rank).
BACKENDS: tuple[str, ...] = ("gloo", "nccl")


def _nccl_available() -> bool:
    """Whether this torch build has torch.distributed with NCCL."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_nccl_available())
    except Exception:
        return False


def _check_info(info: object) -> None:
    """Refuse anything but None or a NodeInfo, saying where a NodeInfo comes from."""
    if info is not None and not isinstance(info, NodeInfo):
        raise TypeError(
            f"info must be a NodeInfo from describe_node() or None (check this machine), "
            f"not {type(info).__name__}"
        )


def _usable_gpu_count(info: NodeInfo | None) -> int:
    """GPUs torch can use, fork-safely (see :func:`sources._cuda_usable`); 0 on any failure."""
    try:
        if info is not None:
            return len(info.gpus) if info.cuda_available else 0
        if not _src._cuda_usable(allow_cuda_init=False):
            return 0
        import torch

        return int(torch.cuda.device_count())
    except Exception:
        return 0


def choose_backend(nprocs: int = 1, info: NodeInfo | None = None) -> str:
    """The course's one backend rule: ``"nccl"`` when this torch has NCCL and there is a usable CUDA
    GPU for each of ``nprocs`` processes on this machine, else ``"gloo"``.

    NCCL needs one GPU per rank; gloo runs anywhere (CPU tensors, or GPU tensors staged through the
    CPU). With ``info`` (from :func:`describe_node`) its GPUs are counted; otherwise CUDA is checked
    without poisoning fork. The launcher, the torchrun worker, the tuning code and the notebooks all
    ask this function, so the same machine always gets the same answer.

    Args:
        nprocs: processes that will run on this machine (ranks per node), at least 1.
        info: a :class:`NodeInfo` to decide from, or None to check this machine now.

    Returns:
        ``"nccl"`` or ``"gloo"`` (one of :data:`BACKENDS`).
    """
    if isinstance(nprocs, NodeInfo):
        raise TypeError("pass the NodeInfo by keyword: choose_backend(nprocs, info=info); nprocs comes first")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be a whole number of processes such as 2, not {nprocs!r}")
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1 (processes per machine), not {nprocs}")
    _check_info(info)
    gpus = _usable_gpu_count(info)
    return "nccl" if gpus >= nprocs and _nccl_available() else "gloo"


def recommended_device(info: NodeInfo | None = None) -> torch.device:
    """``torch.device("cuda")`` when torch can use CUDA, else ``torch.device("cpu")``.

    The check is the same fork-safe one as in :func:`choose_backend`; with ``info`` its
    ``cuda_available`` decides.
    """
    _check_info(info)
    import torch

    try:
        cuda = info.cuda_available if info is not None else _src._cuda_usable(allow_cuda_init=False)
    except Exception:
        cuda = False
    return torch.device("cuda" if cuda else "cpu")
