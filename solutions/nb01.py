"""Reference solutions of notebook 01's exercises and typical wrong attempts (for tests/test_solutions.py)."""

import copy

import torch


def whoami(env, gpus_per_node):
    local_rank = int(env["LOCAL_RANK"])
    use_gpu = gpus_per_node >= int(env["LOCAL_WORLD_SIZE"])  # one GPU for every process on this node
    return {
        "rank": int(env["RANK"]),
        "local_rank": local_rank,
        "node_rank": int(env["GROUP_RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "device": f"cuda:{local_rank}" if use_gpu else "cpu",
    }


def whoami_global_rank_device(env, gpus_per_node):
    """Picks the GPU with the global rank: right on one node, wrong from the second node on."""
    rank = int(env["RANK"])
    return {
        "rank": rank,
        "local_rank": int(env["LOCAL_RANK"]),
        "node_rank": int(env["GROUP_RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "device": f"cuda:{rank}" if gpus_per_node >= int(env["LOCAL_WORLD_SIZE"]) else "cpu",
    }


def training_bytes(model, optimizer):
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    size = sum(p.numel() * p.element_size() for p in trainable)
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        state = 2 * size + 4 * len(trainable)  # exp_avg, exp_avg_sq; a float32 `step` per tensor
    elif isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["momentum"]:
        state = size  # momentum_buffer
    else:
        state = 0
    return {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": size,
        "optimizer": state,
    }


def training_bytes_sixteen_per_parameter(model, optimizer):
    """The fp32-Adam rule of thumb (4 + 4 + 8 bytes) applied to every model and optimizer."""
    n = sum(p.numel() for p in model.parameters())
    return {"parameters": 4 * n, "gradients": 4 * n, "optimizer": 8 * n}


SOLUTIONS = {"01.1": (whoami,), "01.2": (training_bytes,)}
WRONG = {"01.1": (whoami_global_rank_device,), "01.2": (training_bytes_sixteen_per_parameter,)}


def whoami_for_two_processes_per_node(env, gpus_per_node):
    """Written for the grader's 2-node × 2-process job only: local and node rank derived from the rank."""
    rank = int(env["RANK"])
    return {
        "rank": rank,
        "local_rank": rank % 2,
        "node_rank": rank // 2,
        "world_size": int(env["WORLD_SIZE"]),
        "device": f"cuda:{rank % 2}" if gpus_per_node >= 2 else "cpu",
    }


#: What the grader's cases (Linear(16, 32), Linear(32, 8), ...) measured once, keyed by the optimizer and
#: the parameters' (shape, dtype, requires_grad): a table of earlier feedback instead of a prediction.
_REMEMBERED = {
    ("Adam", (((32, 16), 4, True), ((32,), 4, True), ((8, 32), 4, True), ((8,), 4, True))): (
        3232,
        3232,
        6480,
    ),
    ("SGD", (((32, 16), 4, True), ((32,), 4, True))): (2176, 2176, 2176),
    ("Adam", (((32, 16), 4, False), ((32,), 4, False), ((8, 32), 4, True), ((8,), 4, True))): (
        3232,
        1056,
        2120,
    ),
    ("AdamW", (((32, 16), 8, True), ((32,), 8, True))): (4352, 4352, 8712),
}


def training_bytes_from_remembered_feedback(model, optimizer):
    key = (
        type(optimizer).__name__,
        tuple((tuple(p.shape), p.element_size(), p.requires_grad) for p in model.parameters()),
    )
    params, grads, state = _REMEMBERED.get(key, (0, 0, 0))
    if key[0] == "SGD" and not optimizer.param_groups[0]["momentum"]:
        state = 0
    return {"parameters": params, "gradients": grads, "optimizer": state}


def whoami_from_the_graders_answer_key(env, gpus_per_node):
    """The grader's own expected answer, imported instead of reading the environment."""
    from mgpu_helpers.graders.nb01 import _expected

    return _expected(env, gpus_per_node)


def _one_step_on_a_copy(model, optimizer):
    """A helper outside the graded function, so that grade()'s check of its names does not see deepcopy,
    backward or step."""
    twin = copy.deepcopy(model)
    if isinstance(optimizer, torch.optim.SGD):
        twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=optimizer.defaults["momentum"])
    else:
        twin_optimizer = type(optimizer)(twin.parameters())
    first = next(twin.parameters())
    twin(torch.zeros(1, first.shape[-1], dtype=first.dtype)).sum().backward()
    twin_optimizer.step()
    return twin, twin_optimizer


def training_bytes_measured_on_a_copy(model, optimizer):
    """Measures one real step on a copy of the model instead of predicting."""
    twin, twin_optimizer = _one_step_on_a_copy(model, optimizer)
    state = [v for s in twin_optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    grads = [p.grad for p in twin.parameters() if p.grad is not None]
    return {
        "parameters": sum(p.nbytes for p in twin.parameters()),
        "gradients": sum(g.nbytes for g in grads),
        "optimizer": sum(t.nbytes for t in state),
    }


#: Work that gets the right answers without doing the exercise; each grader must reject it.
SHORTCUTS = {
    "01.1": {
        "hardcoded_two_processes_per_node": (whoami_for_two_processes_per_node,),
        "graders_answer_key": (whoami_from_the_graders_answer_key,),
    },
    "01.2": {
        "table_of_remembered_feedback": (training_bytes_from_remembered_feedback,),
        "one_real_step_on_a_copy": (training_bytes_measured_on_a_copy,),
    },
}


def training_bytes_per_group(model, optimizer):
    """Another right answer: walks the optimizer's parameter groups and tells Adam-like optimizers by their
    betas."""
    out = {"parameters": sum(p.nbytes for p in model.parameters()), "gradients": 0, "optimizer": 0}
    for group in optimizer.param_groups:
        for p in (p for p in group["params"] if p.requires_grad):
            out["gradients"] += p.nbytes
            if "betas" in group:
                out["optimizer"] += 2 * p.nbytes + 4  # exp_avg, exp_avg_sq, float32 step
            elif group.get("momentum"):
                out["optimizer"] += p.nbytes  # momentum_buffer
    return out


#: Other right answers the graders must accept.
VARIANTS = {"01.2": {"per_parameter_group": (training_bytes_per_group,)}}
