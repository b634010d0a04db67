"""Used by notebooks 03a and 03b. ``nn.DataParallel`` over virtual devices, a parallel loss, and
:func:`backend`, which picks real GPUs or virtual devices for the notebook.

==================================  =====================================================================
PyTorch / PyTorch-Encoding          here
==================================  =====================================================================
``nn.DataParallel``                 :class:`VirtualDataParallel`
``DataParallelModel`` (no gather)   :class:`VirtualDataParallelModel`; on real GPUs :class:`DataParallelModel`
``DataParallelCriterion``           :class:`DataParallelCriterion` (loss on each replica, scalars gathered)
==================================  =====================================================================

:class:`Backend` puts real GPUs and virtual devices behind one interface: with two or more CUDA GPUs
:func:`backend` returns the real ``torch.nn.parallel`` and ``nn.DataParallel``; with none or one GPU the
virtual ones of this package (``DataParallel`` needs at least two devices to split anything). This is a
choice of *devices* within one process, not a ``torch.distributed`` backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import whole
from ..memory import MemoryTracker, virtual_device
from . import comm
from .devices import Device, _device_list, _is_virtual, device_name, to_device, virtual_device_of

__all__ = [
    "Backend",
    "DataParallelCriterion",
    "DataParallelModel",
    "VirtualDataParallel",
    "VirtualDataParallelModel",
    "backend",
]


def _ids_and_output(device_ids: Any, output_device: Any, dim: Any) -> tuple[list[str], str, int]:
    """Checked ``device_ids`` (default ``[0, 1]``), ``output_device`` (default the first) and ``dim``."""
    ids = _device_list([0, 1] if device_ids is None else device_ids, "device_ids")
    out = ids[0] if output_device is None else device_name(output_device)
    if out not in ids:
        raise ValueError(f"output_device {out!r} is not one of device_ids {ids}: pick one of them")
    return ids, out, comm._check_dim(dim)


class VirtualDataParallel(nn.Module):
    """``nn.DataParallel`` over virtual devices: same constructor, same four steps, same results.

    ``forward`` scatters the inputs on ``dim`` over ``device_ids``, replicates the module onto the
    devices that got a chunk, runs the replicas in threads and gathers their outputs on ``dim`` onto
    ``output_device`` (default ``device_ids[0]``). The wrapped module stays in ``.module``; its
    parameters are the only trainable ones (the replicas are made anew in every forward pass).

    Args:
        module: the model to parallelise.
        device_ids: distinct devices, as ints (``0`` -> ``"vcuda:0"``) or names; default ``[0, 1]``.
        output_device: where outputs are gathered, one of ``device_ids``; default ``device_ids[0]``.
        dim: the batch dimension of inputs *and* outputs (``1`` for batch-second RNN input).
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[Device] | None = None,
        output_device: Device | None = None,
        dim: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module to parallelise, not {type(module).__name__}")
        self.module = module
        self.device_ids, self.output_device, self.dim = _ids_and_output(device_ids, output_device, dim)
        self.src_device = self.device_ids[0]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Scatter → replicate → parallel_apply → gather (see the class docstring)."""
        for t in chain(self.module.parameters(), self.module.buffers()):
            where = virtual_device_of(t)
            if where is not None and where != self.src_device:
                raise RuntimeError(
                    f"module must have its parameters and buffers on device {self.src_device} "
                    f"(device_ids[0]) but found one on {where}: register them with the tracker inside "
                    f"virtual_device({self.src_device!r})"
                )
        scattered, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        if not scattered and not module_kwargs:
            scattered, module_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            with virtual_device(self.device_ids[0]):
                return self.module(*scattered[0], **module_kwargs[0])
        replicas = self.replicate(self.module, self.device_ids[: len(scattered)])
        outputs = self.parallel_apply(replicas, scattered, module_kwargs)
        return self.gather(outputs, self.output_device)

    def replicate(self, module: nn.Module, device_ids: Sequence[Device]) -> list[nn.Module]:
        """Copies of ``module`` on ``device_ids`` (detached when gradients are off)."""
        return comm.replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(
        self, inputs: tuple[Any, ...], kwargs: dict[str, Any] | None, device_ids: Sequence[Device]
    ) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
        """Chunks of the inputs on ``self.dim``, one set per device."""
        return comm.scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any) -> list[Any]:
        """Run the replicas in threads, each on its device."""
        return comm.parallel_apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])

    def gather(self, outputs: Sequence[Any], output_device: Device) -> Any:
        """Concatenate the outputs on ``self.dim`` onto ``output_device``."""
        return comm.gather(outputs, output_device, dim=self.dim)


class VirtualDataParallelModel(VirtualDataParallel):
    """:class:`VirtualDataParallel` that does *not* gather: it returns one output per device.

    Pair it with :class:`DataParallelCriterion`, which computes the loss where each output already is
    (the ``DataParallelModel`` of PyTorch-Encoding that the lecture notes use, on virtual devices).
    """

    def gather(self, outputs: Sequence[Any], output_device: Device) -> list[Any]:
        """Return the replicas' outputs as they are, each on its own device."""
        return list(outputs)


