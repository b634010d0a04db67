"""Reference solutions of notebook 07c's exercises and typical wrong attempts (tests/test_solutions.py)."""

import math

import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def who_is_behind(dumps):
    last = {rank: max(e["collective_seq_id"] for e in d["entries"]) for rank, d in dumps.items()}
    behind = min(last, key=last.get)
    waited_in = next(
        e["profiling_name"]
        for rank, d in dumps.items()
        if rank != behind
        for e in d["entries"]
        if e["collective_seq_id"] == last[behind] + 1
    )
    return behind, waited_in


def who_is_behind_by_length(dumps):
    """Counts the entries in each dump: with a wrapped ring buffer every dump holds the same number."""
    behind = min(dumps, key=lambda rank: len(dumps[rank]["entries"]))
    other = next(rank for rank in dumps if rank != behind)
    return behind, dumps[other]["entries"][-1]["profiling_name"]


def allreduce_sizes(ddp_model, x, y):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        F.cross_entropy(ddp_model(x), y).backward()
    return sorted(math.prod(e.input_shapes[0]) for e in prof.events() if e.name.endswith(":all_reduce"))


def allreduce_sizes_one_per_row(ddp_model, x, y):
    """Reads key_averages() but takes one size per row: buckets of equal size share a row (count > 1)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        F.cross_entropy(ddp_model(x), y).backward()
    rows = prof.key_averages(group_by_input_shape=True)
    return sorted(math.prod(e.input_shapes[0]) for e in rows if e.key.endswith(":all_reduce"))


def who_is_behind_named_broadcast(dumps):
    """Finds the rank by sequence number, but writes in the kind of collective this job skipped."""
    last = {rank: max(e["collective_seq_id"] for e in d["entries"]) for rank, d in dumps.items()}
    return min(last, key=last.get), "gloo:broadcast"


def who_is_behind_by_helper(dumps):
    """The package's analyser of §4 does the whole reading: the answer key."""
    from mgpu_helpers.troubleshoot import unmatched_collective

    finding = unmatched_collective(dumps)
    return min(finding["missing ranks"]), finding["collective"]


def allreduce_sizes_from_ddp_logging(ddp_model, x, y):
    """Runs the step unprofiled and returns DDP's own bucket sizes (bytes / 4): no profile read."""
    F.cross_entropy(ddp_model(x), y).backward()
    sizes = ddp_model._get_ddp_logging_data()["bucket_sizes"]
    return sorted(int(b) // 4 for b in str(sizes).split(","))


def allreduce_sizes_one_per_parameter(ddp_model, x, y):
    """Profiles the step but returns every parameter's size: what DDP would send without buckets."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
        F.cross_entropy(ddp_model(x), y).backward()
    return sorted(p.numel() for p in ddp_model.parameters())


def allreduce_sizes_simulated_buckets(ddp_model, x, y):
    """Records a profile but never reads it: simulates DDP's buckets (parameters in reverse, cut once a
    bucket reaches bucket_bytes_cap) — wrong when the gradients become ready in another order."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
        F.cross_entropy(ddp_model(x), y).backward()
    sizes, elements, size_bytes = [], 0, 0
    for p in reversed(list(ddp_model.module.parameters())):
        elements, size_bytes = elements + p.numel(), size_bytes + p.numel() * p.element_size()
        if size_bytes >= ddp_model.bucket_bytes_cap:
            sizes.append(elements)
            elements = size_bytes = 0
    return sorted(sizes + ([elements] if elements else []))


def allreduce_sizes_logging_data_after_an_extra_step(ddp_model, x, y):
    """Runs one more step so that DDP logs its rebuilt buckets, profiles one, and returns the logged sizes
    (bytes / 4) instead of reading the profile."""
    for _ in range(2):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            F.cross_entropy(ddp_model(x), y).backward()
    sizes = ddp_model._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    return sorted(int(b) // 4 for b in str(sizes).split(","))


def allreduce_sizes_from_a_comm_hook(ddp_model, x, y):
    """Profiles the step but takes the sizes from 04a's communication hook (each bucket's buffer), which
    does the all-reduce itself: the profile is never read."""
    import torch.distributed as dist

    seen = []

    def hook(state, bucket):
        seen.append(bucket.buffer().numel())
        buffer = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])

    ddp_model.register_comm_hook(None, hook)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
        F.cross_entropy(ddp_model(x), y).backward()
    return sorted(seen)


SOLUTIONS = {"07c.1": (who_is_behind,), "07c.2": (allreduce_sizes,)}
WRONG = {"07c.1": (who_is_behind_by_length,), "07c.2": (allreduce_sizes_one_per_row,)}
SHORTCUTS = {
    "07c.1": {
        "kind_written_in": (who_is_behind_named_broadcast,),
        "package_analyser": (who_is_behind_by_helper,),
    },
    "07c.2": {
        "ddp_logging_data": (allreduce_sizes_from_ddp_logging,),
        "one_per_parameter": (allreduce_sizes_one_per_parameter,),
        "simulated_buckets": (allreduce_sizes_simulated_buckets,),
        "ddp_logging_data_after_an_extra_step": (allreduce_sizes_logging_data_after_an_extra_step,),
        "comm_hook": (allreduce_sizes_from_a_comm_hook,),
    },
}
