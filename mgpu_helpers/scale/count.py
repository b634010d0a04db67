"""Used by notebook 05g (and its graders): what ONE rank holds, counted from its real
tensors — the counts the notebook's cells make, packaged for its sharded runs and its graders.

* :func:`local` — a ``DTensor``'s local shard (what this rank's memory really holds), a tensor as it is;
* :func:`rank_state` — bytes of parameters, gradients and optimizer state, each storage counted once;
* :class:`SavedActivations` — bytes autograd keeps for the backward pass (``saved_tensors_hooks``),
  parameters excluded (also FSDP2's gathered weights, seen as a module's parameters at its forward).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..memory._storage import all_storages, optimizer_tensors

__all__ = ["SavedActivations", "local", "rank_state", "unique_bytes"]


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank's memory holds: a ``DTensor``'s local shard, any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _key(t: torch.Tensor) -> int:
    """The identity of the storage behind ``t`` (views share it). Not its address: FSDP2 frees a block's
    gathered weights after the forward, and a later activation may be allocated at the same address; the
    storage object itself (``_cdata``, its C++ pointer) lives on, emptied, as long as the parameter does."""
    return local(t).untyped_storage()._cdata


def unique_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the storages behind ``tensors``, each storage once (views and shared buffers too); the
    memory tracker's unwrapping (:func:`~mgpu_helpers.memory._storage.all_storages`) finds them."""
    return sum({s._cdata: s.nbytes() for s in all_storages(tensors)}.values())


def rank_state(model: nn.Module, optimizer: Any = None) -> dict[str, int]:
    """``{"parameters", "gradients", "optimizer"}`` bytes this rank holds for ``model`` (and the
    optimizer's state, after a step; Adam's scalar ``step`` counters included)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, not {type(model).__name__}")
    params = list(model.parameters())
    out = {"parameters": unique_bytes(params), "gradients": unique_bytes(p.grad for p in params)}
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's in .optim
    out["optimizer"] = unique_bytes(optimizer_tensors(inner)) if optimizer is not None else 0
    return out


class SavedActivations:
    """``with SavedActivations(model) as saved: loss = model(x).sum()`` — ``saved.bytes`` is what autograd
    keeps for the backward pass of that forward: each storage once, parameters and buffers excluded."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.bytes = 0
        self._params: set[int] = set()
        self._seen: set[int] = set()
        self._hooks: list[Any] = []
        self._saving: Any = None

    def _note_parameters(self, module: nn.Module, args: Any) -> None:
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            self._params.add(_key(t))

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if local(t).untyped_storage().nbytes() and key not in self._params and key not in self._seen:
            self._seen.add(key)
            self.bytes += local(t).untyped_storage().nbytes()
        return t

    def __enter__(self) -> SavedActivations:
        self._params = {_key(t) for t in (*self.model.parameters(), *self.model.buffers())}
        self._hooks = [m.register_forward_pre_hook(self._note_parameters) for m in self.model.modules()]
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saving.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._saving.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
