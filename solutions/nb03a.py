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


# --- shortcuts: the right numbers without the mechanism the exercise teaches (each must get a ❌) --------


def forward_whole_batch(module, x, device_ids, output_device, dim=0):
    """No split at all: the unsplit model on device 0, its output moved to ``output_device``."""
    return B.parallel.gather([module(x)], output_device, dim)


def forward_by_a_built_name(module, x, device_ids, output_device, dim=0):
    """The ready-made class, its name assembled at run time so that no forbidden name is written."""
    ready = getattr(B, "Data" + "Parallel")  # the backend's DataParallel class
    return ready(module, device_ids=device_ids, output_device=output_device, dim=dim)(x)


def forward_chunks_without_replicas(module, x, device_ids, output_device, dim=0):
    """Chunks sent to every device, but all fed to the one original model (its weights on device 0)."""
    chunks = B.parallel.scatter(x, device_ids, dim)
    return B.parallel.gather([module(c) for c in chunks], output_device, dim)


def forward_replicas_one_after_another(module, x, device_ids, output_device, dim=0):
    """Replicas and chunks, but run in a loop in the caller's thread instead of parallel_apply."""
    chunks = B.parallel.scatter(x, device_ids, dim)
    replicas = B.parallel.replicate(module, device_ids[: len(chunks)])
    outputs = [r(c) for r, c in zip(replicas, chunks, strict=True)]
    return B.parallel.gather(outputs, output_device, dim)


def train_plain(model, batches, device_ids, lr=0.5):
    """Plain single-device training: the same losses and weights, no data parallelism."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_plain_beside_data_parallel(model, batches, device_ids, lr=0.5):
    """DataParallel runs, but only for show: the step is taken with the plain model on the whole batch."""
    parallel = B.DataParallel(WithLoss(model), device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        with torch.no_grad():
            parallel(x, y)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_chunks_in_one_thread(model, batches, device_ids, lr=0.5):
    """Gradient accumulation over the chunks, one after the other on one device: split, not parallel."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        total = 0.0
        for xc, yc in zip(x.chunk(len(device_ids)), y.chunk(len(device_ids)), strict=True):
            loss = F.cross_entropy(model(xc), yc, reduction="sum") / len(x)
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


def train_loss_after_gather(model, batches, device_ids, lr=0.5):
    """The loss moved out of the wrapped model: DataParallel gathers logits, the loss is taken on device 0.

    Right numbers, but it skips the exercise's point (per-device losses, and when their mean is exact)."""
    parallel = B.DataParallel(model, device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(parallel(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_by_hand_logits_gathered(model, batches, device_ids, lr=0.5):
    """The four calls by hand with the loss after gather: the same shortcut without DataParallel."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        chunks = B.parallel.scatter(x, device_ids)
        used = device_ids[: len(chunks)]
        outputs = B.parallel.parallel_apply(B.parallel.replicate(model, used), chunks, devices=used)
        loss = F.cross_entropy(B.parallel.gather(outputs, device_ids[0]), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


SOLUTIONS = {"03a.1": (data_parallel_forward,), "03a.2": (train,)}
WRONG = {"03a.1": (data_parallel_forward_fixed_dim,), "03a.2": (train_mean_of_means,)}
SHORTCUTS = {
    "03a.1": {
        "whole_batch_on_one_device": (forward_whole_batch,),
        "chunks_without_replicas": (forward_chunks_without_replicas,),
        "ready_made_by_a_built_name": (forward_by_a_built_name,),
        "replicas_one_after_another": (forward_replicas_one_after_another,),
    },
    "03a.2": {
        "plain_single_device_training": (train_plain,),
        "plain_step_beside_data_parallel": (train_plain_beside_data_parallel,),
        "chunks_in_one_thread": (train_chunks_in_one_thread,),
        "loss_after_gather_on_device_0": (train_loss_after_gather,),
        "loss_after_gather_by_hand": (train_by_hand_logits_gathered,),
    },
}
