"""Used by notebook 05c's exercises: sharding a model with FSDP2 per block with a mixed-precision policy
(05c.1), and one ordinary file exported from the shards and imported back into shards at other world
sizes (05c.2).

05c.1 calls the student's ``shard(model, mesh, half)`` on 2 real gloo processes and checks what FSDP2
then does: the root, ``embed``, every block and ``head`` are FSDP units, every parameter is a ``DTensor``
sharded on dim 0, each linear layer computes in ``half`` (a forward pre-hook reads the weight's and the
input's dtype), after the forward exactly the units whose backward comes first (``head`` and the last
block) still hold full weights (the others are ``DTensor`` shards again), so the backward all-gathers
``embed`` and every block but the last again, the gradients are reduce-scattered in fp32 (a
``TorchDispatchMode`` sees the ``c10d`` collectives, as in the notebook), and the full gradients equal a
single-process fp32 run on the whole batch within bf16's rounding (5 %).

05c.2 trains 2 steps at world size 2 and calls the student's ``export(model, path)``, counting the
``torch.save`` calls of each rank (one file, written once by one process); the file must be an ordinary
``torch.save`` state dict that a plain, unsharded copy of the model loads (``weights_only=True``)
with exactly the trained weights. Then, at world sizes 1 and 3, it builds a fresh sharded model and calls
``import_weights(model, path)``: the parameters must still be sharded ``DTensor``s and, gathered with
``get_model_state_dict``, equal the trained weights exactly.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..exercises import Wrong, exercise
from ._ranks import run_ranks

_WIDTH, _CLASSES, _BATCH = 64, 5, 12  # 5 output rows: padded shards; 12 splits over 1, 2 and 3 ranks


class _Block(nn.Module):
    def __init__(self, width: int = _WIDTH) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class _Net(nn.Module):
    """A transformer-shaped stack: an input layer, residual blocks, an output layer."""

    def __init__(self, n_blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(_WIDTH, _WIDTH)
        self.blocks = nn.ModuleList(_Block() for _ in range(n_blocks))
        self.head = nn.Linear(_WIDTH, _CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _model() -> _Net:
    torch.manual_seed(0)
    return _Net()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(_BATCH, _WIDTH, generator=g), torch.randint(0, _CLASSES, (_BATCH,), generator=g)


def _my_part(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _batch(step)
    k = _BATCH // world_size
    return x[rank * k : (rank + 1) * k], y[rank * k : (rank + 1) * k]


def _collectives_spy() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, torch.dtype, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # torch's protocol
            name = func.name()
            if name.startswith("c10d::") and args and isinstance(args[0], torch.Tensor):
                self.seen.append((name, args[0].dtype, args[0].numel()))
            return func(*args, **(kwargs or {}))

    return Spy()


# --- 05c.1 ------------------------------------------------------------------------------------------


def _shard_rank(rank: int, world_size: int, shard: Callable[..., Any]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = _model()
    returned = shard(model, mesh, torch.bfloat16)
    model = model if returned is None else returned
    if not isinstance(model, nn.Module):
        return {"error": f"shard returned {type(model).__name__}, not the model"}
    units = {
        "embed": model.embed,
        **{f"blocks.{i}": b for i, b in enumerate(model.blocks)},
        "head": model.head,
    }
    report: dict[str, Any] = {
        "root": isinstance(model, FSDPModule),
        "not_units": [name for name, unit in units.items() if not isinstance(unit, FSDPModule)],
        "not_sharded": [
            n
            for n, p in model.named_parameters()
            if not (isinstance(p, DTensor) and p.placements == (Shard(0),))
        ],
    }
    if report["not_sharded"]:
        return report
    dtypes: dict[str, tuple[torch.dtype, torch.dtype]] = {}

    def record(name: str, layer: nn.Module, args: tuple[Any, ...]) -> None:
        dtypes.setdefault(name, (layer.weight.dtype, args[0].dtype))

    for name, layer in model.named_modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_pre_hook(functools.partial(record, name))
    x, y = _my_part(0, rank, world_size)
    forward, backward = _collectives_spy(), _collectives_spy()
    with forward:
        loss = F.cross_entropy(model(x).float(), y)
    # the units that still hold full (plain) parameters after the forward
    kept = [name for name, unit in units.items() if not isinstance(next(unit.parameters()), DTensor)]
    with backward:
        loss.backward()
    report.update(
        dtypes=dtypes,
        kept=kept,
        gathers=[n for name, _, n in forward.seen if "allgather" in name],
        regathers=sum("allgather" in name for name, _, _ in backward.seen),
        reduce_dtypes=sorted({str(d) for name, d, _ in backward.seen if "reduce_scatter" in name}),
        param_dtypes=sorted({str(p.dtype) for p in model.parameters()}),
        grads={n: p.grad.full_tensor() if p.grad is not None else None for n, p in model.named_parameters()},
    )
    return report


@exercise(
    "05c.1",
    "shard per block with a mixed-precision policy",
    hint="fully_shard embed, each block and head first (each its own all-gather), the root last; every "
    "call takes the mesh and a MixedPrecisionPolicy (which dtype computes, which reduces the gradients); "
    "per unit, reshard_after_forward decides whether it is gathered again in backward: ask, for each "
    "unit, how soon after the forward its backward runs.",
)
def grade_shard(shard: Callable[..., Any]) -> str:
    """Run ``shard(model, mesh, torch.bfloat16)`` on 2 gloo ranks and check what FSDP2 then does."""
    if not callable(shard):
        raise Wrong(f"pass your function shard itself, not {type(shard).__name__}.")
    reports = run_ranks(_shard_rank, 2, shard)
    report = reports[0]
    if "error" in report:
        raise Wrong(report["error"] + ".")
    if not report["root"]:
        raise Wrong("the model itself is not an FSDP module: the root was never sharded.")
    if report["not_units"]:
        raise Wrong(
            f"{', '.join(report['not_units'])} {'is' if len(report['not_units']) == 1 else 'are'} not FSDP "
            "units of their own, so their weights are all-gathered together with the root's, all at once."
        )
    if report["not_sharded"]:
        raise Wrong(f"{report['not_sharded'][0]} is not a DTensor sharded on dim 0 (Shard(0)).")
    for name, (weight, given) in report["dtypes"].items():
        if weight != torch.bfloat16 or given != torch.bfloat16:
            raise Wrong(f"layer {name} computed with a {weight} weight on a {given} input, not in bfloat16.")
    if report["param_dtypes"] != ["torch.float32"]:
        raise Wrong(f"the sharded parameters are {report['param_dtypes']}, not fp32 master weights.")
    if report["reduce_dtypes"] != ["torch.float32"]:
        raise Wrong(f"the gradients were reduce-scattered in {', '.join(report['reduce_dtypes'])}, not fp32.")
    blocks = len(_model().blocks)
    first = ["head", f"blocks.{blocks - 1}"]  # the units the backward runs first
    kept = report["kept"]
    if sorted(kept) != sorted(first):
        late = [name for name in kept if name not in first]
        freed = [name for name in first if name not in kept]
        problems = [f"{', '.join(late)} stay gathered until their backward, which comes late"] if late else []
        problems += [f"{', '.join(freed)} are freed though backward starts with them"] if freed else []
        raise Wrong(
            f"after the forward, the units holding full weights are {kept or 'none'}: "
            f"{'; '.join(problems)} (the backward ran {report['regathers']} all-gathers)."
        )
    if report["regathers"] != blocks:
        raise Wrong(
            f"the backward pass ran {report['regathers']} all-gathers; with embed and {blocks} blocks it "
            f"needs {blocks}: embed and every block but the last."
        )
    reference = _model()
    x, y = _batch(0)
    F.cross_entropy(reference(x), y).backward()
    worst = 0.0
    for name, p in reference.named_parameters():
        got = report["grads"][name]
        if got is None:
            raise Wrong(f"{name} has no gradient after backward.")
        error = ((got.float() - p.grad).norm() / p.grad.norm()).item()
        if not error < 0.05:
            raise Wrong(
                f"the gradient of {name} differs from a single-process fp32 run on the whole batch by "
                f"{error:.1%} (bf16 rounding explains up to 5 %)."
            )
        worst = max(worst, error)
    return (
        f"on 2 ranks: embed, {blocks} blocks and head are FSDP units ({len(report['gathers'])} all-gathers "
        f"in forward, {report['regathers']} in backward; head and blocks.{blocks - 1} stay gathered), "
        "every parameter is an fp32 Shard(0) DTensor, every layer computes in bf16, gradients are reduced "
        f"in fp32 and are within {worst:.1%} of fp32 single-process gradients"
    )


# --- 05c.2 ------------------------------------------------------------------------------------------


def _build(world_size: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = _model()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int, world_size: int) -> None:
    for step in steps:
        x, y = _my_part(step, rank, world_size)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every rank takes part; rank 0 gets the full (unsharded) weights as plain CPU tensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}


def _export_rank(rank: int, world_size: int, export: Callable[..., Any], path: str) -> Any:
    import torch.distributed as dist

    model, opt = _build(world_size)
    _train(model, opt, range(2), rank, world_size)
    saves, real_save = [], torch.save

    def counting_save(*args: Any, **kwargs: Any) -> None:
        saves.append(1)
        real_save(*args, **kwargs)

    torch.save = counting_save  # this rank's own torch: count the files it writes
    try:
        export(model, path)
    finally:
        torch.save = real_save
    dist.barrier()
    trained = _full_weights(model)
    return (trained if rank == 0 else None), len(saves)


def _import_rank(rank: int, world_size: int, import_weights: Callable[..., Any], path: str) -> Any:
    from torch.distributed.tensor import DTensor

    model, _ = _build(world_size)  # fresh: the initial weights, not the trained ones
    import_weights(model, path)
    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    loaded = _full_weights(model)
    return (loaded, plain) if rank == 0 else None


def _check_weights(where: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(want) - set(got))
    if missing:
        raise Wrong(f"{where}, {missing[0]} is missing.")
    for name, value in want.items():
        if got[name].shape != value.shape:
            raise Wrong(f"{where}, {name} has shape {tuple(got[name].shape)}, not {tuple(value.shape)}.")
        if not torch.equal(got[name], value):
            diff = (got[name] - value).abs().max().item()
            raise Wrong(f"{where}, {name} differs from the trained weights by up to {diff:.3g}.")


@exercise(
    "05c.2",
    "one ordinary file from the shards, and back into shards at any world size",
    hint="the shards must be gathered into full tensors before anything is written (get_model_state_dict "
    "has options for full tensors on the CPU), and only one process should write; to load, every rank "
    "must end up with its own shard of the full tensors (set_model_state_dict takes the same options).",
)
def grade_export(export: Callable[..., Any], import_weights: Callable[..., Any]) -> str:
    """Export from 2 gloo ranks, load in a plain process, import on 1 and on 3 ranks, and compare."""
    for name, fn in (("export", export), ("import_weights", import_weights)):
        if not callable(fn):
            raise Wrong(f"pass your functions export and import_weights; {name} is a {type(fn).__name__}.")
    with tempfile.TemporaryDirectory(prefix="mgpu-05c-grader-") as folder:
        path = os.path.join(folder, "model.pt")
        exported = run_ranks(_export_rank, 2, export, path)
        trained, saves = exported[0][0], [n for _, n in exported]
        if sum(saves) > 1:
            raise Wrong(
                f"torch.save ran {sum(saves)} times (per rank: {saves}): the one file should be "
                "written once, by one process, not by every rank at once (a reader may see it half written)."
            )
        if not os.path.isfile(path):
            raise Wrong("after export on 2 ranks there is no file at path.")
        mesh_log = logging.getLogger("torch.distributed.device_mesh")  # unpickling a DTensor warns there
        level, _ = mesh_log.level, mesh_log.setLevel(logging.ERROR)
        try:
            state = torch.load(path, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure here is the student's file
            raise Wrong(f"torch.load(path, weights_only=True) fails on the exported file: {exc}") from None
        finally:
            mesh_log.setLevel(level)
        plain_tensors = isinstance(state, dict)
        odd = {k: v for k, v in state.items() if type(v) is not torch.Tensor} if plain_tensors else {}
        if not isinstance(state, dict) or odd:
            what = f"{next(iter(odd))} is a {type(next(iter(odd.values()))).__name__}" if odd else "no dict"
            raise Wrong(f"the exported file is not a state dict of plain tensors: {what}.")
        plain = _model()
        try:
            plain.load_state_dict(state)
        except RuntimeError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            raise Wrong(f"a plain single-process model cannot load the exported file: {lines[-1]}") from None
        _check_weights("in the exported file", dict(plain.state_dict()), trained)
        for world_size in (1, 3):
            where = f"imported on {world_size} rank{'s' if world_size > 1 else ''}"
            try:
                loaded, not_sharded = run_ranks(_import_rank, world_size, import_weights, path)[0]
            except Wrong as exc:
                raise Wrong(f"{where}: {exc}") from None
            if not_sharded:
                raise Wrong(f"{where}, {not_sharded[0]} is no longer a sharded DTensor.")
            _check_weights(where, loaded, trained)
    return (
        "the file from 2 ranks holds the full trained weights, a plain model loads it, and imported on 1 "
        "and on 3 ranks every shard equals the trained weights"
    )
