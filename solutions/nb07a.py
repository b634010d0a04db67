"""Reference solutions of notebook 07a's exercises and typical wrong attempts (tests/test_solutions.py)."""

import torch
import torch.nn.functional as F

from mgpu_helpers.troubleshoot import is_oom


def train_epoch(model, optimizer, batches):
    total_loss, correct, seen = 0.0, 0, 0
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item()  # a Python float: the graph goes with `loss`
        correct += (out.argmax(dim=1) == y).sum().item()  # count now, keep no output
        seen += len(y)
    return total_loss / len(batches), correct / seen


def train_epoch_detached(model, optimizer, batches):
    """Fixes the running total but keeps detached outputs: no graphs, yet every batch's logits stay."""
    total_loss, outputs = 0.0, []
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
        outputs.append(out.detach())
    labels = torch.cat([y for _, y in batches])
    accuracy = (torch.cat(outputs).argmax(dim=1) == labels).float().mean()
    return total_loss / len(batches), float(accuracy)


def train_epoch_keeping_predictions(model, optimizer, batches):
    """A variant that must pass: keeps each batch's predicted classes (argmax, 1 KiB a step), no graph."""
    total_loss, predictions = 0.0, []
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
        predictions.append(out.argmax(dim=1))  # argmax has no grad_fn: no graph comes along
    labels = torch.cat([y for _, y in batches])
    return total_loss / len(batches), float((torch.cat(predictions) == labels).float().mean())


def train_epoch_as_given(model, optimizer, batches):
    """The notebook's leaking loop with only the marker line removed."""
    total_loss, outputs = 0.0, []
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss
        outputs.append(out)
    labels = torch.cat([y for _, y in batches])
    accuracy = (torch.cat(outputs).argmax(dim=1) == labels).float().mean()
    return float(total_loss / len(batches)), float(accuracy)


def train_epoch_outputs_as_python_lists(model, optimizer, batches):
    """Keeps every batch's logits as Python numbers (`tolist()`): the tensor tracker cannot see them."""
    total_loss, outputs = 0.0, []
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
        outputs.extend(out.tolist())  # 10 floats per sample, every batch
    labels = torch.cat([y for _, y in batches]).tolist()
    correct = sum(
        max(range(len(row)), key=row.__getitem__) == label for row, label in zip(outputs, labels, strict=True)
    )
    return total_loss / len(batches), correct / len(labels)


_KEPT = []  # outside the loop's variables: a graph kept here is still a leak


def train_epoch_losses_kept_elsewhere(model, optimizer, batches):
    """Keeps every batch's loss tensor (4 B each, but with its graph) in a module-level list."""
    correct = 0
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        _KEPT.append(loss)
        correct += (out.argmax(dim=1) == y).sum().item()
    total = float(sum(_KEPT[-len(batches) :]))
    return total / len(batches), correct / sum(len(y) for _, y in batches)


def train_epoch_accuracy_afterwards(model, optimizer, batches):
    """Keeps nothing, but measures the accuracy after training with the final weights: other numbers."""
    total_loss = 0.0
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
    with torch.no_grad():
        correct = sum((model(x).argmax(dim=1) == y).sum().item() for x, y in batches)
    return total_loss / len(batches), correct / sum(len(y) for _, y in batches)


def largest_fitting(step, upper):
    good, bad = 0, upper + 1  # 0 fits trivially; upper + 1 is beyond the bound
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            step(mid)
            fits = True
        except Exception as exc:
            if not is_oom(exc):  # a shape or dtype bug is not "too big"
                raise
            fits = False  # decide here; keep neither the exception nor its traceback
        if fits:
            good = mid
        else:
            bad = mid
    return good


def _fits(step, batch_size):
    try:
        step(batch_size)
        return True
    except Exception as exc:
        if not is_oom(exc):
            raise
        return False


def largest_fitting_by_doubling(step, upper):
    """§3's grow-then-bisect search from 1, capped at the bound: right answers, but too many calls."""
    if not _fits(step, 1):
        return 0
    good, bad = 1, None
    while bad is None and good < upper:
        b = min(2 * good, upper)
        if _fits(step, b):
            good = b
        else:
            bad = b
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if _fits(step, mid):
            good = mid
        else:
            bad = mid
    return good


def largest_fitting_catching_everything(step, upper):
    """Bisects, but counts every exception as "too big": a shape bug silently shrinks the answer."""
    good, bad = 0, upper + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            step(mid)
            good = mid
        except Exception:
            bad = mid
    return good


def largest_fitting_keeping_the_error(step, upper):
    """Bisects, but keeps the last OOM to report it: its traceback keeps the failed step's tensors."""
    good, bad, last_error = 0, upper + 1, None
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            step(mid)
            good = mid
        except Exception as exc:
            if not is_oom(exc):
                raise
            bad, last_error = mid, exc
    if last_error is not None:
        print("largest batch limited by:", str(last_error)[:40])
    return good


def largest_fitting_downwards(step, upper):
    """Tries upper, upper - 1, … until one fits: right answers, up to upper + 1 calls."""
    for b in range(upper, 0, -1):
        if _fits(step, b):
            return b
    return 0


SOLUTIONS = {"07a.1": (train_epoch,), "07a.2": (largest_fitting,)}
WRONG = {"07a.1": (train_epoch_detached,), "07a.2": (largest_fitting_by_doubling,)}
#: Other correct work that must pass too (tests/test_grader_variants.py).
VARIANTS = {"07a.1": {"keeps_each_batch_argmax": (train_epoch_keeping_predictions,)}}
SHORTCUTS = {
    "07a.1": {
        "the_loop_as_given": (train_epoch_as_given,),
        "losses_kept_outside_the_loop": (train_epoch_losses_kept_elsewhere,),
        "accuracy_measured_after_training": (train_epoch_accuracy_afterwards,),
        "outputs_kept_as_python_lists": (train_epoch_outputs_as_python_lists,),
    },
    "07a.2": {
        "every_error_means_too_big": (largest_fitting_catching_everything,),
        "keeps_the_last_oom": (largest_fitting_keeping_the_error,),
        "linear_scan_down_from_the_bound": (largest_fitting_downwards,),
        "grow_from_one_as_in_section_3": (largest_fitting_by_doubling,),
    },
}
