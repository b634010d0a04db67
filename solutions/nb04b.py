"""Reference solutions of notebook 04b's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def shard_epochs(dataset, epochs):
    local_rank = int(os.environ["LOCAL_RANK"])  # its index on its own node
    gpu = local_rank  # the GPU this process drives: torch.cuda.set_device(gpu)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, shuffle=False)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen.append([i for batch in loader for i in batch.tolist()])
    return {"gpu": gpu, "seen": seen}


def shard_epochs_without_set_epoch(dataset, epochs):
    """Passes the sampler and picks the right GPU, but every epoch replays the first shuffle."""
    local_rank = int(os.environ["LOCAL_RANK"])
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, shuffle=False)
    return {
        "gpu": local_rank,
        "seen": [[i for batch in loader for i in batch.tolist()] for _ in range(epochs)],
    }


def accumulate(ddp_model, micro_batches):
    *first, last = micro_batches
    with ddp_model.no_sync():  # backward only adds into .grad: no all-reduce
        for x, y in first:
            (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()
    x, y = last
    (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()  # all-reduces the accumulated sum


def accumulate_without_no_sync(ddp_model, micro_batches):
    """The right gradient, but DDP all-reduces after every micro-batch: k times the communication."""
    for x, y in micro_batches:
        (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()


SOLUTIONS = {"04b.1": (shard_epochs,), "04b.2": (accumulate,)}
WRONG = {"04b.1": (shard_epochs_without_set_epoch,), "04b.2": (accumulate_without_no_sync,)}


# --- shortcuts: right-looking results without the lesson (tests/test_solutions.py checks each is rejected) --


def shard_epochs_sampler_indices(dataset, epochs):
    """Right GPU, set_epoch called, but reports the sampler's indices instead of loading the items."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen.append(list(sampler))
    return {"gpu": int(os.environ["LOCAL_RANK"]), "seen": seen}


def shard_epochs_grader_case_by_hand(dataset, epochs):
    """The grader's 24 items and 2 ranks hard-coded: a fresh permutation of range(24) per epoch, split
    by rank, with no sampler and no loader."""
    rank = dist.get_rank()
    orders = [torch.randperm(24, generator=torch.Generator().manual_seed(e)) for e in range(epochs)]
    seen = [order[rank::2].tolist() for order in orders]
    return {"gpu": int(os.environ["LOCAL_RANK"]), "seen": seen}


def shard_epochs_fixed_share_rotated(dataset, epochs):
    """Disjoint shares and a 'new order' every epoch without a shuffle: each rank keeps the same items
    forever and only rotates them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [i for batch in DataLoader(dataset[rank::world], batch_size=4) for i in batch.tolist()]
    return {"gpu": int(os.environ["LOCAL_RANK"]), "seen": [mine[e:] + mine[:e] for e in range(epochs)]}


def accumulate_all_reducing_by_hand(ddp_model, micro_batches):
    """Every backward inside no_sync(), then the gradients all-reduced by hand: DDP never communicates."""
    with ddp_model.no_sync():
        for x, y in micro_batches:
            (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()
    for p in ddp_model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def accumulate_with_an_extra_syncing_pass(ddp_model, micro_batches):
    """Every micro-batch inside no_sync(), then one more forward and backward of a zero loss outside it,
    only to trigger DDP's all-reduce."""
    with ddp_model.no_sync():
        for x, y in micro_batches:
            (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()
    (0 * ddp_model(micro_batches[0][0]).sum()).backward()


def accumulate_one_large_batch(ddp_model, micro_batches):
    """No accumulation at all: the micro-batches concatenated into one forward and backward."""
    xs, ys = zip(*micro_batches, strict=True)
    F.cross_entropy(ddp_model(torch.cat(xs)), torch.cat(ys)).backward()


def accumulate_one_summed_backward(ddp_model, micro_batches):
    """Each micro-batch its own forward, but the losses summed into one backward outside no_sync(): one
    all-reduce and the right gradient, with every micro-batch's activations kept at once."""
    (sum(F.cross_entropy(ddp_model(x), y) for x, y in micro_batches) / len(micro_batches)).backward()


SHORTCUTS = {
    "04b.1": {
        "sampler_indices_instead_of_items": (shard_epochs_sampler_indices,),
        "graders_case_by_hand": (shard_epochs_grader_case_by_hand,),
        "fixed_share_rotated": (shard_epochs_fixed_share_rotated,),
    },
    "04b.2": {
        "all_reduce_by_hand": (accumulate_all_reducing_by_hand,),
        "extra_syncing_pass": (accumulate_with_an_extra_syncing_pass,),
        "one_large_batch": (accumulate_one_large_batch,),
        "one_summed_backward": (accumulate_one_summed_backward,),
    },
}
