"""Reference solutions of notebook 04c's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils.data import DataLoader, DistributedSampler, Subset


def evaluate(model, dataset):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = Subset(dataset, range(rank, len(dataset), world_size))  # every sample exactly once, no padding
    correct = torch.zeros(2, dtype=torch.float64)  # [correct, count]
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(mine, batch_size=8):
            correct[0] += (model(x).argmax(dim=1) == y).sum()
            correct[1] += len(y)
    dist.all_reduce(correct)  # sums over the ranks, not averages of their accuracies
    return (correct[0] / correct[1]).item()


def evaluate_averaging_accuracies(model, dataset):
    """Each rank's accuracy on its padded DistributedSampler share, averaged over the ranks."""
    sampler = DistributedSampler(dataset, shuffle=False)
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=8, sampler=sampler):
            correct += (model(x).argmax(dim=1) == y).sum().item()
            total += len(y)
    accuracy = torch.tensor([correct / total], dtype=torch.float64)
    dist.all_reduce(accuracy)
    return (accuracy / dist.get_world_size()).item()


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
WRONG = {"04c.1": (evaluate_averaging_accuracies,), "04c.2": (sync_batch_norm_invisible_to_autograd,)}
