"""Reference solutions of notebook 04c's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.utils.data import DistributedSampler


def evaluate(model, dataset):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    sampler = DistributedSampler(dataset, shuffle=False)  # pads to sampler.total_size indices
    x, y = dataset[list(sampler)]  # this rank's share, repeats included
    model.eval()
    # this rank's i-th sample is at position rank + i * world_size of the padded list; past len: a repeat
    real = torch.arange(len(y)) * world_size + rank < len(dataset)
    with torch.no_grad():
        logits = model(x)
    sums = torch.stack(
        [
            F.cross_entropy(logits[real], y[real], reduction="sum").double(),
            (logits.argmax(dim=1) == y)[real].sum().double(),
            real.sum().double(),
        ]
    )
    dist.all_reduce(sums)  # [loss sum, correct, samples] over all ranks
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def evaluate_counting_repeats(model, dataset):
    """Sums and counts all-reduced, but over the padded shares: the repeats count twice."""
    sampler = DistributedSampler(dataset, shuffle=False)
    x, y = dataset[list(sampler)]
    model.eval()
    with torch.no_grad():
        logits = model(x)
    sums = torch.stack(
        [
            F.cross_entropy(logits, y, reduction="sum").double(),
            (logits.argmax(dim=1) == y).sum().double(),
            torch.tensor(float(len(y)), dtype=torch.float64),
        ]
    )
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def sync_batch_norm(x, bn):
    local = torch.cat([x.sum(dim=0), (x * x).sum(dim=0), x.new_full((1,), x.shape[0])])
    total = funcol.all_reduce(local, "sum", dist.group.WORLD)  # autograd-aware: backward all-reduces too
    c = x.shape[1]
    count = total[2 * c]
    mean = total[:c] / count
    var = total[c : 2 * c] / count - mean * mean  # biased: what normalises the batch
    with torch.no_grad():
        bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
        bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * count / (count - 1))  # unbiased
        bn.num_batches_tracked += 1
    return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias


def sync_batch_norm_invisible_to_autograd(x, bn):
    """The right statistics with dist.all_reduce, which autograd does not see: wrong input gradients."""
    c = x.shape[1]
    total = torch.cat([x.sum(dim=0), (x * x).sum(dim=0), x.new_full((1,), x.shape[0])])
    dist.all_reduce(total)
    count = total[2 * c]
    mean = total[:c] / count
    var = total[c : 2 * c] / count - mean * mean
    with torch.no_grad():
        bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
        bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * count / (count - 1))
        bn.num_batches_tracked += 1
    return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias


SOLUTIONS = {"04c.1": (evaluate,), "04c.2": (sync_batch_norm,)}
WRONG = {"04c.1": (evaluate_counting_repeats,), "04c.2": (sync_batch_norm_invisible_to_autograd,)}