class DataParallelModel(nn.DataParallel):
    """Real ``nn.DataParallel`` that does not gather: one output per GPU (see DataParallelCriterion)."""

    def gather(self, outputs: Sequence[Any], output_device: Any) -> list[Any]:  # type: ignore[override]
        """Return the replicas' outputs as they are, each on its own GPU."""
        return list(outputs)


class DataParallelCriterion(nn.Module):
    """Compute a loss on every device and gather only the scalars: no full-size output on one device.

    Call it with the list of per-device outputs from :class:`VirtualDataParallelModel` (or
    :class:`DataParallelModel` on real GPUs) and the full targets: the targets are scattered with the
    same chunking, ``criterion`` runs on each device in threads, and only one number per device crosses
    to ``output_device``. With ``reduction="mean"`` the per-device losses are weighted by their chunk's
    share of the batch, which equals the full-batch mean for per-sample losses (PyTorch-Encoding's
    original averages them unweighted: equal only when all chunks are equal). ``"sum"`` adds them.

    On real GPUs (outputs on two or more CUDA devices) it uses ``torch.nn.parallel``'s real scatter,
    parallel_apply and gather; otherwise this package's virtual ones.

    Args:
        criterion: a loss, e.g. ``nn.CrossEntropyLoss()`` (an instance, default reduction ``"mean"``) or
            a function such as ``F.cross_entropy``.
        device_ids: the distinct devices of the outputs, in order (as for the model); default ``[0, 1]``.
        output_device: where the scalars are gathered, one of ``device_ids``; default ``device_ids[0]``.
        dim: the batch dimension of outputs and targets.
        reduction: ``"mean"`` (weighted by chunk size) or ``"sum"``.
    """

    def __init__(
        self,
        criterion: Callable[..., Tensor],
        device_ids: Sequence[Device] | None = None,
        output_device: Device | None = None,
        dim: int = 0,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        if isinstance(criterion, type):
            raise TypeError(f"pass a loss instance such as {criterion.__name__}(), not the class itself")
        if not callable(criterion):
            raise TypeError(
                f"criterion must be a loss module or function such as nn.CrossEntropyLoss(), "
                f"not {type(criterion).__name__}"
            )
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', not {reduction!r}")
        self.criterion = criterion
        self.device_ids, self.output_device, self.dim = _ids_and_output(device_ids, output_device, dim)
        self.reduction = reduction

    def forward(self, outputs: Sequence[Tensor], *targets: Tensor) -> Tensor:
        """The loss of the whole batch, from per-device ``outputs`` and full-batch ``targets``."""
        if isinstance(outputs, Tensor):
            raise TypeError(
                "DataParallelCriterion needs one output per device (a list); this output was already "
                "gathered. Wrap the model in VirtualDataParallelModel (or DataParallelModel on GPUs)."
            )
        if not isinstance(outputs, list | tuple) or not outputs:
            raise ValueError("outputs must be a non-empty list with one output tensor per device")
        if not all(isinstance(o, Tensor) for o in outputs):
            raise TypeError("every per-device output must be a tensor")
        if len(outputs) > len(self.device_ids):
            raise ValueError(
                f"{len(outputs)} outputs but only {len(self.device_ids)} device_ids: "
                "give the criterion the same device_ids as the model"
            )
        sizes = [o.size(self.dim) for o in outputs]
        total = sum(sizes)
        real = all(o.is_cuda for o in outputs) and len({o.device for o in outputs}) == len(outputs) > 1
        if real:
            from torch.nn.parallel import gather as gather_fn
            from torch.nn.parallel import parallel_apply as apply_fn
            from torch.nn.parallel import scatter as scatter_fn

            devices: list[Any] = [o.device.index for o in outputs]
            out_dev: Any = torch.device(self.output_device.replace("vcuda", "cuda"))  # index i -> cuda:i
        else:
            scatter_fn, apply_fn, gather_fn = comm._scatter, comm.parallel_apply, comm.gather
            devices = self.device_ids[: len(outputs)]
            out_dev = self.output_device
        # the targets get the same chunks as the outputs (torch.chunk of the same length on the same dim)
        scattered = scatter_fn(targets, devices, self.dim)
        if len(scattered) != len(outputs):
            raise ValueError(
                f"{len(outputs)} outputs but the targets split into {len(scattered)} chunks: "
                "pass targets with the same batch size as the outputs"
            )
        weights = [n / total if self.reduction == "mean" else 1.0 for n in sizes]

        def replica_loss(out: Tensor, *tgt: Tensor, weight: float) -> Tensor:
            return (self.criterion(out, *tgt) * weight).reshape(1)  # a 1-element vector, gathered below

        inputs = [(o, *t) for o, t in zip(outputs, scattered, strict=True)]
        kwargs = [{"weight": w} for w in weights]
        losses = apply_fn([replica_loss] * len(outputs), inputs, kwargs, devices)
        return gather_fn(losses, out_dev, 0).sum()


# ---------------------------------------------------------------------------------- real or virtual
class Backend:
    """Real GPUs or virtual devices behind one interface, so a notebook's code is the same on both.

    ``parallel`` is ``torch.nn.parallel`` or :mod:`mgpu_helpers.data_parallel.comm` (both have
    ``replicate``, ``scatter``, ``parallel_apply``, ``gather``); ``DataParallel`` / ``DataParallelModel``
    the matching wrappers. Build it with :func:`backend`.

    Args:
        real: use the real ``torch.nn.parallel`` (needs ``gpus >= 2``).
        gpus: the number of CUDA GPUs (informational for virtual devices).
    """

    def __init__(self, real: bool, gpus: int) -> None:
        if not isinstance(real, bool):
            raise TypeError(f"real must be True or False, not {real!r}")
        whole("gpus", gpus, 0)
        if real and gpus < 2:
            raise ValueError(
                f"real DataParallel needs at least 2 GPUs, not {gpus}: use Backend(False, {gpus}) "
                "(virtual devices) or backend(), which chooses"
            )
        self.real, self.gpus = real, gpus
        self.last_breakdown: dict[str, dict[str, int]] | None = None
        if real:
            self.parallel: Any = torch.nn.parallel
            self.DataParallel: Any = nn.DataParallel
            self.DataParallelModel: Any = DataParallelModel
        else:
            self.parallel = comm
            self.DataParallel = VirtualDataParallel
            self.DataParallelModel = VirtualDataParallelModel

    def __repr__(self) -> str:
        return f"Backend(real={self.real}, gpus={self.gpus})"

    @property
    def kind(self) -> str:
        """``"real GPUs"`` or ``"virtual devices"``."""
        return "real GPUs" if self.real else "virtual devices"

    def device(self, index: int) -> torch.device | str:
        """``cuda:index`` (real) or ``vcuda:index`` (virtual)."""
        whole("index", index, 0)
        if self.real:
            if index >= self.gpus:
                raise ValueError(
                    f"device index {index} but this machine has {self.gpus} GPUs: use 0..{self.gpus - 1}"
                )
            return torch.device("cuda", index)
        return device_name(index)

    def to(self, tensor: Tensor, index: int) -> Tensor:
        """Move ``tensor`` to device ``index`` (a copy, unless it is already there)."""
        if not isinstance(tensor, Tensor):
            raise TypeError(f"Backend.to moves a torch.Tensor, not {type(tensor).__name__}")
        return tensor.to(self.device(index)) if self.real else to_device(tensor, self.device(index))

    def where(self, tensor: Tensor) -> str:
        """The device ``tensor`` lives on (virtual: as an active tracker counts it; ``"?"`` if none)."""
        if not isinstance(tensor, Tensor):
            raise TypeError(f"Backend.where needs a torch.Tensor, not {type(tensor).__name__}")
        if self.real:
            return str(tensor.device)
        return virtual_device_of(tensor) or "?"

    def home(self, index: int = 0) -> Any:
        """Context in which a model moved or a tracker created counts as living on device ``index``.

        Real: ``nullcontext`` (move the model with ``.to(backend.device(0))``). Virtual:
        ``virtual_device("vcuda:index")``.
        """
        device = self.device(index)
        return contextlib.nullcontext() if self.real else virtual_device(str(device))

    def step_peaks(
        self, step: Callable[[], Any], model: nn.Module, n_devices: int
    ) -> tuple[dict[str, int], Any]:
        """Run ``step()`` once; return each device's peak bytes during it, and what ``step`` returned.

        Real: ``torch.cuda.max_memory_allocated(i)`` minus what was allocated before the step, plus the
        model's parameters on GPU 0 (*measured*). A first, unmeasured ``step()`` comes before (then the
        gradients are dropped): it makes each GPU allocate its one-time cuBLAS workspace (8–32 MiB),
        which would otherwise land in the measured peak of whichever configuration runs first.
        Virtual: a :class:`MemoryTracker` registered on
        ``vcuda:0`` (*simulated*); :attr:`last_breakdown` then holds the tracker's
        ``peak_breakdown_by_device`` (bytes per category when each device peaked).
        """
        if not callable(step):
            raise TypeError(f"step must be a function with no arguments, not {type(step).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be the nn.Module being trained, not {type(model).__name__}")
        whole("n_devices", n_devices, 1)
        self.last_breakdown = None
        if self.real:
            if n_devices > self.gpus:
                raise ValueError(f"n_devices={n_devices} but this machine has {self.gpus} GPUs")
            step()  # warm-up: one-time allocations (cuBLAS workspaces) happen here, unmeasured
            model.zero_grad(set_to_none=True)
            before = []
            for i in range(n_devices):
                torch.cuda.synchronize(i)
                torch.cuda.reset_peak_memory_stats(i)
                before.append(torch.cuda.memory_allocated(i))
            value = step()
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            peaks = {}
            for i in range(n_devices):
                torch.cuda.synchronize(i)
                peaks[f"cuda:{i}"] = (
                    torch.cuda.max_memory_allocated(i) - before[i] + (weights if i == 0 else 0)
                )
            return peaks, value
        with self.home(0):
            tracker = MemoryTracker(model)
        try:
            with tracker:
                value = step()
        finally:
            tracker.close()
        breakdown = tracker.peak_breakdown_by_device
        self.last_breakdown = {d: v for d, v in breakdown.items() if _is_virtual(d)}
        return {d: sum(v.values()) for d, v in self.last_breakdown.items()}, value


def backend(min_gpus: int = 2) -> Backend:
    """Real ``torch.nn.parallel`` with at least ``min_gpus`` (>= 2) CUDA GPUs visible, else virtual devices.

    0 or 1 GPU: virtual devices (a single GPU cannot show a split). 2 or more: the real thing, unless
    ``min_gpus`` asks for more (e.g. ``backend(min_gpus=4)`` for a four-device demo).
    """
    whole("min_gpus", min_gpus, 2, hint=": DataParallel needs at least 2 devices to split a batch")
    n = torch.cuda.device_count()
    return Backend(n >= min_gpus, n)
