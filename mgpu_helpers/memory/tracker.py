"""Used by notebooks 01, 02b, 03b, 05b and 07a (and the data-parallel, pipeline and troubleshooting helpers):
:class:`MemoryTracker`, device-agnostic memory accounting for training loops.

It counts the bytes of every live tensor storage, split into four categories — parameters, gradients,
optimizer state, and activations & other — exactly and deterministically on the CPU, and the same way
on CUDA (where :meth:`MemoryTracker.cuda_cross_check` compares it with ``torch.cuda.memory_allocated``).
It works on a machine without any GPU, which is what lets the course show memory behaviour to every
student.

How it counts
-------------
* The tracker is a ``TorchDispatchMode``: while it is active (``with tracker:``) it sees every ATen
  operation. Any output storage that none of the inputs owns is a fresh allocation; it is recorded
  with its byte size, its device, and a ``weakref.finalize`` callback that fires the moment PyTorch
  frees it. So the running total is exact at every operation, and the peak is a real peak.
* Storages, not tensors, are counted: views (``x[0]``, ``x.t()``) share memory and are counted once.
* Categories come from roles, not from when a tensor was made: the model's parameters are
  *parameters*; a tensor that autograd stores in ``param.grad`` is re-labelled *gradients* (a
  post-accumulate-grad hook); tensors held in ``optimizer.state`` are re-labelled *optimizer*
  (a step post-hook). Everything else made while tracking — inputs, activations saved for backward,
  temporaries, buffers — is *activations & other*.
* Tensors made before tracking started are not counted, except the tracked model's parameters and
  gradients and the optimizer's state, which are registered up front.
* Tensor subclasses that wrap other tensors (FSDP2's ``DTensor``) are counted by the storages they
  wrap: a sharded parameter counts as this rank's shard, not the full tensor.

Why not the built-in tools
--------------------------
``torch.distributed._tools.mem_tracker.MemTracker`` (evaluated with torch 2.13) gives a similar
split but refuses a second iteration inside one tracker ("does not support memory tracking for
multiple iterative calls"), and its peak snapshot for ``Linear(1000, 1000)`` + Adam showed 0 B of
gradients, because its peak fell after ``zero_grad``. It is private API (leading underscore) and
changes between releases. The course needs a timeline over many steps that a student can read, so
this module builds on the same public mechanism it uses (``TorchDispatchMode``) and keeps the rules
above short enough to state. The unit tests check the parameter and optimizer-state bytes against
``MemTracker`` on one iteration.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _storage as st
from . import virtual
from .categories import CATEGORIES, CATEGORY_LABELS, MemorySample, _text_table
from .estimate import MemoryPrediction, _check_model, _check_optimizer

__all__ = ["MemoryTracker"]


def _check_tensor(what: str, tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{what} needs a torch.Tensor (e.g. a parameter or an output), not {type(tensor).__name__}"
        )
    return tensor


class MemoryTracker(TorchDispatchMode):
    """Record live tensor bytes over time by category, on any device.

    Use it as a context manager around the code to measure, and tell it the model and optimizer so
    that it can name what it sees::

        tracker = MemoryTracker(model, optimizer)
        with tracker:
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                tracker.mark("step")
        print(tracker.summary())

    Every allocation and free is logged. A storage is counted under its *final* role: Adam's
    ``exp_avg`` is optimizer state from the moment ``zeros_like`` made it, although the optimizer
    only stores it in ``optimizer.state`` a moment later. :attr:`current` always uses the roles known
    now; :attr:`peak`, :attr:`peak_total`, :attr:`peak_breakdown`, :attr:`peak_by_device` and
    :attr:`timeline` replay the log with the final roles.

    Args:
        model: module whose parameters count as *parameters* and whose ``.grad`` as *gradients*.
        optimizer: optimizer whose ``state`` tensors count as *optimizer*.
    """

    def __init__(
        self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._live: dict[int, st.Entry] = {}  # storage address -> entry (addresses are reused after free)
        self._category: list[str] = []  # role of each storage ever seen, indexed by uid
        self._device: list[str] = []  # device of each storage ever seen, indexed by uid
        self._log: list[tuple[int, int]] = []  # (uid, +bytes on allocation / -bytes on free)
        self._replay: st.Replay | None = None
        self._params: list[torch.nn.Parameter] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._handles: list[Any] = []
        self.current: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.current_by_device: dict[str, dict[str, int]] = {}
        self.marks: list[MemorySample] = []
        if model is not None or optimizer is not None:
            self.track(model, optimizer)

    # ------------------------------------------------------------------ registration
    def track(
        self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
    ) -> MemoryTracker:
        """Register a model's parameters and an optimizer's state, and hook their updates."""
        _check_model(model, optional=True)
        _check_optimizer(optimizer)
        if model is not None:
            for p in model.parameters():
                if any(p is q for q in self._params):
                    continue
                self._params.append(p)
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook))
        if optimizer is not None and all(optimizer is not o for o in self._optimizers):
            self._optimizers.append(optimizer)
            self._handles.append(optimizer.register_step_post_hook(self._optimizer_hook))
        self.rescan()
        return self

    def _grad_hook(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self._classify(param.grad, "gradients")

    def _optimizer_hook(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        for t in st.optimizer_tensors(optimizer):
            self._classify(t, "optimizer")

    def rescan(self) -> None:
        """Re-label every known parameter, gradient and optimizer-state tensor by its role."""
        for p in self._params:
            self._classify(p, "parameters")
            if p.grad is not None:
                self._classify(p.grad, "gradients")
        for opt in self._optimizers:
            for t in st.optimizer_tensors(opt):
                self._classify(t, "optimizer")

    def _classify(self, tensor: torch.Tensor, category: str) -> None:
        for storage in st.storages_of(tensor):
            with self._lock:
                entry = self._live.get(storage._cdata)
                if entry is None:
                    self._add(storage, category)
                    continue
                old = self._category[entry.uid]
                if old != category:
                    self._category[entry.uid] = category
                    self._count(entry.device, old, -entry.nbytes)
                    self._count(entry.device, category, entry.nbytes)
                    self._replay = None

    def _add(self, storage: torch.UntypedStorage, category: str, label: str | None = None) -> None:
        uid = len(self._category)
        physical = str(storage.device)
        label = label or virtual.current_virtual_device() or physical
        self._category.append(category)
        self._device.append(label)
        fin = weakref.finalize(storage, self._on_free, storage._cdata, uid)
        fin.atexit = False
        entry = st.Entry(uid, storage.nbytes(), label, physical, fin)
        self._live[storage._cdata] = entry
        self._log_change(entry, entry.nbytes)

    def _on_free(self, key: int, uid: int) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is not None and entry.uid == uid:
                del self._live[key]
                self._log_change(entry, -entry.nbytes)

    def _log_change(self, entry: st.Entry, delta: int) -> None:
        self._log.append((entry.uid, delta))
        self._count(entry.device, self._category[entry.uid], delta)
        self._replay = None

    def _count(self, device: str, category: str, delta: int) -> None:
        self.current[category] += delta
        self.current_by_device.setdefault(device, dict.fromkeys(CATEGORIES, 0))[category] += delta

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # torch's protocol
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in st.RESIZE_OPS:
            self._resized(args[0])
            return out
        inputs = list(dict.fromkeys(s._cdata for s in st.all_storages(tree_flatten((args, kwargs))[0])))
        fresh = func in st.LIFT_OPS
        with self._lock:
            for storage in st.all_storages(tree_flatten(out)[0]):
                key = storage._cdata
                if key in self._live or (key in inputs and not fresh):
                    continue
                self._add(storage, "other", self._inherited_label(inputs, str(storage.device)))
        return out

    def _inherited_label(self, inputs: list[int], physical: str) -> str | None:
        """The virtual device of the first input on the same real device, if any (see virtual_device)."""
        if virtual.current_virtual_device():
            return None  # an explicit scope wins
        for key in inputs:
            entry = self._live.get(key)
            if entry is not None and entry.physical == physical and entry.device != physical:
                return entry.device
        return None

    def _resized(self, tensor: torch.Tensor) -> None:
        storage = st.storage_of(tensor)
        if storage is None:
            return
        with self._lock:
            entry = self._live.get(storage._cdata)
            if entry is None:
                self._add(storage, "other")
            elif storage.nbytes() != entry.nbytes:
                delta = storage.nbytes() - entry.nbytes
                entry.nbytes += delta
                self._log_change(entry, delta)

    def __enter__(self) -> MemoryTracker:
        super().__enter__()
        virtual._entered(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        virtual._exited(self)
        self.rescan()

    # ------------------------------------------------------------------ reading
    def mark(self, label: str) -> MemorySample:
        """Re-label by role, then record a labelled point (e.g. ``"step 3"``) on the timeline."""
        if not isinstance(label, str):
            raise TypeError(f"mark needs a text label such as 'step 3', not {label!r}")
        if not label.strip():
            raise ValueError("mark needs a non-empty label such as 'step 3', not an empty string")
        with self._lock:
            self.rescan()
            sample = MemorySample(len(self._log), dict(self.current), label)
            self.marks.append(sample)
            return sample

    @property
    def events(self) -> int:
        """Number of allocations and frees seen so far."""
        return len(self._log)

    def _replayed(self) -> st.Replay:
        with self._lock:
            if self._replay is None:
                self._replay = st.replay(self._log, self._category, self._device)
            return self._replay

    @property
    def timeline(self) -> list[MemorySample]:
        """One sample per event, every storage under its final role."""
        r = self._replayed()
        return [MemorySample(e, b) for e, b in zip(r.events, r.rows, strict=True)]

    @property
    def peak(self) -> dict[str, int]:
        """Highest bytes reached by each category on its own."""
        return dict(self._replayed().peak)

    @property
    def peak_total(self) -> int:
        """Highest total live bytes at any moment."""
        return self._replayed().peak_total

    @property
    def peak_breakdown(self) -> dict[str, int]:
        """Bytes per category at the moment of :attr:`peak_total`."""
        return dict(self._replayed().peak_breakdown)

    @property
    def peak_by_device(self) -> dict[str, int]:
        """Highest total live bytes per device."""
        return dict(self._replayed().peak_by_device)

    @property
    def peak_breakdown_by_device(self) -> dict[str, dict[str, int]]:
        """For each device, bytes per category at the moment that device reached its own peak."""
        return {d: dict(b) for d, b in sorted(self._replayed().peak_breakdown_by_device.items())}

    def device_of(self, tensor: torch.Tensor) -> str | None:
        """The (real or virtual) device this tracker counts ``tensor``'s storage under, or None if unseen."""
        storage = st.storage_of(_check_tensor("device_of", tensor))
        if storage is None:
            return None
        with self._lock:
            entry = self._live.get(storage._cdata)
            return None if entry is None else entry.device

    def classify(self, tensor: torch.Tensor, category: str) -> None:
        """Count ``tensor``'s storage under ``category`` (e.g. replica weights as ``"parameters"``)."""
        _check_tensor("classify", tensor)
        if category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, not {category!r}")
        self._classify(tensor, category)

    @property
    def current_total(self) -> int:
        """Bytes currently live, all categories and devices."""
        return sum(self.current.values())

    def live_bytes(self, device: str | torch.device | None = None, *, cuda_rounding: bool = False) -> int:
        """Live tracked bytes, optionally on one (real or virtual) device, optionally rounded like CUDA's
        caching allocator (blocks of at least 512 B)."""
        if device is not None and not isinstance(device, str | torch.device):
            raise TypeError(f"device must be a name such as 'cuda:0', a torch.device or None, not {device!r}")
        if not isinstance(cuda_rounding, bool):
            raise TypeError(f"cuda_rounding must be True or False, not {cuda_rounding!r}")
        dev = None if device is None else str(device)
        with self._lock:
            sizes = [e.nbytes for e in self._live.values() if dev is None or e.device == dev]
        return sum(st.cuda_rounded(n) for n in sizes) if cuda_rounding else sum(sizes)

    def cuda_cross_check(self, device: int | str | torch.device = 0, baseline: int = 0) -> dict[str, int]:
        """Compare tracked CUDA bytes with ``torch.cuda.memory_allocated``.

        ``baseline`` is what ``memory_allocated`` showed before the tracked work, minus whatever of it
        the tracker also counts (e.g. the model's parameters when they were moved to the GPU first):
        take ``torch.cuda.memory_allocated(dev) - tracker.live_bytes(dev, cuda_rounding=True)`` right
        after creating the tracker. The caching allocator rounds each block up to a multiple of 512 B,
        so tracked sizes are rounded the same way. Returns both numbers and their difference;
        allocations made outside PyTorch tensors (e.g. cuBLAS workspaces) explain a small gap.
        """
        if isinstance(device, bool) or not isinstance(device, int | str | torch.device):
            raise TypeError(
                f"device must be a CUDA index, a name such as 'cuda:0' or a torch.device, not {device!r}"
            )
        if isinstance(baseline, bool) or not isinstance(baseline, int):
            raise TypeError(
                f"baseline must be a byte count (int) from torch.cuda.memory_allocated, not {baseline!r}"
            )
        dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("cuda_cross_check needs a CUDA device; on CPU the tracker is the measurement.")
        allocated = torch.cuda.memory_allocated(dev) - baseline
        tracked = self.live_bytes(dev, cuda_rounding=True)
        return {
            "tracked_bytes": tracked,
            "cuda_allocated_bytes": allocated,
            "difference": allocated - tracked,
        }

    def summary(self, estimate: MemoryPrediction | None = None) -> str:
        """A small text table: current and peak bytes per category (and an estimate, if given)."""
        if estimate is not None and not isinstance(estimate, MemoryPrediction):
            raise TypeError(
                "estimate must be a MemoryPrediction from estimate_training_memory(model, optimizer) "
                f"or predict_memory(...), not {type(estimate).__name__}"
            )
        peak, at_peak = self.peak, self.peak_breakdown
        header = ("category", "now", "own peak", "at overall peak") + (("estimate",) if estimate else ())
        rows = [header]
        for cat in CATEGORIES:
            row = (CATEGORY_LABELS[cat], *(f"{b[cat]:,} B" for b in (self.current, peak, at_peak)))
            if estimate is not None:
                est = estimate.as_dict().get(cat)
                row += ("-" if est is None else f"{est:,} B",)
            rows.append(row)
        total = ("total", f"{self.current_total:,} B", "", f"{self.peak_total:,} B")
        if estimate is not None:
            total += (f"{estimate.total:,} B",)
        rows.append(total)
        return _text_table(rows, rule=True)

    def plot(self, ax: Any = None, *, title: str | None = None, unit: str = "MiB") -> Any:
        """Stacked-area timeline of bytes per category, with marks as vertical lines. Returns the axes."""
        from .plots import plot_memory_timeline

        return plot_memory_timeline(self.timeline, self.marks, ax=ax, title=title, unit=unit)

    def close(self) -> None:
        """Remove hooks and finalizers; the numbers recorded so far stay readable."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        with self._lock:
            for entry in self._live.values():
                entry.finalizer.detach()
