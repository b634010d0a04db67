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


# --- shortcuts: the right numbers without the lesson ---------------------------------------------------
# Not a shortcut: the one-line loop
#     torch.cat([self.fc(self.part2(self.part1(s.to(self.dev0)).to(self.dev1))) for s in x.split(n)])
# calls the parts in exactly the order of the tutorial's loop above (part1(0), part2(0), fc(0), part1(1),
# ...). Neither waits on the host, so on GPUs both overlap the devices the same way (kernels are queued
# asynchronously); on the CPU neither does. The grader accepts it.


class WholeBatchThroughBothParts(TwoDeviceNet):
    """The naive split of §2: no micro-batches at all."""

    def __init__(self, dev0, dev1, split_size=64):
        super().__init__(dev0, dev1)
        self.split_size = split_size


class UnsplitModelPerMicrobatch(TwoDeviceNet):
    """Micro-batches, but the whole model on one device: no .to(dev1), so nothing is model parallel."""

    def __init__(self, dev0, dev1, split_size=64):
        super().__init__(dev0, dev1)
        self.split_size = split_size

    def forward(self, x):
        whole = nn.Sequential(self.part1, self.part2, self.fc)
        return torch.cat([whole(s) for s in x.split(self.split_size)])


class OutputsBackOnTheHost(TwoDeviceNet):
    """Brings every micro-batch's output back to the input's device (the CPU in the tutorial): a copy to
    the CPU makes the host wait for the GPU, so cuda:0 never runs ahead of cuda:1."""

    def __init__(self, dev0, dev1, split_size=64):
        super().__init__(dev0, dev1)
        self.split_size = split_size

    def forward(self, x):
        outs = []
        for s in x.split(self.split_size):
            h = self.part2(self.part1(s.to(self.dev0)).to(self.dev1))
            outs.append(self.fc(h).to(x.device))
        return torch.cat(outs)


class FcOnceOnTheJoinedOutputs(TwoDeviceNet):
    """Micro-batches through part1 and part2, then one fc call on all of them joined: not a pipeline to the
    end (fc waits for every micro-batch)."""

    def __init__(self, dev0, dev1, split_size=64):
        super().__init__(dev0, dev1)
        self.split_size = split_size

    def forward(self, x):
        hs = [self.part2(self.part1(s.to(self.dev0)).to(self.dev1)) for s in x.split(self.split_size)]
        return self.fc(torch.cat(hs))


def gpipe_step_one_microbatch_at_a_time(rank, world_size, stage, x, y, m):
    """Right gradients, no pipeline: each micro-batch goes forward and back before the next starts."""
    first, last = rank == 0, rank == world_size - 1
    xs, ys = x.chunk(m), y.chunk(m)
    total = 0.0
    for i in range(m):
        if first:
            inp = xs[i]
        else:
            inp = torch.empty(len(xs[i]), x.shape[1])
            dist.recv(inp, src=rank - 1)
            inp.requires_grad_()
        out = stage(inp)
        if last:
            loss = F.mse_loss(out, ys[i]) / m
            loss.backward()
            total += loss.item()
        else:
            dist.send(out.detach(), dst=rank + 1)
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if not first:
            dist.send(inp.grad, dst=rank - 1)
    return total if last else None


def gpipe_step_whole_batch_on_every_rank(rank, world_size, stage, x, y, m):
    """No communication at all: every rank rebuilds the unsplit model and the batch with the notebook's
    make_stages/make_batch and runs the micro-batches through it, its own stage in its slot."""
    from mgpu_helpers.pipeline import make_batch

    stages = make_stages(world_size, x.shape[1], 1)
    stages[rank] = stage
    model = nn.Sequential(*stages)
    x, y = make_batch(len(x), x.shape[1], y.shape[1])
    losses = [F.mse_loss(model(xi), yi) / m for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True)]
    for loss in losses:
        loss.backward()
    return sum(loss.item() for loss in losses) if rank == world_size - 1 else None


def gpipe_step_with_torch_pipelining(rank, world_size, stage, x, y, m):
    """Notebook 02b's API instead of send/recv by hand."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    schedule = ScheduleGPipe(
        PipelineStage(stage, rank, world_size, torch.device("cpu")), n_microbatches=m, loss_fn=F.mse_loss
    )
    if rank == 0:
        schedule.step(x)
    elif rank == world_size - 1:
        losses = []
        schedule.step(target=y, losses=losses)
        return sum(loss.item() for loss in losses) / m
    else:
        schedule.step()
    return None


SOLUTIONS = {"02a.1": (PipelinedTwoDeviceNet,), "02a.2": (gpipe_step,)}
WRONG = {"02a.1": (PipelinedForgetsTheLastMicrobatch,), "02a.2": (gpipe_step_without_1_over_m,)}
SHORTCUTS = {
    "02a.1": {
        "whole batch through both parts": (WholeBatchThroughBothParts,),
        "unsplit model per micro-batch": (UnsplitModelPerMicrobatch,),
        "outputs back on the host": (OutputsBackOnTheHost,),
        "fc once on the joined outputs": (FcOnceOnTheJoinedOutputs,),
    },
    "02a.2": {
        "one micro-batch at a time": (gpipe_step_one_microbatch_at_a_time,),
        "whole batch on every rank": (gpipe_step_whole_batch_on_every_rank,),
        "torch.distributed.pipelining": (gpipe_step_with_torch_pipelining,),
    },
}
