"""Used by notebooks 03a and 03b: ``replicate``, ``scatter``, ``parallel_apply``, ``gather``, virtually.

PyTorch's ``nn.DataParallel`` does four things per forward pass — **scatter** the batch into chunks,
**replicate** the module onto the devices that got one, **parallel_apply** the replicas in threads,
**gather** the outputs onto one device — with ``torch.nn.parallel``'s functions of the same names.
Those refuse CPU tensors. This module rebuilds them with the same names, signatures and autograd behaviour
over *virtual devices* (see :mod:`.devices`). The arithmetic is the real thing — real threads, real chunks,
real copies — so outputs and gradients equal those of the unsplit model and of ``nn.DataParallel``; only
*where* a byte lives is simulated.

==============================  ========================================================================
``torch.nn.parallel``           here
==============================  ========================================================================
``replicate(module, devices)``  :func:`replicate` — copies parameters in a differentiable way; their
                                gradients are summed back onto the source device (``_Broadcast``)
``scatter(inputs, devices)``    :func:`scatter` — ``torch.chunk`` on ``dim``; a chunk already on its
                                target device is a view, others are copies
``parallel_apply(...)``         :func:`parallel_apply` — one thread per replica, each inside
                                ``virtual_device(name)``
``gather(outputs, device)``     :func:`gather` — ``torch.cat`` on ``dim`` onto the output device
==============================  ========================================================================

With no tracker active nothing is recorded: the weights are then taken to be on ``devices[0]`` (as
``nn.DataParallel`` requires) and every scattered chunk is copied, which changes no value.

Private API used on purpose: ``Module._replicate_for_data_parallel`` (a shallow module copy without
parameters, what ``torch.nn.parallel.replicate`` uses). Replica weights are counted as *parameters*
through :meth:`MemoryTracker.classify`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd import Function

from ..memory import virtual_device
from .devices import Device, _copy_to, _device_list, _label, _move, device_name, virtual_device_of

__all__ = ["gather", "parallel_apply", "replicate", "scatter", "scatter_kwargs"]


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
    def forward(ctx: Any, devices: list[str], dim: int, source: str | None, x: Tensor) -> tuple[Tensor, ...]:
        ctx.dim, ctx.source = dim, source
        chunks = x.chunk(len(devices), dim)
        return tuple(_move(c, source, name) for c, name in zip(chunks, devices, strict=False))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        with virtual_device(ctx.source) if ctx.source else contextlib.nullcontext():
            return (None, None, None, torch.cat(grads, ctx.dim))


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


def _check_dim(dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int (the batch dimension, usually 0), not {dim!r}")
    return dim


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
    if not isinstance(network, nn.Module):
        raise TypeError(f"replicate copies an nn.Module, not {type(network).__name__}")
    if not isinstance(detach, bool):
        raise TypeError(f"detach must be True or False, not {detach!r}")
    names = _device_list(devices)
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


def _scatter(inputs: Any, names: list[str], dim: int) -> Any:
    """:func:`scatter` without the checks of its arguments (tensors are still checked)."""

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, Tensor):
            if obj.dim() == 0:
                raise ValueError(
                    "cannot scatter a 0-dim tensor (a scalar): pass tensors with a batch dimension"
                )
            if not -obj.dim() <= dim < obj.dim():
                raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(obj.shape)}")
            if obj.size(dim) == 0:
                raise ValueError(f"cannot scatter an empty batch (shape {tuple(obj.shape)}, dim={dim})")
            return _Scatter.apply(names, dim, virtual_device_of(obj), obj)
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


def scatter(inputs: Any, target_gpus: Sequence[Device], dim: int = 0) -> Any:
    """Split tensors (also inside tuples, lists, dicts) into chunks along ``dim``, one per device.

    Like ``torch.nn.parallel.scatter``: chunk sizes are those of ``torch.chunk`` (see
    :func:`chunk_sizes`), so fewer chunks than devices can come back; non-tensors are repeated for every
    device; a single tensor gives a tuple, anything else a list. Differentiable: the chunks' gradients
    are concatenated back on the input's device. ``inputs`` must contain at least one tensor.
    """
    names = _device_list(target_gpus, "target_gpus")
    _check_dim(dim)
    if _first_tensor(inputs) is None:
        raise ValueError(
            f"scatter splits tensors, and {type(inputs).__name__} {inputs!r:.60} contains none: "
            "pass a tensor, or a tuple/list/dict holding tensors"
        )
    return _scatter(inputs, names, dim)


def scatter_kwargs(
    inputs: tuple[Any, ...], kwargs: dict[str, Any] | None, target_gpus: Sequence[Device], dim: int = 0
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword arguments together, as ``torch.nn.parallel.scatter_kwargs``.

    Returns as many argument tuples as keyword dicts, one pair per device that got a chunk.
    """
    if not isinstance(inputs, tuple | list):
        raise TypeError(f"inputs must be a tuple of positional arguments, not {type(inputs).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict of keyword arguments or None, not {type(kwargs).__name__}")
    names = _device_list(target_gpus, "target_gpus")
    _check_dim(dim)
    if (inputs or kwargs) and _first_tensor([inputs, dict(kwargs or {})]) is None:
        raise ValueError("data parallelism splits tensors, and the arguments contain none: pass the batch")
    scattered_inputs = _scatter(tuple(inputs), names, dim) if inputs else []
    scattered_kwargs = _scatter(dict(kwargs), names, dim) if kwargs else []
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
    if not isinstance(modules, Sequence | nn.ModuleList):
        raise TypeError("modules must be a list of replicas (e.g. from replicate), one per device")
    if not modules:
        raise ValueError("modules is empty: give one replica per device, e.g. replicate(model, [0, 1])")
    bad = [type(m).__name__ for m in modules if not callable(m)]
    if bad:
        raise TypeError(f"every replica must be callable (an nn.Module or a function), got {bad}")
    if not isinstance(inputs, Sequence) or isinstance(inputs, str):
        raise TypeError("inputs must be a list with one input per replica, e.g. from scatter")
    if len(modules) != len(inputs):
        raise ValueError(f"{len(modules)} modules but {len(inputs)} inputs: give one input per replica")
    kwargs_tup = list(kwargs_tup) if kwargs_tup is not None else [{} for _ in modules]
    if len(kwargs_tup) != len(modules):
        raise ValueError(f"{len(modules)} modules but {len(kwargs_tup)} kwargs dicts: give one per replica")
    if not all(isinstance(k, Mapping) for k in kwargs_tup):
        raise TypeError("kwargs_tup must hold one dict of keyword arguments per replica ({} for none)")
    if timings is not None and not isinstance(timings, list):
        raise TypeError(f"timings must be a list to append to, or None; not {type(timings).__name__}")
    if devices is None:
        found = [_first_tensor(x) for x in inputs]
        names: list[str | None] = [None if t is None else virtual_device_of(t) for t in found]
    else:
        if len(devices) != len(modules):
            raise ValueError(
                f"{len(modules)} modules but {len(devices)} devices: give one device per replica"
            )
        names = [None if d is None else device_name(d) for d in devices]
    grad_enabled = torch.is_grad_enabled()
    results: dict[int, Any] = {}
    lock = threading.Lock()

    def worker(i: int, module: Callable[..., Any], args: Any, kwargs: Mapping[str, Any]) -> None:
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
    else:
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
    if isinstance(outputs, Tensor) or not isinstance(outputs, Sequence) or isinstance(outputs, str):
        raise TypeError(
            f"gather needs a list with one output per replica (e.g. from parallel_apply), "
            f"not {type(outputs).__name__}"
        )
    if not outputs:
        raise ValueError("outputs is empty: gather needs one output per replica, e.g. from parallel_apply")
    target = device_name(target_device)
    _check_dim(dim)

    def gather_map(items: Sequence[Any]) -> Any:
        out = items[0]
        if isinstance(out, Tensor):
            if not all(isinstance(t, Tensor) for t in items):
                raise TypeError(
                    "some replicas returned a tensor and others did not: return the same structure"
                )
            return _Gather.apply(target, dim, *items)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(isinstance(d, dict) and d.keys() == out.keys() for d in items):
                raise ValueError("all replicas must return dicts with the same keys")
            return type(out)((k, gather_map([d[k] for d in items])) for k in out)
        if isinstance(out, tuple) and hasattr(out, "_fields"):
            return type(out)._make(map(gather_map, zip(*items, strict=True)))
        if isinstance(out, list | tuple):
            return type(out)(map(gather_map, zip(*items, strict=True)))
        raise TypeError(
            f"gather joins tensors (also in tuples, lists, dicts), not {type(out).__name__}: "
            "return tensors from the replicas"
        )

    return gather_map(outputs)
