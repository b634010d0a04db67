"""Reference solutions of notebook 07b's exercises and typical wrong attempts (tests/test_solutions.py)."""

import faulthandler
import inspect
import linecache
import re
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist


def global_mean_loss(rank, world_size, losses_per_rank):
    mine = losses_per_rank[rank]
    stats = torch.tensor([sum(mine), len(mine)], dtype=torch.float64)  # one collective, same shape
    dist.all_reduce(stats)  # on every rank, whatever its number of batches
    return (stats[0] / stats[1]).item()


def global_mean_loss_of_means(rank, world_size, losses_per_rank):
    """No hang any more, but averages the ranks' means: wrong when ranks have different batch counts."""
    mine = losses_per_rank[rank]
    mean = torch.tensor([sum(mine) / len(mine)])
    dist.all_reduce(mean)
    return (mean / world_size).item()


def _frames(fn, after_s):
    """Run fn; if it is still running after after_s seconds, faulthandler's dump of this thread."""
    with tempfile.TemporaryFile("w+") as dump:
        faulthandler.dump_traceback_later(after_s, file=dump)
        try:
            fn()
        finally:
            faulthandler.cancel_dump_traceback_later()
        dump.seek(0)
        text = dump.read()
    me = f"0x{threading.get_ident():016x}"
    block = next((b for b in text.split("\n\n") if me in b.split("\n", 1)[0] or me in b), "")
    return re.findall(r'File "(.+)", line (\d+)', block)  # most recent call first


def stuck_at(fn, after_s):
    frames = _frames(fn, after_s)
    if not frames:
        return None
    mine = [(f, int(n)) for f, n in frames if f == fn.__code__.co_filename]
    path, line = mine[0]
    return linecache.getline(path, line).strip()


def stuck_at_outermost(fn, after_s):
    """Reads the dump from the wrong end: the outermost frame of fn's file, not where it is stuck."""
    frames = _frames(fn, after_s)
    if not frames:
        return None
    mine = [(f, int(n)) for f, n in frames if f == fn.__code__.co_filename]
    path, line = mine[-1]
    return linecache.getline(path, line).strip()


def stuck_at_in_a_thread(fn, after_s):
    """Also right: run fn in a thread and read that thread's frame from here after after_s seconds."""
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join(after_s)
    if not worker.is_alive():
        return None
    frame = sys._current_frames()[worker.ident]
    while frame is not None and frame.f_code.co_filename != fn.__code__.co_filename:
        frame = frame.f_back
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    worker.join()
    return line


# The grader's known cases as an answer key: the losses it used to test with, and the functions and
# "# stuck here" lines it used to block at.
_KNOWN_LOSSES = ([[0.5, 1.5], [2.5, 3.5]], [[1.0, 2.0, 3.0], [4.0, 5.0]])


def global_mean_loss_from_known_cases(rank, world_size, losses_per_rank):
    """No collective: recognises its own list among the grader's cases and returns that case's mean."""
    mine = losses_per_rank[rank]
    for case in _KNOWN_LOSSES:
        if case[rank] == mine:
            flat = [v for losses in case for v in losses]
            return sum(flat) / len(flat)
    return sum(mine) / len(mine)


def stuck_at_from_known_lines(fn, after_s):
    """No stack read: times fn, then returns the grader's "# stuck here" line that fn's name points to."""
    start = time.monotonic()
    fn()
    if time.monotonic() - start < after_s:
        return None
    lines, _ = inspect.findsource(fn)  # the whole file of fn
    marked = [ln.strip() for ln in lines if "# stuck here" in ln] or [None, None]
    return marked[0] if fn.__name__ == "_sleepy" else marked[-1]


SOLUTIONS = {"07b.1": (global_mean_loss,), "07b.2": (stuck_at,)}
WRONG = {"07b.1": (global_mean_loss_of_means,), "07b.2": (stuck_at_outermost,)}
VARIANTS = {"07b.2": {"reads_a_threads_frame": (stuck_at_in_a_thread,)}}
SHORTCUTS = {
    "07b.1": {"answer_key_of_known_losses": (global_mean_loss_from_known_cases,)},
    "07b.2": {"answer_key_of_known_lines": (stuck_at_from_known_lines,)},
}
