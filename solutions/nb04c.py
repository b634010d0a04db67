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


class AllReduceSum(torch.autograd.Function):
    """Sum over the ranks, seen by autograd (as in the notebook's §3): backward sums over the ranks too."""

    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def sync_batch_norm(x, bn):
    local = torch.cat([x.sum(dim=0), (x * x).sum(dim=0), x.new_full((1,), x.shape[0])])
    total = AllReduceSum.apply(local)  # 2 x features + 1 numbers; backward all-reduces as many
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


# --- shortcuts: right numbers without the lesson (tests/test_solutions.py checks the graders reject each) --


def evaluate_gathering_every_prediction(model, dataset):
    """Each rank evaluates its share, then every rank gathers every sample's (index, loss, correct) and
    removes the repeats: exact, but it communicates per-sample values (grows with the dataset)."""
    sampler = DistributedSampler(dataset, shuffle=False)
    indices = list(sampler)
    x, y = dataset[indices]
    model.eval()
    with torch.no_grad():
        logits = model(x)
    mine = list(
        zip(
            indices,
            F.cross_entropy(logits, y, reduction="none").tolist(),
            (logits.argmax(dim=1) == y).tolist(),
            strict=True,
        )
    )
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    unique = {i: (loss, correct) for rows in everyone for i, loss, correct in rows}
    losses, corrects = zip(*unique.values(), strict=True)
    return sum(losses) / len(unique), sum(corrects) / len(unique)


def evaluate_whole_dataset_with_the_weights(model, dataset):
    """Every rank evaluates the whole dataset with the model's weights, around the model: no sharding, no
    communication."""
    x, y = dataset.tensors
    with torch.no_grad():
        logits = F.linear(x, model.linear.weight, model.linear.bias)
    return F.cross_entropy(logits, y).item(), (logits.argmax(dim=1) == y).double().mean().item()


def evaluate_from_the_graders_case(model, dataset):
    """The grader's own case builder used as the answer key."""
    from mgpu_helpers.graders import nb04c as grader

    return grader._eval_truth()


def _all_rows(x):
    """Every rank's rows, gathered with an autograd-aware all-gather (padded to the longest share)."""
    world = dist.get_world_size()
    sizes = [None] * world
    dist.all_gather_object(sizes, x.shape[0])
    padded = torch.cat([x, x.new_zeros(max(sizes) - x.shape[0], x.shape[1])])
    gathered = funcol.all_gather_tensor_autograd(padded, 0, dist.group.WORLD)
    chunks = gathered.split(max(sizes))
    start = sum(sizes[: dist.get_rank()])
    return torch.cat([c[:n] for c, n in zip(chunks, sizes, strict=True)]), slice(start, start + x.shape[0])


def sync_batch_norm_gathering_all_rows(x, bn):
    """Every rank gathers every row and computes the whole batch's statistics: right, but it moves the
    batch (the unscalable way of §3)."""
    whole, mine = _all_rows(x)
    mean, var = whole.mean(dim=0), whole.var(dim=0, unbiased=False)
    n = whole.shape[0]
    with torch.no_grad():
        bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
        bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * n / (n - 1))
        bn.num_batches_tracked += 1
    return ((whole - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias)[mine]


def sync_batch_norm_gathering_into_f_batch_norm(x, bn):
    """Every rank gathers every row and lets torch's own batch norm do the rest."""
    whole, mine = _all_rows(x)
    out = F.batch_norm(whole, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, bn.momentum, bn.eps)
    return out[mine]


SHORTCUTS = {
    "04c.1": {
        "gather_every_prediction": (evaluate_gathering_every_prediction,),
        "whole_dataset_with_the_weights": (evaluate_whole_dataset_with_the_weights,),
        "graders_case_as_answer_key": (evaluate_from_the_graders_case,),
    },
    "04c.2": {
        "gather_all_rows": (sync_batch_norm_gathering_all_rows,),
        "gather_rows_into_F_batch_norm": (sync_batch_norm_gathering_into_f_batch_norm,),
    },
}
