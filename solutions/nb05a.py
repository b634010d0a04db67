"""Reference solutions of notebook 05a's exercises and typical wrong attempts (tests/test_solutions.py)."""

import torch
import torch.nn.functional as F


def amp_step(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def amp_step_clipping_scaled_gradients(model, optimizer, scaler, x, y, max_norm):
    """Clips before unscaling: the norm it limits is the scaled one, so the real update is tiny."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def accumulated_amp_step(model, optimizer, scaler, micro_batches, max_norm):
    optimizer.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y) / len(micro_batches)
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def accumulated_amp_step_summing_losses(model, optimizer, scaler, micro_batches, max_norm):
    """Moves the step out of the loop but forgets that the micro-batch gradients add up."""
    optimizer.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


SOLUTIONS = {"05a.1": (amp_step,), "05a.2": (accumulated_amp_step,)}
WRONG = {"05a.1": (amp_step_clipping_scaled_gradients,), "05a.2": (accumulated_amp_step_summing_losses,)}
