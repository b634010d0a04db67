"""Reference solutions of notebook 07a's exercises and typical wrong attempts (tests/test_solutions.py)."""

import torch
import torch.nn.functional as F


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


def largest_below(fits, upper):
    good, bad = 0, upper + 1  # 0 fits trivially; upper + 1 is beyond the bound
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def largest_below_by_doubling(fits, upper):
    """The grow-then-bisect search from 1, capped at the bound: right answers, but too many probes."""
    if not fits(1):
        return 0
    good, bad = 1, None
    while bad is None and good < upper:
        b = min(2 * good, upper)
        if fits(b):
            good = b
        else:
            bad = b
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


SOLUTIONS = {"07a.1": (train_epoch,), "07a.2": (largest_below,)}
WRONG = {"07a.1": (train_epoch_detached,), "07a.2": (largest_below_by_doubling,)}
