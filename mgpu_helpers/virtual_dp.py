"""``nn.DataParallel`` rebuilt over *virtual devices*, so that every step runs on a CPU.

PyTorch's ``nn.DataParallel`` does four things per forward pass — **replicate** the module onto every
device, **scatter** the batch into chunks, **parallel_apply** the replicas in threads, **gather** the
outputs onto one device — using ``torch.nn.parallel``'s functions of the same names. Those refuse CPU
tensors, and on a CPU ``nn.DataParallel`` simply calls the module, so without two GPUs none of it can be
watched. This module rebuilds the four functions with the same names, signatures and autograd
behaviour, over *virtual devices*: names such as ``"vcuda:0"`` that exist only for memory accounting
(:func:`mgpu_helpers.memory.virtual_device`). The arithmetic is the real thing — real threads, real
chunks, real copies — so outputs and gradients equal those of the unsplit model and of
``nn.DataParallel``; only *where* a byte lives is simulated.

==============================  ========================================================================
``torch.nn.parallel``           here (virtual devices)
==============================  ========================================================================
``replicate(module, devices)``  :func:`replicate` — copies parameters in a differentiable way; their
                                gradients are summed back onto the source device (``Broadcast``)
``scatter(inputs, devices)``    :func:`scatter` — ``torch.chunk`` on ``dim``; a chunk already on its
                                target device is a view, others are copies
``parallel_apply(...)``         :func:`parallel_apply` — one thread per replica, each inside
                                ``virtual_device(name)``
``gather(outputs, device)``     :func:`gather` — ``torch.cat`` on ``dim`` onto the output device
``nn.DataParallel``             :class:`VirtualDataParallel`
(PyTorch-Encoding's)            :class:`VirtualDataParallelModel` (no gather) and
``DataParallelModel/Criterion`` :class:`DataParallelCriterion` (loss on each replica, scalars gathered)
==============================  ========================================================================

Devices are given as ints (``0`` means ``"vcuda:0"``), as names (``"vcuda:1"``) or as real devices
(``"cpu"``). A tensor's virtual device is what an active :class:`~mgpu_helpers.memory.MemoryTracker`
recorded for its storage; with no tracker active nothing is recorded: the weights are then taken to
be on ``device_ids[0]`` (as ``nn.DataParallel`` requires) and every scattered chunk is copied, which
changes no value. :func:`device_peaks` reads a tracker's log per device and category, for bar charts;
:class:`Backend` puts real GPUs and virtual devices behind one interface for notebooks.

Private API used on purpose: ``Module._replicate_for_data_parallel`` (a shallow module copy without
parameters, what ``torch.nn.parallel.replicate`` uses). Replica weights are counted as *parameters*
through :meth:`MemoryTracker.classify`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd import Function

from .memory import MemoryTracker, active_trackers, current_virtual_device, virtual_device

__all__ = [
    "VIRTUAL_PREFIX",
    "Backend",
    "DataParallelCriterion",
    "DataParallelModel",
    "PhaseTimer",
    "VirtualDataParallel",
    "VirtualDataParallelModel",
    "backend",
    "chunk_sizes",
    "current_device",
    "device_name",
    "device_peaks",
    "draw_data_parallel_flow",
    "gather",
    "parallel_apply",
    "plot_peak_comparison",
    "plot_phases",
    "replicate",
    "scatter",
    "scatter_kwargs",
    "to_device",
    "virtual_device_of",
]

#: Virtual devices are named ``f"{VIRTUAL_PREFIX}:{index}"``: ``vcuda:0``, ``vcuda:1``, …
VIRTUAL_PREFIX = "vcuda"

Device = int | str | torch.device


# ---------------------------------------------------------------------------------------------- devices
def device_name(device: Device) -> str:
    """The name a device is accounted under: ``0 -> "vcuda:0"``; strings and torch devices as ``str()``."""
    if isinstance(device, bool):
        raise TypeError("a device is an int index, a name such as 'vcuda:1', or a torch.device; got a bool")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index must be >= 0, got {device}")
        return f"{VIRTUAL_PREFIX}:{device}"
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, str) and device:
        return device
    raise TypeError(
        f"cannot read {device!r} as a device: use an int, a name like 'vcuda:1', or a torch.device"
    )


def _is_virtual(name: str) -> bool:
    return name.startswith(VIRTUAL_PREFIX + ":")


def current_device() -> str | None:
    """The virtual device this thread is working on (inside ``virtual_device(name)``), else ``None``."""
    return current_virtual_device()


def virtual_device_of(tensor: Tensor) -> str | None:
    """The device an active :class:`MemoryTracker` counts ``tensor``'s storage under, or ``None``.

    ``None`` means no active tracker knows the storage (for example, no tracker is running). Views share
    their base's storage and so its device.
    """
    for tracker in active_trackers():
        device = tracker.device_of(tensor)
        if device is not None:
            return device
    return None


def _label(tensor: Tensor, category: str) -> None:
    """Count ``tensor`` under ``category`` in every active tracker (replica weights are parameters too)."""
    for tracker in active_trackers():
        tracker.classify(tensor, category)


def _copy_to(tensor: Tensor, name: str | None) -> Tensor:
    """A contiguous copy of ``tensor`` allocated on (virtual) device ``name``."""
    if name is None:
        return tensor.clone(memory_format=torch.contiguous_format)
    with virtual_device(name):
        return tensor.clone(memory_format=torch.contiguous_format)


def _move(tensor: Tensor, source: str | None, target: str | None) -> Tensor:
    """``tensor.to(target)`` across virtual devices: the tensor itself when already there, else a copy."""
    if source is not None and source == target:
        return tensor
    return _copy_to(tensor, target)


def to_device(tensor: Tensor, device: Device) -> Tensor:
    """``tensor.to(device)`` for real devices; for a virtual device, a copy allocated there.

    Use it as the virtual ``x.cuda()``: ``x = to_device(x, "vcuda:0")``. Like ``.to()``, it returns
    ``tensor`` itself when it already lives on that device.
    """
    name = device_name(device)
    if not _is_virtual(name):
        return tensor.to(name)
    return _move(tensor, virtual_device_of(tensor), name)


def chunk_sizes(length: int, n_devices: int) -> list[int]:
    """Sizes of ``torch.chunk(tensor_of_that_length, n_devices)``, i.e. of what scatter hands out.

    Every chunk has ``ceil(length / n_devices)`` items except the last, so fewer than ``n_devices``
    chunks can come out: ``chunk_sizes(30, 2) == [15, 15]``, ``chunk_sizes(10, 4) == [3, 3, 3, 1]``,
    ``chunk_sizes(5, 4) == [2, 2, 1]`` (three devices get work, the fourth none).
    """
    if n_devices < 1:
        raise ValueError(f"need at least one device, got {n_devices}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if length == 0:
        return [0]
    step = -(-length // n_devices)
    return [min(step, length - start) for start in range(0, length, step)]


# ------------------------------------------------------------------------------------- autograd pieces
class _Broadcast(Function):
    """Copies of parameters on every device; backward sums their gradients onto the source (reduce-add)."""

    @staticmethod
    def forward(ctx: Any, source: str | None, devices: list[str], *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.source, ctx.devices, ctx.n = source, devices, len(tensors)
        out: list[Tensor] = []
        for name in devices:
            # the source device's replica shares the original storage, as in torch's broadcast_coalesced
            out.extend(t.view_as(t) if name == source else _copy_to(t, name) for t in tensors)
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        per_device = [grads[i : i + ctx.n] for i in range(0, len(grads), ctx.n)]
        summed: list[Tensor] = []
        with virtual_device(ctx.source) if ctx.source else contextlib.nullcontext():
            for k in range(ctx.n):
                total = torch.zeros_like(per_device[0][k])
                for name, device_grads in zip(ctx.devices, per_device, strict=True):
                    g = device_grads[k]
                    total.add_(g if name == ctx.source else g.clone())  # a copy onto the source, then add
                summed.append(total)
        return (None, None, *summed)


class _Scatter(Function):
    """Chunks of one tensor on several devices; backward concatenates their gradients on the source."""

    @staticmethod
    def forward(
        ctx: Any, devices: list[str], sizes: list[int] | None, dim: int, source: str | None, x: Tensor
    ) -> tuple[Tensor, ...]:
        ctx.dim, ctx.source = dim, source
        chunks = x.split(sizes, dim) if sizes is not None else x.chunk(len(devices), dim)
        return tuple(_move(c, source, name) for c, name in zip(chunks, devices, strict=False))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        with virtual_device(ctx.source) if ctx.source else contextlib.nullcontext():
            return (None, None, None, None, torch.cat(grads, ctx.dim))


class _Gather(Function):
    """One tensor on ``target`` concatenated from several devices; backward scatters the gradient back."""

    @staticmethod
    def forward(ctx: Any, target: str, dim: int, *inputs: Tensor) -> Tensor:
        ctx.target, ctx.dim = target, dim
        ctx.sources = [virtual_device_of(t) for t in inputs]
        ctx.scalars = all(t.dim() == 0 for t in inputs) and dim == 0
        if ctx.scalars:  # torch's Gather also turns scalars into a vector (and warns)
            inputs = tuple(t.view(1) for t in inputs)
        ctx.sizes = [t.size(dim) for t in inputs]
        with virtual_device(target):
            return torch.cat(inputs, dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        pieces = [
            _move(g, ctx.target, source)
            for g, source in zip(grad.split(ctx.sizes, ctx.dim), ctx.sources, strict=True)
        ]
        if ctx.scalars:
            pieces = [p[0] for p in pieces]
        return (None, None, *pieces)


# ------------------------------------------------------------------------------ the four functions
def replicate(network: nn.Module, devices: Sequence[Device], detach: bool = False) -> list[nn.Module]:
    """One copy of ``network`` per device, like ``torch.nn.parallel.replicate``.

    Each replica is a shallow copy of every submodule whose parameters are *copies allocated on its
    device*; the replica on the parameters' own device (``devices[0]`` unless a tracker says otherwise)
    shares their storage. Unless ``detach``, the copies are differentiable: ``backward`` through any
    replica sums the gradients into the original parameters' ``.grad``, on the source device. Buffers
    are copied without gradients (replica 0 shares the originals, so e.g. BatchNorm statistics updated
    by replica 0 persist, as in PyTorch). Each tensor is copied on its own; PyTorch first packs small
    tensors into buffers of up to 10 MB, which changes the number of copies, not the bytes per device.
    """
    names = [device_name(d) for d in devices]
    if not names:
        return []
    params = list(network.parameters())
    buffers = list(network.buffers())
    # where the weights live, as a tracker counts them; unknown (no tracker): on devices[0], which is
    # where nn.DataParallel requires them to be
    source = next((virtual_device_of(t) for t in chain(params, buffers)), None) or names[0]

    grad_params = [p for p in params if p.requires_grad and not detach]
    copies: dict[int, list[Tensor]] = {}
    if grad_params:
        flat = _Broadcast.apply(source, names, *grad_params)
        for k, p in enumerate(grad_params):
            copies[id(p)] = [flat[j * len(grad_params) + k] for j in range(len(names))]
    for t in chain((p for p in params if id(p) not in copies), buffers):
        with torch.no_grad():
            copies[id(t)] = [_move(t.detach(), source, name) for name in names]

    for p in params:  # a replica's weights are parameters on its device (buffers stay "other")
        for t in copies[id(p)]:
            _label(t, "parameters")

    modules = list(network.modules())
    index = {id(m): i for i, m in enumerate(modules)}
    replicas = [[m._replicate_for_data_parallel() for m in modules] for _ in names]
    for j, copy_of in enumerate(replicas):
        for i, module in enumerate(modules):
            replica = copy_of[i]
            for key, child in module._modules.items():
                replica._modules[key] = None if child is None else copy_of[index[id(child)]]
            for key, param in module._parameters.items():
                # replica parameters are not leaves: plain attributes, as in torch's replicate
                setattr(replica, key, None if param is None else copies[id(param)][j])
            for key, buf in module._buffers.items():
                replica._buffers[key] = None if buf is None else copies[id(buf)][j]
    return [copy_of[0] for copy_of in replicas]


def scatter(inputs: Any, target_gpus: Sequence[Device], dim: int = 0) -> Any:
    """Split tensors (also inside tuples, lists, dicts) into chunks along ``dim``, one per device.

    Like ``torch.nn.parallel.scatter``: chunk sizes are those of ``torch.chunk`` (see
    :func:`chunk_sizes`), so fewer chunks than devices can come back; non-tensors are repeated for every
    device; a single tensor gives a tuple, anything else a list. Differentiable: the chunks' gradients
    are concatenated back on the input's device.
    """
    names = [device_name(d) for d in target_gpus]

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, Tensor):
            return _Scatter.apply(names, None, dim, virtual_device_of(obj), obj)
        if isinstance(obj, tuple) and hasattr(obj, "_fields") and len(obj) > 0:  # namedtuple
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj), strict=False))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()), strict=False)]
        return [obj for _ in names]

    return scatter_map(inputs)


def scatter_kwargs(
    inputs: tuple[Any, ...], kwargs: dict[str, Any] | None, target_gpus: Sequence[Device], dim: int = 0
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword arguments together, as ``torch.nn.parallel.scatter_kwargs``."""
    scattered_inputs = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(scattered_inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def _first_tensor(obj: Any) -> Tensor | None:
    if isinstance(obj, Tensor):
        return obj
    if isinstance(obj, list | tuple):
        return next((t for t in map(_first_tensor, obj) if t is not None), None)
    if isinstance(obj, dict):
        return next((t for t in map(_first_tensor, obj.values()) if t is not None), None)
    return None


def parallel_apply(
    modules: Sequence[Callable[..., Any]],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]] | None = None,
    devices: Sequence[Device | None] | None = None,
    *,
    timings: list[dict[str, Any]] | None = None,
) -> list[Any]:
    """Run ``modules[i](*inputs[i], **kwargs_tup[i])`` for every ``i``, each in its own thread.

    Like ``torch.nn.parallel.parallel_apply``: one Python thread per replica (a single replica runs in
    the calling thread), the caller's grad mode carried into the threads, outputs in replica order, and
    an error in any replica raised in the caller with the replica and device named. Each thread works
    inside ``virtual_device(devices[i])``; without ``devices``, the device of the first tensor in the
    replica's input (if a tracker knows it). An input that is not a list or tuple is the only argument.

    ``timings``, if given, receives one dict per replica: ``replica``, ``device``, ``thread``, ``start``,
    ``end`` (``time.perf_counter`` seconds), for timelines (see :class:`PhaseTimer`, :func:`plot_phases`).
    """
    if len(modules) != len(inputs):
        raise ValueError(f"{len(modules)} modules but {len(inputs)} inputs: give one input per replica")
    kwargs_tup = list(kwargs_tup) if kwargs_tup is not None else [{} for _ in modules]
    if len(kwargs_tup) != len(modules):
        raise ValueError(f"{len(modules)} modules but {len(kwargs_tup)} kwargs dicts")
    if devices is None:
        found = [_first_tensor(x) for x in inputs]
        names: list[str | None] = [None if t is None else virtual_device_of(t) for t in found]
    else:
        if len(devices) != len(modules):
            raise ValueError(f"{len(modules)} modules but {len(devices)} devices")
        names = [None if d is None else device_name(d) for d in devices]
    grad_enabled = torch.is_grad_enabled()
    results: dict[int, Any] = {}
    lock = threading.Lock()

    def worker(i: int, module: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> None:
        torch.set_grad_enabled(grad_enabled)
        if not isinstance(args, list | tuple):
            args = (args,)
        start = time.perf_counter()
        try:
            with virtual_device(names[i]) if names[i] else contextlib.nullcontext():
                out: Any = module(*args, **kwargs)
        except BaseException as exc:  # handed to the caller, which raises it
            out = exc
        end = time.perf_counter()
        with lock:
            results[i] = out
            if timings is not None:
                timings.append(
                    {"replica": i, "device": names[i], "thread": threading.current_thread().name,
                     "start": start, "end": end}
                )  # fmt: skip

    jobs = list(zip(modules, inputs, kwargs_tup, strict=True))
    if len(jobs) > 1:
        threads = [
            threading.Thread(target=worker, args=(i, *job), name=f"replica-{i}") for i, job in enumerate(jobs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif jobs:
        worker(0, *jobs[0])

    outputs = []
    for i in range(len(jobs)):
        out = results[i]
        if isinstance(out, BaseException):
            raise RuntimeError(
                f"replica {i} on {names[i] or 'an unnamed device'} raised {type(out).__name__}: {out}"
            ) from out
        outputs.append(out)
    return outputs


def gather(outputs: Sequence[Any], target_device: Device, dim: int = 0) -> Any:
    """Concatenate the replicas' outputs on ``dim`` onto ``target_device``, like ``torch.nn.parallel.gather``.

    Works through tuples, lists, dicts and namedtuples of tensors; ``None`` stays ``None``. Scalars
    gathered on ``dim=0`` become a vector with one entry per replica (PyTorch also warns there). The
    result is a new tensor on the target device (all of it counts there); its gradient is split and
    sent back to the replicas' devices.
    """
    target = device_name(target_device)

    def gather_map(items: Sequence[Any]) -> Any:
        out = items[0]
        if isinstance(out, Tensor):
            return _Gather.apply(target, dim, *items)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in items):
                raise ValueError("all replicas must return dicts with the same keys")
            return type(out)((k, gather_map([d[k] for d in items])) for k in out)
        if isinstance(out, tuple) and hasattr(out, "_fields"):
            return type(out)._make(map(gather_map, zip(*items, strict=True)))
        return type(out)(map(gather_map, zip(*items, strict=True)))

    return gather_map(outputs)


# ------------------------------------------------------------------------------------- the modules
class VirtualDataParallel(nn.Module):
    """``nn.DataParallel`` over virtual devices: same constructor, same four steps, same results.

    ``forward`` scatters the inputs on ``dim`` over ``device_ids``, replicates the module onto the
    devices that got a chunk, runs the replicas in threads and gathers their outputs on ``dim`` onto
    ``output_device`` (default ``device_ids[0]``). The wrapped module stays in ``.module``; its
    parameters are the only trainable ones (the replicas are made anew in every forward pass).

    Args:
        module: the model to parallelise.
        device_ids: devices, as ints (``0`` -> ``"vcuda:0"``) or names; default ``[0, 1]``.
        output_device: where outputs are gathered; default ``device_ids[0]``.
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
        ids = [0, 1] if device_ids is None else list(device_ids)
        if not ids:
            raise ValueError("device_ids is empty: give at least one device, e.g. [0, 1]")
        self.module = module
        self.device_ids = [device_name(d) for d in ids]
        if len(set(self.device_ids)) != len(self.device_ids):
            raise ValueError(f"device_ids must be distinct, got {self.device_ids}")
        self.output_device = device_name(output_device) if output_device is not None else self.device_ids[0]
        self.src_device = self.device_ids[0]
        self.dim = dim

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
        return replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(
        self, inputs: tuple[Any, ...], kwargs: dict[str, Any] | None, device_ids: Sequence[Device]
    ) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
        """Chunks of the inputs on ``self.dim``, one set per device."""
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any) -> list[Any]:
        """Run the replicas in threads, each on its device."""
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])

    def gather(self, outputs: Sequence[Any], output_device: Device) -> Any:
        """Concatenate the outputs on ``self.dim`` onto ``output_device``."""
        return gather(outputs, output_device, dim=self.dim)


class VirtualDataParallelModel(VirtualDataParallel):
    """:class:`VirtualDataParallel` that does *not* gather: it returns one output per device.

    Pair it with :class:`DataParallelCriterion`, which computes the loss where each output already is
    (the ``DataParallelModel`` of PyTorch-Encoding that the lecture notes use, on virtual devices).
    """

    def gather(self, outputs: Sequence[Any], output_device: Device) -> list[Any]:
        """Return the replicas' outputs as they are, each on its own device."""
        return list(outputs)


class DataParallelCriterion(nn.Module):
    """Compute a loss on every device and gather only the scalars: no full-size output on one device.

    Call it with the list of per-device outputs from :class:`VirtualDataParallelModel` (or a
    ``DataParallel`` subclass that skips the gather) and the full targets: the targets are scattered
    with the same chunking, ``criterion`` runs on each device in threads, and only one number per device
    crosses to ``output_device``. With ``reduction="mean"`` the per-device losses are weighted by their
    chunk's share of the batch, which equals the full-batch mean for per-sample losses (PyTorch-Encoding's
    original averages them unweighted: equal only when all chunks are equal). ``"sum"`` adds them.

    On real GPUs (outputs on two or more CUDA devices) it uses ``torch.nn.parallel``'s real scatter,
    parallel_apply and gather; otherwise this module's virtual ones.

    Args:
        criterion: a loss module, e.g. ``nn.CrossEntropyLoss()`` (default reduction ``"mean"``).
        device_ids: the devices of the outputs, in order (as for the model).
        output_device: where the scalars are gathered; default ``device_ids[0]``.
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
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.criterion = criterion
        self.device_ids = list(device_ids) if device_ids is not None else [0, 1]
        self.output_device = output_device if output_device is not None else self.device_ids[0]
        self.dim, self.reduction = dim, reduction

    def forward(self, outputs: Sequence[Tensor], *targets: Tensor) -> Tensor:
        """The loss of the whole batch, from per-device ``outputs`` and full-batch ``targets``."""
        if isinstance(outputs, Tensor):
            raise TypeError(
                "DataParallelCriterion needs one output per device (a list); this output was already "
                "gathered. Wrap the model in VirtualDataParallelModel (or a DataParallel that skips gather)."
            )
        sizes = [o.size(self.dim) for o in outputs]
        total = sum(sizes)
        real = all(o.is_cuda for o in outputs) and len({o.device for o in outputs}) == len(outputs) > 1
        if real:
            from torch.nn.parallel import gather as gather_fn
            from torch.nn.parallel import parallel_apply as apply_fn
            from torch.nn.parallel import scatter as scatter_fn

            devices: list[Any] = [o.device.index for o in outputs]
            out_dev: Any = self.output_device
            if isinstance(out_dev, str):
                out_dev = torch.device(out_dev)
        else:
            scatter_fn, apply_fn, gather_fn = scatter, parallel_apply, gather
            devices = [device_name(d) for d in self.device_ids[: len(outputs)]]
            out_dev = device_name(self.output_device)
        # the targets get the same chunks as the outputs (torch.chunk of the same length on the same dim)
        scattered = scatter_fn(targets, devices, self.dim)
        if len(scattered) != len(outputs):
            raise ValueError(f"{len(outputs)} outputs but the targets split into {len(scattered)} chunks")
        weights = [n / total if self.reduction == "mean" else 1.0 for n in sizes]

        def replica_loss(out: Tensor, *tgt: Tensor, weight: float) -> Tensor:
            return (self.criterion(out, *tgt) * weight).reshape(1)  # a 1-element vector, gathered below

        inputs = [(o, *t) for o, t in zip(outputs, scattered, strict=True)]
        kwargs = [{"weight": w} for w in weights]
        losses = apply_fn([replica_loss] * len(outputs), inputs, kwargs, devices)
        return gather_fn(losses, out_dev, 0).sum()


class DataParallelModel(nn.DataParallel):
    """Real ``nn.DataParallel`` that does not gather: one output per GPU (see DataParallelCriterion)."""

    def gather(self, outputs: Sequence[Any], output_device: Any) -> list[Any]:  # type: ignore[override]
        """Return the replicas' outputs as they are, each on its own GPU."""
        return list(outputs)


# ---------------------------------------------------------------------------------- real or virtual
class Backend:
    """Real GPUs or virtual devices behind one interface, so a notebook's code is the same on both.

    ``parallel`` is ``torch.nn.parallel`` or this module (both have ``replicate``, ``scatter``,
    ``parallel_apply``, ``gather``); ``DataParallel`` / ``DataParallelModel`` the matching wrappers.
    Build it with :func:`backend`.
    """

    def __init__(self, real: bool, gpus: int) -> None:
        self.real, self.gpus = real, gpus
        self.last_breakdown: dict[str, dict[str, int]] | None = None
        if real:
            self.parallel: Any = torch.nn.parallel
            self.DataParallel: Any = nn.DataParallel
            self.DataParallelModel: Any = DataParallelModel
        else:
            import sys

            self.parallel = sys.modules[__name__]
            self.DataParallel = VirtualDataParallel
            self.DataParallelModel = VirtualDataParallelModel

    @property
    def kind(self) -> str:
        """``"real GPUs"`` or ``"virtual devices"``."""
        return "real GPUs" if self.real else "virtual devices"

    def device(self, index: int) -> torch.device | str:
        """``cuda:index`` (real) or ``vcuda:index`` (virtual)."""
        return torch.device("cuda", index) if self.real else device_name(index)

    def to(self, tensor: Tensor, index: int) -> Tensor:
        """Move ``tensor`` to device ``index`` (a copy, unless it is already there)."""
        return tensor.to(self.device(index)) if self.real else to_device(tensor, index)

    def where(self, tensor: Tensor) -> str:
        """The device ``tensor`` lives on (virtual: as an active tracker counts it; ``"?"`` if none)."""
        if self.real:
            return str(tensor.device)
        return virtual_device_of(tensor) or "?"

    def home(self, index: int = 0) -> Any:
        """Context in which a model moved or a tracker created counts as living on device ``index``.

        Real: ``nullcontext`` (move the model with ``.to(backend.device(0))``). Virtual:
        ``virtual_device("vcuda:index")``.
        """
        return contextlib.nullcontext() if self.real else virtual_device(device_name(index))

    def step_peaks(
        self, step: Callable[[], Any], model: nn.Module, n_devices: int
    ) -> tuple[dict[str, int], Any]:
        """Run ``step()`` once; return each device's peak bytes during it, and what ``step`` returned.

        Real: ``torch.cuda.max_memory_allocated(i)`` minus what was allocated before the step, plus the
        model's parameters on GPU 0 (*measured*). Virtual: a :class:`MemoryTracker` registered on
        ``vcuda:0`` (*simulated*); :attr:`last_breakdown` then holds :func:`device_peaks`' categories.
        """
        self.last_breakdown = None
        if self.real:
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
        self.last_breakdown = {d: v for d, v in device_peaks(tracker).items() if _is_virtual(d)}
        return {d: sum(v.values()) for d, v in self.last_breakdown.items()}, value


def backend(min_gpus: int = 2) -> Backend:
    """Real ``torch.nn.parallel`` when at least ``min_gpus`` CUDA GPUs are visible, else virtual devices."""
    n = torch.cuda.device_count()
    return Backend(n >= min_gpus, n)


# -------------------------------------------------------------------------------- memory per device
def device_peaks(tracker: MemoryTracker) -> dict[str, dict[str, int]]:
    """For every device the tracker saw: bytes per category at the moment that device peaked.

    The totals equal ``tracker.peak_by_device``; the split uses every storage's final role, as the
    tracker's own peaks do. Devices come in name order. Ready for
    :func:`mgpu_helpers.plotting.plot_device_bars`.
    """
    return tracker.peak_breakdown_by_device


# ------------------------------------------------------------------------------------------ timing
class PhaseTimer:
    """Record named phases (``with timer("scatter"):``) as ``(label, lane, start, end)`` rows."""

    rows: list[tuple[str, str, float, float]]

    def __init__(self) -> None:
        self.rows = []

    def __call__(self, label: str, lane: str = "main thread") -> Any:
        timer = self

        class _Phase:
            def __enter__(self) -> None:
                self.start = time.perf_counter()

            def __exit__(self, *exc: Any) -> None:
                timer.rows.append((label, lane, self.start, time.perf_counter()))

        return _Phase()

    def add_threads(self, timings: list[dict[str, Any]], label: str = "forward") -> None:
        """Add :func:`parallel_apply`'s per-replica timings as rows, one lane per thread."""
        for t in sorted(timings, key=lambda t: t["replica"]):
            self.rows.append((label, f"{t['thread']} ({t['device']})", t["start"], t["end"]))


def plot_phases(
    rows: Sequence[tuple[str, str, float, float]], *, ax: Any = None, title: str | None = None
) -> Any:
    """A Gantt chart of ``(label, lane, start, end)`` rows (from :class:`PhaseTimer`), in milliseconds."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len({r[1] for r in rows})))
    t0 = min(r[2] for r in rows)
    lanes = list(dict.fromkeys(r[1] for r in rows))
    labels = list(dict.fromkeys(r[0] for r in rows))
    colors = plt.get_cmap("tab10")
    for label, lane, start, end in rows:
        y = lanes.index(lane)
        c = colors(labels.index(label) % 10)
        ax.barh(y, (end - start) * 1e3, left=(start - t0) * 1e3, color=c, edgecolor="black", lw=0.4)
    from matplotlib.patches import Patch

    handles = [Patch(color=colors(k % 10), label=label) for k, label in enumerate(labels)]
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "Where the time goes")
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_peak_comparison(
    peaks: dict[str, dict[str, int]], *, ax: Any = None, title: str | None = None, note: str | None = None
) -> Any:
    """Grouped bars: for each setup (outer key), the peak bytes of every device (inner key), in MiB."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    setups = list(peaks)
    devices = list(dict.fromkeys(d for p in peaks.values() for d in p))
    width = 0.8 / max(1, len(devices))
    for k, dev in enumerate(devices):
        xs = [i + (k - (len(devices) - 1) / 2) * width for i in range(len(setups))]
        ax.bar(xs, [peaks[s].get(dev, 0) / 2**20 for s in setups], width, label=dev)
    ax.set_xticks(range(len(setups)), setups, fontsize=8)
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(title or "Peak memory per device", pad=16 if note else 6)
    if note:
        ax.text(0.5, 1.01, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, style="italic")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


# ----------------------------------------------------------------------------------------- diagram
_FLOW = [
    ("1 copy model", "bcast"),
    ("2 split batch", "scatter"),
    ("3 forward", "all"),
    ("4 gather outputs", "gather"),
    ("5 loss", "main"),
    ("6 send loss grads", "scatter"),
    ("7 backward", "all"),
    ("8 gather grads", "gather"),
    ("9 sum/average\n+ update", "main"),
    ("10 repeat", "loop"),
]


def draw_data_parallel_flow(n_devices: int = 3) -> Any:
    """The ten steps of one ``nn.DataParallel`` training iteration, one column per step.

    Rows are devices (device 0, the *main* device, on top). Green boxes: every device works, in its own
    thread. Orange boxes: only the main device works. Arrows: data crossing between devices (the model
    and the batch going out, outputs and gradients coming back). Returns the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from .diagrams import GPU_COLOR

    fig, ax = plt.subplots(figsize=(13, 1.2 + 0.75 * n_devices))
    ax.set_xlim(-1.6, len(_FLOW) - 0.4)
    ax.set_ylim(-0.8, n_devices + 0.2)
    ax.axis("off")
    ys = [n_devices - 1 - d for d in range(n_devices)]  # device 0 on top
    for d, y in enumerate(ys):
        ax.text(-0.5, y, f"device {d}" + (" (main)" if d == 0 else ""), ha="right", va="center", fontsize=8)
        ax.axhline(y, color="#DDDDDD", lw=0.6, zorder=0)
    for x, (label, kind) in enumerate(_FLOW):
        ax.text(x, n_devices - 0.35, label, ha="center", va="bottom", fontsize=8, weight="bold")
        if kind in ("all", "main"):
            rows = ys if kind == "all" else ys[:1]
            color = GPU_COLOR if kind == "all" else "#DD8452"
            for y in rows:
                ax.add_patch(
                    FancyBboxPatch(
                        (x - 0.32, y - 0.22), 0.64, 0.44, boxstyle="round,pad=0.02", fc=color, ec="none"
                    )
                )
            if kind == "all":
                note = "a thread per device" if x == 2 else "autograd, per device"
                ax.text(x, -0.65, note, ha="center", fontsize=7, style="italic")
        elif kind in ("bcast", "scatter", "gather"):
            for y in ys[1:]:
                start, end = (ys[0], y) if kind != "gather" else (y, ys[0])
                arrow = FancyArrowPatch(
                    (x - 0.15, start), (x + 0.15, end), arrowstyle="-|>", mutation_scale=10, color="#333333"
                )
                ax.add_patch(arrow)
            ax.plot([x], [ys[0]], "o", color="#333333", ms=4)
        elif kind == "loop":
            ax.annotate(
                "", xy=(0, -0.45), xytext=(x, -0.45),
                arrowprops={"arrowstyle": "-|>", "color": "#888888", "connectionstyle": "arc3,rad=0.0"},
            )  # fmt: skip
            ax.text(x, ys[0], "next\nbatch", ha="center", va="center", fontsize=8)
    ax.set_title("nn.DataParallel: one training iteration (one process; arrows = copies between devices)")
    fig.tight_layout()
    return fig
