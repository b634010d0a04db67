"""Used by notebook 07c's exercises: reading real Flight Recorder dumps of a hung job (07c.1) and reading
DDP's all-reduces from a ``torch.profiler`` profile (07c.2).

07c.1 hangs a real 3-process gloo job — rank 2 skips a broadcast that ranks 0 and 1 issue, with a
1.5-second collective timeout — and collects every rank's Flight Recorder dump with a ring buffer of 4
entries, so that every dump holds the same number of entries. The student's function is called on the
dumps as recorded, with the ranks relabelled, and with the ranks relabelled and the collectives' kinds
swapped (all-reduce and broadcast), so that neither the rank nor the kind can be written in.

07c.2 runs the student's function on both ranks of a 2-process gloo DDP job whose buckets
(``bucket_cap_mb``) give three all-reduces, two of them of the same size. The model registers its layers
in another order than its forward uses them, and DDP rebuilds its buckets in the order the gradients
became ready, so simulating the buckets from ``parameters()`` in reverse gives other sizes than the
profile. The answer is compared with the grader's own profile of the next step and with the model's
parameter count; hooks check that a profiler was recording while the student's step ran forward and
backward (DDP's own bucket list, ``_get_ddp_logging_data()``, is not the lesson), and that it registered no
communication hook (04a's way of seeing the buckets, not the profile's).
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..ddp import captured_native_stderr
from ..exercises import Wrong, exercise
from ..launching import LaunchError, launch

# ------------------------------------------------------------------------------------------ 07c.1
_FR_TIMEOUT_S = 1.5  # short, but long enough for the ranks to join on a loaded machine
_BEHIND = 2  # the rank that skips the broadcast (the notebook shows rank 1 skipping an all-reduce)
_SKIPPED = "gloo:broadcast"


def _hang_and_dump(rank: int, world_size: int) -> bytes:
    """Six all-reduces on every rank, then a broadcast that rank ``_BEHIND`` never joins; the dump."""
    for _ in range(6):
        dist.all_reduce(torch.ones(16))
    try:
        if rank == _BEHIND:
            time.sleep(_FR_TIMEOUT_S + 0.5)  # busy elsewhere: never issues the broadcast
        else:
            dist.broadcast(torch.ones(4), src=0)
    except RuntimeError:  # the peers' timeout: expected
        pass
    return torch._C._distributed_c10d._dump_fr_trace()


def _real_dumps() -> dict[int, dict[str, Any]]:
    try:
        raw = launch(
            _hang_and_dump,
            3,
            backend="gloo",
            collective_timeout_s=_FR_TIMEOUT_S,
            timeout_s=30.0,
            env={"TORCH_FR_BUFFER_SIZE": "4"},
        )
    except LaunchError as exc:  # not the student's fault: say so plainly
        raise RuntimeError(f"the grader's own 3-process job failed: {str(exc)[:300]}") from None
    return {rank: pickle.loads(blob) for rank, blob in enumerate(raw)}


def _check_answer(answer: object, want_rank: int, dumps_note: str, want_name: str = _SKIPPED) -> None:
    if not (isinstance(answer, tuple | list) and len(answer) == 2):
        raise Wrong(f"it returned {answer!r}; return a tuple (rank, collective).")
    rank, name = answer
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise Wrong(f"the rank it returned is {rank!r}, not a rank number (an int).")
    if rank != want_rank:
        raise Wrong(
            f"{dumps_note}it named rank {rank}, but rank {rank} issued as many collectives as the "
            "others or more: it is not the one behind."
        )
    if name != want_name:
        raise Wrong(
            f"{dumps_note}it named the right rank but the collective {name!r}, which is not the one the "
            "other ranks issued next."
        )


@exercise(
    "07c.1",
    "find the rank that is behind in Flight Recorder dumps",
    task="who_is_behind(dumps) returns (rank, profiling_name): the rank that issued the fewest collectives "
    "and the collective the other ranks issued next. Called on real Flight Recorder dumps of a hung "
    "3-process gloo job with a 4-entry ring buffer, then on the same dumps with the ranks relabelled, and "
    "relabelled again with all-reduce and broadcast swapped; unmatched_collective is refused.",
    hint="compare the ranks' collective sequence numbers (collective_seq_id), not how many entries each "
    "dump holds: the recorder is a ring buffer and keeps only its last N entries.",
    forbid=("unmatched_collective",),  # §4's fallback reads the dumps this way: the answer key
)
def _grade_behind(who_is_behind: Callable[[dict[int, dict[str, Any]]], object]) -> str:
    dumps = _real_dumps()
    _check_answer(who_is_behind({r: d for r, d in dumps.items()}), _BEHIND, "")
    relabelled = {(r + 1) % len(dumps): d for r, d in dumps.items()}  # the behind dump is now rank 0
    _check_answer(
        who_is_behind(relabelled),
        (_BEHIND + 1) % len(dumps),
        "with the ranks relabelled (rank r's dump given as rank r+1, the last as rank 0) ",
    )
    swap = {_SKIPPED: "gloo:all_reduce", "gloo:all_reduce": _SKIPPED}
    renamed = {  # the same job had it issued broadcasts and skipped an all-reduce
        (r + 2) % len(dumps): {
            **d,
            "entries": [
                {**e, "profiling_name": swap.get(e["profiling_name"], e["profiling_name"])}
                for e in d["entries"]
            ],
        }
        for r, d in dumps.items()
    }
    _check_answer(
        who_is_behind(renamed),
        (_BEHIND + 2) % len(dumps),
        "with the ranks relabelled (r as r+2) and the kinds swapped (every all-reduce a broadcast and the "
        "skipped broadcast an all-reduce) ",
        want_name="gloo:all_reduce",
    )
    return (
        "on real dumps of a hung 3-process gloo job with a 4-entry ring buffer it named the rank that "
        "skipped the collective and the collective, also with the ranks relabelled and the kinds swapped"
    )


# ------------------------------------------------------------------------------------------ 07c.2
def _profiled_sizes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """The grader's own reading: elements of every all-reduce in one profiled step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        F.cross_entropy(model(x), y).backward()
    return sorted(math.prod(e.input_shapes[0]) for e in prof.events() if e.name.endswith(":all_reduce"))


