"""Reference solutions of notebook 03a's exercises and typical wrong attempts (tests/test_solutions.py).

Written as a student would in the notebook: ``B`` is the notebook's backend (the real ``torch.nn.parallel``
with two or more GPUs, virtual devices otherwise).
"""

import torch
import torch.nn.functional as F
from torch import nn

from mgpu_helpers import data_parallel as dp

B = dp.backend()


def data_parallel_forward(module, x, device_ids, output_device, dim=0):
    chunks = B.parallel.scatter(x, device_ids, dim)
    used = device_ids[: len(chunks)]  # a small batch can leave devices without a chunk
    replicas = B.parallel.replicate(module, used)
    outputs = B.parallel.parallel_apply(replicas, chunks, devices=used)
    return B.parallel.gather(outputs, output_device, dim)


def data_parallel_forward_fixed_dim(module, x, device_ids, output_device, dim=0):
    """Ignores ``dim`` and ``output_device`` (the section-1 code pasted as it was)."""
    chunks = B.parallel.scatter(x, device_ids)
    used = device_ids[: len(chunks)]
    replicas = B.parallel.replicate(module, used)
    outputs = B.parallel.parallel_apply(replicas, chunks, devices=used)
    return B.parallel.gather(outputs, device_ids[0])


class WithLoss(nn.Module):
    # Computes the loss inside forward: one loss per *sample*, so gathering concatenates the whole batch's
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return F.cross_entropy(self.model(x), y, reduction="none")


def train(model, batches, device_ids, lr=0.5):
    parallel = B.DataParallel(WithLoss(model), device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = parallel(x, y).mean()  # the mean over every sample of the batch, however it was split
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


class MeanLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return F.cross_entropy(self.model(x), y)


def train_mean_of_means(model, batches, device_ids, lr=0.5):
    """The notes' ``loss.mean().backward()`` on per-device mean losses: right only for equal chunks."""
    parallel = B.DataParallel(MeanLoss(model), device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = parallel(x, y).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


SOLUTIONS = {"03a.1": (data_parallel_forward,), "03a.2": (train,)}
WRONG = {"03a.1": (data_parallel_forward_fixed_dim,), "03a.2": (train_mean_of_means,)}
