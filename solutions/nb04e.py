"""Reference solutions of notebook 04e's exercises and typical wrong attempts
(run by tests/test_solutions.py; shortcuts by tests/test_shortcuts.py)."""

import torch
import torch.distributed as dist


def make_buckets(params, cap_bytes):
    """The notebook's section-2 helper: reverse registration order, a new bucket when the next gradient
    would take the current one past the cap."""
    buckets, filled = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and filled + nbytes > cap_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(p)
        filled += nbytes
    return buckets


class BucketedDDP:
    def __init__(self, model, bucket_cap_bytes):
        self.module = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            dist.broadcast(p.data, src=0)
        self.buckets = make_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.waiting = [len(b) for b in self.buckets]
        self.in_flight = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def __call__(self, *args):
        return self.module(*args)

    def _grad_ready(self, p):
        i = self.bucket_of[p]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:  # the bucket's last gradient: send it while backward goes on
            flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
            self.in_flight.append((dist.all_reduce(flat, async_op=True), flat, self.buckets[i]))

    def finish(self):
        for handle, flat, bucket in self.in_flight:
            handle.wait()
            flat /= dist.get_world_size()
            for q, piece in zip(bucket, flat.split([q.numel() for q in bucket]), strict=True):
                q.grad.copy_(piece.view_as(q))
        self.in_flight = []
        self.waiting = [len(b) for b in self.buckets]


class BucketedDDPNeverReset(BucketedDDP):
    """Typical slip: the counts are not reset, so the second iteration never sends a bucket."""

    def finish(self):
        for handle, flat, bucket in self.in_flight:
            handle.wait()
            flat /= dist.get_world_size()
            for q, piece in zip(bucket, flat.split([q.numel() for q in bucket]), strict=True):
                q.grad.copy_(piece.view_as(q))
        self.in_flight = []


def step_end_ms(ready_ms, comm_ms):
    link_free = 0.0
    for ready, comm in zip(ready_ms, comm_ms, strict=True):
        link_free = max(link_free, ready) + comm  # starts when ready and when the link is free
    return link_free


def step_end_ms_parallel_links(ready_ms, comm_ms):
    """Typical slip: every all-reduce starts when its bucket is ready, as if each had a link of its own."""
    return max(r + c for r, c in zip(ready_ms, comm_ms, strict=True))


# --- shortcuts: right gradients without the mechanism the exercise teaches (each must get a ❌) ----------


class WrapsTorchDDP:
    """torch's own DistributedDataParallel does the buckets and the overlap."""

    def __init__(self, model, bucket_cap_bytes):
        from torch.nn.parallel import DistributedDataParallel

        self.module = model
        self.ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_bytes / 2**20)

    def __call__(self, *args):
        return self.ddp(*args)

    def finish(self):
        pass


class OneAllReduceAfterBackward:
    """Broadcast, then every gradient flattened into one all-reduce in finish(): no buckets, no overlap."""

    def __init__(self, model, bucket_cap_bytes):
        self.module = model
        self.params = list(model.parameters())
        for p in self.params:
            dist.broadcast(p.data, src=0)

    def __call__(self, *args):
        return self.module(*args)

    def finish(self):
        flat = torch.cat([p.grad.flatten() for p in self.params])
        dist.all_reduce(flat, async_op=True).wait()
        flat /= dist.get_world_size()
        for p, piece in zip(self.params, flat.split([p.numel() for p in self.params]), strict=True):
            p.grad.copy_(piece.view_as(p))


class AllGradientsInOneBucket(BucketedDDP):
    """The hooks and the async all-reduce, but one bucket whatever the cap: it leaves when backward ends."""

    def __init__(self, model, bucket_cap_bytes):
        super().__init__(model, float("inf"))


class SynchronousBuckets(BucketedDDP):
    """The right buckets from the hooks, but each all-reduce blocks backward until it is done."""

    def _grad_ready(self, p):
        i = self.bucket_of[p]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:
            flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
            dist.all_reduce(flat)  # async_op=False: backward waits here
            flat /= dist.get_world_size()
            bucket = self.buckets[i]
            for q, piece in zip(bucket, flat.split([q.numel() for q in bucket]), strict=True):
                q.grad.copy_(piece.view_as(q))

    def finish(self):
        self.waiting = [len(b) for b in self.buckets]


class WaitsInTheHook(BucketedDDP):
    """async_op=True, but the hook waits at once: backward stands still while each bucket travels."""

    def _grad_ready(self, p):
        i = self.bucket_of[p]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:
            bucket = self.buckets[i]
            flat = torch.cat([q.grad.flatten() for q in bucket])
            dist.all_reduce(flat, async_op=True).wait()
            flat /= dist.get_world_size()
            for q, piece in zip(bucket, flat.split([q.numel() for q in bucket]), strict=True):
                q.grad.copy_(piece.view_as(q))

    def finish(self):
        self.waiting = [len(b) for b in self.buckets]


def step_end_ms_graders_own(ready_ms, comm_ms):
    """The grader's reference timeline as the answer key."""
    from mgpu_helpers.graders.nb04e import _step_end

    return _step_end(ready_ms, comm_ms)


def step_end_ms_no_overlap(ready_ms, comm_ms):
    """Every all-reduce after backward: the communication is never hidden."""
    return ready_ms[-1] + sum(comm_ms)


def step_end_ms_perfect_overlap(ready_ms, comm_ms):
    """Compute and communication as two independent totals: ignores when each bucket is ready."""
    return max(ready_ms[-1], sum(comm_ms))


class DividesFirstForwardOrder(BucketedDDP):
    """Also correct: a set of the gradients still missing per bucket, flattened in registration order and
    divided before the all-reduce (as torch's DDP does), so finish() only waits and copies."""

    def __init__(self, model, bucket_cap_bytes):
        super().__init__(model, bucket_cap_bytes)
        self.missing = [set(b) for b in self.buckets]

    def _grad_ready(self, p):
        i = self.bucket_of[p]
        self.missing[i].discard(p)
        if not self.missing[i]:
            bucket = self.buckets[i][::-1]
            flat = torch.cat([q.grad.flatten() for q in bucket]) / dist.get_world_size()
            self.in_flight.append((dist.all_reduce(flat, async_op=True), flat, bucket))

    def finish(self):
        for handle, flat, bucket in self.in_flight:
            handle.wait()
            for q, piece in zip(bucket, flat.split([q.numel() for q in bucket]), strict=True):
                q.grad.copy_(piece.view_as(q))
        self.in_flight = []
        self.missing = [set(b) for b in self.buckets]


SOLUTIONS = {"04e.1": (BucketedDDP,), "04e.2": (step_end_ms,)}
WRONG = {"04e.1": (BucketedDDPNeverReset,), "04e.2": (step_end_ms_parallel_links,)}
SHORTCUTS = {
    "04e.1": {
        "wraps_torch_ddp": (WrapsTorchDDP,),
        "one_all_reduce_after_backward": (OneAllReduceAfterBackward,),
        "all_gradients_in_one_bucket": (AllGradientsInOneBucket,),
        "synchronous_all_reduces": (SynchronousBuckets,),
        "waits_in_the_hook": (WaitsInTheHook,),
    },
    "04e.2": {
        "no_overlap": (step_end_ms_no_overlap,),
        "perfect_overlap": (step_end_ms_perfect_overlap,),
        "graders_own_timeline": (step_end_ms_graders_own,),
    },
}
VARIANTS = {"04e.1": {"divides_first_forward_order": (DividesFirstForwardOrder,)}}