_USE = [(32, 96), (96, 96), (96, 32)] * 3 + [(32, 10)]  # the Linear layers, in the order forward uses them
_REGISTERED = [1, 4, 7, 9, 0, 3, 6, 2, 5, 8]  # the order they are registered in (model.parameters())


class _Shuffled(torch.nn.Module):
    """An MLP whose layers are registered in another order than forward uses them: DDP's rebuilt buckets
    follow the order gradients become ready, so guessing the buckets from ``parameters()`` goes wrong."""

    def __init__(self) -> None:
        super().__init__()
        for i in _REGISTERED:
            self.add_module(f"layer{i}", torch.nn.Linear(*_USE[i]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(len(_USE)):
            x = getattr(self, f"layer{i}")(x)
            x = torch.relu(x) if i < len(_USE) - 1 else x
        return x


def _ddp_job(rank: int, world_size: int, fn: Callable[..., object]) -> tuple[object, list[int], int]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    # 0.05 MB buckets: 3 all-reduces, two of the same size; not those of the parameters' reverse order
    model = DDP(_Shuffled(), bucket_cap_mb=0.05)
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    F.cross_entropy(model(x), y).backward()  # warm-up: DDP rebuilds its buckets after the first step
    model.zero_grad(set_to_none=True)
    profiled: list[bool] = []  # was a profiler recording when the student's step ran forward and backward?
    recording = torch.autograd._profiler_enabled
    pre = model.module.register_forward_pre_hook(lambda *_: profiled.append(recording()))
    post = getattr(model.module, f"layer{len(_USE) - 1}").weight.register_hook(
        lambda g: profiled.append(recording())
    )
    try:
        got = fn(model, x, y)
    finally:
        pre.remove(), post.remove()
    hook = model._get_ddp_logging_data().get("comm_hook")  # 04a's way of seeing buckets, not the profile's
    if hook:
        got = ("comm hook", hook)
    elif len(profiled) != 2:  # one forward and one backward
        got = ("steps", len(profiled) // 2)
    elif not all(profiled):
        got = ("not profiled",)
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    model.zero_grad(set_to_none=True)
    return got, _profiled_sizes(model, x, y), sum(p.numel() for p in model.parameters())


@exercise(
    "07c.2",
    "read DDP's all-reduces from a profile",
    task="allreduce_sizes(ddp_model, x, y) profiles one training step (forward, F.cross_entropy, backward) "
    "with torch.profiler and returns the sorted element counts of every all-reduce it made. On both ranks of "
    "a 2-process gloo DDP job with small buckets, after a warm-up step, the grader checks that a profiler "
    "recorded your forward and backward and that no communication hook was registered, and compares with its "
    "own profile of the next step.",
    hint="profile with record_shapes=True; the backend's all-reduce events are named like "
    "'gloo:all_reduce' and their input shape is the bucket. A row of key_averages() can stand for "
    "several calls.",
)
def _grade_sizes(allreduce_sizes: Callable[..., object]) -> str:
    try:
        with captured_native_stderr():  # the profiler's C++ start/stop log lines
            results = launch(_ddp_job, 2, args=(allreduce_sizes,), backend="gloo", timeout_s=60.0)
    except LaunchError as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
        raise Wrong(f"a rank raised: {(errors or lines)[-1].strip()[:200]}") from None
    for rank, (got, want, params) in enumerate(results):
        if isinstance(got, tuple) and got[:1] == ("steps",):
            raise Wrong(
                f"rank {rank}: your function ran {got[1]} training step(s); profile exactly one step."
            )
        if isinstance(got, tuple) and got[:1] == ("comm hook",):
            raise Wrong(
                f"rank {rank}: your function registered a communication hook ({got[1]}); leave DDP as it "
                "is and read the all-reduces from the profile of the step."
            )
        if isinstance(got, tuple) and got[:1] == ("not profiled",):
            raise Wrong(
                f"rank {rank}: no profiler was recording while your function ran the step's forward and "
                "backward: read the sizes from a profile of the step, not from elsewhere."
            )
        if not isinstance(got, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in got
        ):
            raise Wrong(f"rank {rank} returned {got!r}; return a list of element counts (ints).")
        if list(got) != sorted(got):
            raise Wrong(f"rank {rank} returned {list(got)}, which is not sorted.")
        if len(got) != len(want):
            raise Wrong(
                f"rank {rank} returned {len(got)} all-reduce(s), but the profiled step made {len(want)}."
            )
        if list(got) != want:
            raise Wrong(
                f"rank {rank} returned sizes {list(got)}; the profiled step's all-reduces had other sizes "
                f"(together they carry every gradient: {params:,} elements)."
            )
    return (
        f"on both ranks of a 2-process gloo DDP job it read {len(want)} all-reduces, "
        f"{sum(want):,} elements = every parameter's gradient"
    )
