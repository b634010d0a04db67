"""Reference solutions of notebook 02a's exercises, and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mgpu_helpers.pipeline import make_stages

WIDTH, LAYERS = 512, 2


class TwoDeviceNet(nn.Module):
    """The notebook's naive split: part1 on dev0; part2 and the output layer fc on dev1."""

    def __init__(self, dev0, dev1):
        super().__init__()
        first, second = make_stages(2, WIDTH, LAYERS)
        self.dev0, self.dev1 = torch.device(dev0), torch.device(dev1)
        self.part1 = first.to(self.dev0)
        self.part2 = second[:-1].to(self.dev1)
        self.fc = second[-1].to(self.dev1)

    def forward(self, x):
        x = self.part1(x.to(self.dev0))
        return self.fc(self.part2(x.to(self.dev1)))


class PipelinedTwoDeviceNet(TwoDeviceNet):
    def __init__(self, dev0, dev1, split_size=64):
        super().__init__(dev0, dev1)
        self.split_size = split_size

    def forward(self, x):
        splits = iter(x.split(self.split_size))
        s_prev = self.part1(next(splits).to(self.dev0)).to(self.dev1)
        outputs = []
        for s_next in splits:
            outputs.append(self.fc(self.part2(s_prev)))  # dev1 works on micro-batch i ...
            s_prev = self.part1(s_next.to(self.dev0)).to(self.dev1)  # ... while dev0 starts i + 1
        outputs.append(self.fc(self.part2(s_prev)))
        return torch.cat(outputs)


class PipelinedForgetsTheLastMicrobatch(TwoDeviceNet):
    """The tutorial's loop without the step after it: the last micro-batch never reaches part2."""

    def __init__(self, dev0, dev1, split_size=64):
        super().__init__(dev0, dev1)
        self.split_size = split_size

    def forward(self, x):
        splits = iter(x.split(self.split_size))
        s_prev = self.part1(next(splits).to(self.dev0)).to(self.dev1)
        outputs = []
        for s_next in splits:
            outputs.append(self.fc(self.part2(s_prev)))
            s_prev = self.part1(s_next.to(self.dev0)).to(self.dev1)
        return torch.cat(outputs)


def gpipe_step(rank, world_size, stage, x, y, m):
    first, last = rank == 0, rank == world_size - 1
    xs, ys = x.chunk(m), y.chunk(m)
    inputs, outputs, sends = [], [], []
    for i in range(m):  # fill: all forwards
        if first:
            inp = xs[i]
        else:
            inp = torch.empty(len(xs[i]), x.shape[1])
            dist.recv(inp, src=rank - 1)
            inp.requires_grad_()
        out = stage(inp)
        if last:
            out = F.mse_loss(out, ys[i]) / m
        else:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        inputs.append(inp)
        outputs.append(out)
    for i in range(m):  # drain: all backwards
        if last:
            outputs[i].backward()
        else:
            grad = torch.empty_like(outputs[i])
            dist.recv(grad, src=rank + 1)
            outputs[i].backward(grad)
        if not first:
            sends.append(dist.isend(inputs[i].grad, dst=rank - 1))
    for work in sends:
        work.wait()
    return sum(out.item() for out in outputs) if last else None


def gpipe_step_without_1_over_m(rank, world_size, stage, x, y, m):
    """Each micro-batch's loss counts fully: the gradients come out m times too large."""
    first, last = rank == 0, rank == world_size - 1
    xs, ys = x.chunk(m), y.chunk(m)
    inputs, outputs, sends = [], [], []
    for i in range(m):
        if first:
            inp = xs[i]
        else:
            inp = torch.empty(len(xs[i]), x.shape[1])
            dist.recv(inp, src=rank - 1)
            inp.requires_grad_()
        out = stage(inp)
        if last:
            out = F.mse_loss(out, ys[i])
        else:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        inputs.append(inp)
        outputs.append(out)
    for i in range(m):
        if last:
            outputs[i].backward()
        else:
            grad = torch.empty_like(outputs[i])
            dist.recv(grad, src=rank + 1)
            outputs[i].backward(grad)
        if not first:
            sends.append(dist.isend(inputs[i].grad, dst=rank - 1))
    for work in sends:
        work.wait()
    return sum(out.item() for out in outputs) / m if last else None


SOLUTIONS = {"02a.1": (PipelinedTwoDeviceNet,), "02a.2": (gpipe_step,)}
WRONG = {"02a.1": (PipelinedForgetsTheLastMicrobatch,), "02a.2": (gpipe_step_without_1_over_m,)}
