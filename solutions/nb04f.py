"""Reference solutions of notebook 04f's exercise (a ZeRO-1 Adam on real ranks), typical wrong attempts,
shortcuts and another correct answer (run by tests/test_solutions.py, tests/test_shortcuts.py and
tests/test_grader_variants.py)."""

import torch
import torch.distributed as dist

from mgpu_helpers.collectives import all_gather_single, reduce_scatter_single


class ShardedAdam:
    """ZeRO-1, the notebook's layout: one flat vector of all parameters, padded to a multiple of N and cut
    into N equal contiguous shards; each rank keeps Adam's state for its own shard only."""

    def __init__(self, params, lr):
        self.params = list(params)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_len = -(-self.numel // self.world)  # ceil(Ψ / N): the last shard is padded with zeros
        self.mine = slice(self.rank * self.shard_len, (self.rank + 1) * self.shard_len)
        flat = self._flat([p.detach() for p in self.params])
        self.shard = torch.nn.Parameter(flat[self.mine].clone())  # this rank's slice of the parameters
        self.local = torch.optim.Adam([self.shard], lr=lr)  # Adam's state for the shard only

    def _flat(self, tensors):
        out = torch.zeros(self.shard_len * self.world, dtype=tensors[0].dtype)
        out[: self.numel] = torch.cat([t.flatten() for t in tensors])
        return out

    def _copy_back(self, flat):
        pieces = flat[: self.numel].split([p.numel() for p in self.params])
        with torch.no_grad():
            for p, piece in zip(self.params, pieces, strict=True):
                p.copy_(piece.view_as(p))

    def step(self):
        grad = self._flat([p.grad for p in self.params])
        dist.all_reduce(grad)  # every rank: the sum of the ranks' gradients
        self.shard.grad = grad[self.mine] / self.world  # the average, for my shard only
        self.local.step()  # Adam on my shard: my state, my update
        flat = torch.empty(self.shard_len * self.world, dtype=self.shard.dtype)
        dist.all_gather(list(flat.chunk(self.world)), self.shard.detach())  # every rank's updated shard
        self._copy_back(flat)


class ShardedAdamNoGather(ShardedAdam):
    """Typical slip: each rank updates its shard but never receives the others' (the ranks diverge)."""

    def step(self):
        grad = self._flat([p.grad for p in self.params])
        dist.all_reduce(grad)
        self.shard.grad = grad[self.mine] / self.world
        self.local.step()
        flat = self._flat([p.detach() for p in self.params])
        flat[self.mine] = self.shard.detach()
        self._copy_back(flat)


class ShardedAdamLocalGradients(ShardedAdam):
    """Typical slip: the gradients are never averaged over the ranks (each shard steps on its own rank's
    gradient)."""

    def step(self):
        self.shard.grad = self._flat([p.grad for p in self.params])[self.mine].clone()
        self.local.step()
        flat = torch.empty(self.shard_len * self.world, dtype=self.shard.dtype)
        dist.all_gather(list(flat.chunk(self.world)), self.shard.detach())
        self._copy_back(flat)


class ShardedAdamAllReduceJoin(ShardedAdam):
    """Joins the slices with an all-reduce of zero-padded copies instead of an all-gather: the same
    parameters, twice the bytes of an all-gather, and not the step 3 the exercise asks for."""

    def step(self):
        grad = self._flat([p.grad for p in self.params])
        dist.all_reduce(grad)
        self.shard.grad = grad[self.mine] / self.world
        self.local.step()
        flat = torch.zeros(self.shard_len * self.world, dtype=self.shard.dtype)
        flat[self.mine] = self.shard.detach()
        dist.all_reduce(flat)  # zeros elsewhere: the sum is every rank's slice
        self._copy_back(flat)


# --- another correct answer -----------------------------------------------------------------------------


class ShardedAdamWholeParameters:
    """Also correct: torch's layout: whole parameters, largest first, each to the rank with the fewest
    elements so far; every rank steps its own parameters, then each owner broadcasts them."""

    def __init__(self, params, lr):
        self.params = list(params)
        load = [0] * dist.get_world_size()
        self.owner = {}
        for p in sorted(self.params, key=lambda p: p.numel(), reverse=True):
            rank = load.index(min(load))
            self.owner[p] = rank
            load[rank] += p.numel()
        mine = [p for p in self.params if self.owner[p] == dist.get_rank()]
        self.local = torch.optim.Adam(mine, lr=lr)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.local.step()
        for p in self.params:
            dist.broadcast(p.data, src=self.owner[p])


# --- shortcuts: right numbers without sharding the state (each must get a ❌) ----------------------------


class PlainAdamEveryRank:
    """DDP + Adam: gradients averaged, then every rank steps every parameter with the full state."""

    def __init__(self, params, lr):
        self.params = list(params)
        self.adam = torch.optim.Adam(self.params, lr=lr)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.adam.step()


class WrapsTorchZero:
    """torch's ZeroRedundancyOptimizer does the sharding."""

    def __init__(self, params, lr):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.params = list(params)
        self.zero = ZeroRedundancyOptimizer(self.params, optimizer_class=torch.optim.Adam, lr=lr)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.zero.step()


class StepsAllKeepsHalf(ShardedAdamWholeParameters):
    """Every rank steps every parameter, then keeps the state of its own half only (drops the rest)."""

    def __init__(self, params, lr):
        super().__init__(params, lr)
        self.local = torch.optim.Adam(self.params, lr=lr)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.local.step()
        for p in self.params:
            if self.owner[p] != dist.get_rank():
                self.local.state.pop(p, None)


_ELSEWHERE = {}  # the full state, kept where the object's attributes do not lead


class ComputesOthersUpdates(ShardedAdamWholeParameters):
    """Its own shard's Adam for show, but every rank computes every update from a full Adam kept out of
    sight, and the broadcasts' results are thrown away."""

    def __init__(self, params, lr):
        super().__init__(params, lr)
        _ELSEWHERE[id(self)] = torch.optim.Adam(self.params, lr=lr)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        for group in self.local.param_groups:  # the shard's own state, so that it shows up
            for p in group["params"]:
                state = self.local.state[p]
                state.setdefault("exp_avg", torch.zeros_like(p))
                state.setdefault("exp_avg_sq", torch.zeros_like(p))
        _ELSEWHERE[id(self)].step()
        for p in self.params:
            dist.broadcast(p.data.clone(), src=self.owner[p])  # sent, but what arrives is not used


def bytes_sent(n_params, world_size, bytes_per_number, method):
    ring = (world_size - 1) / world_size * n_params * bytes_per_number  # one reduce-scatter or all-gather
    passes = {"ddp": 2, "zero1_all_reduce": 3, "zero1_reduce_scatter": 2}[method]
    return passes * ring


def bytes_sent_whole_message(n_params, world_size, bytes_per_number, method):
    """Typical slip: every collective sends the whole message, forgetting the ring's (N - 1)/N."""
    passes = {"ddp": 2, "zero1_all_reduce": 3, "zero1_reduce_scatter": 2}[method]
    return passes * n_params * bytes_per_number


def bytes_sent_graders_own(n_params, world_size, bytes_per_number, method):
    """The grader's own count as the answer key."""
    from mgpu_helpers.graders.nb04f import _sent

    return _sent(n_params, world_size, bytes_per_number, method)


class ShardedAdamReduceScatter(ShardedAdam):
    """Variant: section 5's ZeRO-1 at DDP's traffic, through the course's own helpers (04f's imports): a
    reduce-scatter leaves each rank the sum of its slice only, an all-gather joins the updated slices."""

    def step(self):
        mine = torch.empty(self.shard_len, dtype=self.shard.dtype)
        reduce_scatter_single(mine, self._flat([p.grad for p in self.params]))
        self.shard.grad = mine / self.world
        self.local.step()
        flat = torch.empty(self.shard_len * self.world, dtype=self.shard.dtype)
        all_gather_single(flat, self.shard.detach())
        self._copy_back(flat)


SOLUTIONS = {"04f.1": (ShardedAdam,), "04f.2": (bytes_sent,)}
WRONG = {"04f.1": (ShardedAdamNoGather,), "04f.2": (bytes_sent_whole_message,)}
SHORTCUTS = {
    "04f.1": {
        "plain_adam_every_rank": (PlainAdamEveryRank,),
        "wraps_torch_zero": (WrapsTorchZero,),
        "steps_all_keeps_half": (StepsAllKeepsHalf,),
        "computes_others_updates": (ComputesOthersUpdates,),
        "never_averages_gradients": (ShardedAdamLocalGradients,),
        "all_reduce_joins_slices": (ShardedAdamAllReduceJoin,),
    },
    "04f.2": {"graders_own_count": (bytes_sent_graders_own,)},
}
VARIANTS = {
    "04f.1": {
        "whole_parameters_greedy": (ShardedAdamWholeParameters,),
        "reduce_scatter_through_the_course_helpers": (ShardedAdamReduceScatter,),
    }
}
