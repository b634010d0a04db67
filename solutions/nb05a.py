"""Reference solutions of notebook 05a's exercises, typical wrong attempts and known shortcuts
(tests/test_solutions.py)."""

import torch
import torch.nn.functional as F


def amp_step(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def amp_step_clipping_scaled_gradients(model, optimizer, scaler, x, y, max_norm):
    """Clips before unscaling: the norm it limits is the scaled one, so the real update is tiny."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def accumulated_amp_step(model, optimizer, scaler, micro_batches, max_norm):
    optimizer.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.float16):
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
        with torch.autocast(x.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


SOLUTIONS = {"05a.1": (amp_step,), "05a.2": (accumulated_amp_step,)}
WRONG = {"05a.1": (amp_step_clipping_scaled_gradients,), "05a.2": (accumulated_amp_step_summing_losses,)}


def _amp_step_without_scaler(model, optimizer, scaler, x, y, max_norm):
    """Shortcut: leave the scaler out (these gradients survive fp16); an inf step is then not skipped."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()


def _amp_step_skipping_by_hand(model, optimizer, scaler, x, y, max_norm):
    """Shortcut: no scaler, but a hand-written finiteness check; the loss scale never adapts."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    if all(torch.isfinite(p.grad).all() for p in model.parameters()):
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()


def _amp_step_in_fp32(model, optimizer, scaler, x, y, max_norm):
    """Shortcut: the scaler and clipping right, but no autocast: everything in fp32."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def _amp_step_fp16_model(model, optimizer, scaler, x, y, max_norm):
    """Shortcut: cast the model itself to fp16 (pure 16-bit, no fp32 master weights)."""
    model.to(torch.float16)
    amp_step(model, optimizer, scaler, x, y, max_norm)


def _amp_step_all_under_autocast(model, optimizer, scaler, x, y, max_norm):
    """Shortcut: the right calls, but backward, clipping and the step inside the autocast block too."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()


def _amp_step_backward_under_autocast(model, optimizer, scaler, x, y, max_norm):
    """Shortcut: backward inside the autocast block, clipping and the step outside."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def _accumulated_whole_batch(model, optimizer, scaler, micro_batches, max_norm):
    """Shortcut: glue the micro-batches back together and take one ordinary step (no accumulation)."""
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    amp_step(model, optimizer, scaler, x, y, max_norm)


def _accumulated_one_backward(model, optimizer, scaler, micro_batches, max_norm):
    """Shortcut: a forward per micro-batch, but one backward on the summed losses: every micro-batch's
    activations stay alive at once, as with the whole batch."""
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.float16):
            losses.append(F.cross_entropy(model(x), y))
    scaler.scale(sum(losses) / len(losses)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def _accumulated_without_scaler(model, optimizer, scaler, micro_batches, max_norm):
    """Shortcut: accumulation right, but no scaler: the inf step is not skipped."""
    optimizer.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y) / len(micro_batches)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()


SHORTCUTS = {
    "05a.1": {
        "no_grad_scaler": (_amp_step_without_scaler,),
        "skip_by_hand_without_scaler": (_amp_step_skipping_by_hand,),
        "fp32_forward": (_amp_step_in_fp32,),
        "fp16_model_instead_of_autocast": (_amp_step_fp16_model,),
        "backward_clip_step_under_autocast": (_amp_step_all_under_autocast,),
        "backward_under_autocast": (_amp_step_backward_under_autocast,),
    },
    "05a.2": {
        "whole_batch_at_once": (_accumulated_whole_batch,),
        "no_grad_scaler": (_accumulated_without_scaler,),
        "one_backward_on_summed_losses": (_accumulated_one_backward,),
    },
}
