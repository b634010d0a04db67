"""Reference solutions of notebook 04b's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import os

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
