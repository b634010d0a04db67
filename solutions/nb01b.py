"""Reference solutions of notebook 01b's exercises and typical wrong attempts
(run by tests/test_solutions.py)."""

import torch
import torch.distributed as dist


def global_mean(x):
    totals = torch.stack([x.sum(), torch.tensor(float(x.numel()), dtype=x.dtype)])  # [sum, count]
    dist.all_reduce(totals)
    return totals[0] / totals[1]


def mean_of_means(x):
    """Right only when every rank holds as many elements as the others."""
    m = x.mean()
    dist.all_reduce(m)
    return m / dist.get_world_size()


def ring_shift(x):
    rank, n = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(x)
    request = dist.isend(x, dst=(rank + 1) % n)  # start sending, do not wait yet
    dist.recv(received, src=(rank - 1) % n)
    request.wait()
    return received


def ring_shift_send_first(x):
    """Every rank sends first: each send waits for a recv that its partner never reaches."""
    rank, n = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(x)
    dist.send(x, dst=(rank + 1) % n)
    dist.recv(received, src=(rank - 1) % n)
    return received


def ring_shift_even_odd(x):
    """Correct too: even ranks send first, odd ranks receive first, so no cycle of waiting sends forms."""
    rank, n = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(x)
    if rank % 2 == 0:
        dist.send(x, dst=(rank + 1) % n)
        dist.recv(received, src=(rank - 1) % n)
    else:
        dist.recv(received, src=(rank - 1) % n)
        dist.send(x, dst=(rank + 1) % n)
    return received


# --- shortcuts: the right numbers without the lesson (tests/test_shortcuts.py: each must get ❌) ---


def mean_with_counts_from_the_prose(x):
    """Only the sum travels; the total count is looked up from this rank's own size in the sizes the
    exercise text announces (5/1/3, 5/1/6, 2/2/2)."""
    total = x.sum()
    dist.all_reduce(total)
    return total / {5: 9, 1: 9, 3: 9, 6: 12, 2: 6}[x.numel()]


def mean_from_the_graders_case_builder(x):
    """The grader's own case builder as answer key: find which case this is, return its mean, and make
    the one all_reduce the exercise asks for on a dummy tensor."""
    from mgpu_helpers.graders import nb01b

    dist.all_reduce(torch.zeros(1))
    rank = dist.get_rank()
    for sizes in nb01b._SIZES:
        if sizes[rank] == x.numel():
            return torch.cat([nb01b._data(sizes, r, 0) for r in range(dist.get_world_size())]).mean()
    return x.mean()


def mean_of_everything_gathered(x):
    """Communicating everything: every rank gathers every rank's whole tensor and averages locally."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, x)
    return torch.cat(parts).mean()


def mean_of_everything_in_one_all_reduce(x):
    """Communicating everything through the one all_reduce: each rank writes its elements into its own
    slot of a zero-padded buffer (with its count), the sum of the buffers is every rank's data."""
    rank, n, width = dist.get_rank(), dist.get_world_size(), 64
    slots = torch.zeros(n, width + 1, dtype=x.dtype)
    slots[rank, : x.numel()] = x
    slots[rank, width] = x.numel()
    dist.all_reduce(slots)
    return torch.cat([slots[r, : int(slots[r, width])] for r in range(n)]).mean()


def ring_shift_from_the_graders_case_builder(x):
    """The grader's own case builder as answer key: rebuild the left neighbour's tensor, send nothing."""
    from mgpu_helpers.graders import nb01b

    rank, n = dist.get_rank(), dist.get_world_size()
    return nb01b._shift_data((rank - 1) % n, 0)[0 if x.dim() == 1 else 1]


def ring_shift_by_all_gather(x):
    """A collective instead of point-to-point: gather every rank's tensor, keep the left neighbour's."""
    rank, n = dist.get_rank(), dist.get_world_size()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x)
    return parts[(rank - 1) % n]


SOLUTIONS = {"01b.1": (global_mean,), "01b.2": (ring_shift,)}
WRONG = {"01b.1": (mean_of_means,), "01b.2": (ring_shift_send_first,)}
VARIANTS = {"01b.2": {"even_ranks_send_first": (ring_shift_even_odd,)}}
SHORTCUTS = {
    "01b.1": {
        "counts_from_the_prose": (mean_with_counts_from_the_prose,),
        "graders_case_builder_as_answer_key": (mean_from_the_graders_case_builder,),
        "all_gather_everything": (mean_of_everything_gathered,),
        "all_elements_in_one_all_reduce": (mean_of_everything_in_one_all_reduce,),
    },
    "01b.2": {
        "graders_case_builder_as_answer_key": (ring_shift_from_the_graders_case_builder,),
        "all_gather_instead_of_send_recv": (ring_shift_by_all_gather,),
    },
}
