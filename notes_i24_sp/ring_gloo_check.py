# ruff: noqa
"""cp gloo ranks: ring attention with batch_isend_irecv + online softmax == full attention (float64)."""
import os
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank, world, causal):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29562")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    s, d = 16, 4
    q, k, v = (torch.randn(s, d, dtype=torch.float64) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    b = s // world
    ql, kv = q.chunk(world)[rank], torch.stack([k.chunk(world)[rank], v.chunk(world)[rank]])
    m = torch.full((b, 1), -float("inf"), dtype=q.dtype)
    lsum = torch.zeros((b, 1), dtype=q.dtype)
    o = torch.zeros((b, d), dtype=q.dtype)
    for step in range(world):
        src = (rank - step) % world
        if step < world - 1:   # start passing this block on while computing with it
            nxt = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                           dist.P2POp(dist.irecv, nxt, (rank - 1) % world)])
        if not (causal and src > rank):
            sc = ql @ kv[0].T / d**0.5
            if causal and src == rank:
                sc = sc.masked_fill(torch.ones(b, b, dtype=torch.bool).triu(1), -float("inf"))
            m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
            p, alpha = torch.exp(sc - m_new), torch.exp(m - m_new)
            lsum, o, m = lsum * alpha + p.sum(-1, keepdim=True), o * alpha + p @ kv[1], m_new
        if step < world - 1:
            for r in reqs:
                r.wait()
            kv = nxt
    torch.testing.assert_close(o / lsum, ref.chunk(world)[rank], rtol=1e-12, atol=1e-12)
    if rank == 0:
        print("ring ok world", world, "causal", causal)
    dist.destroy_process_group()


if __name__ == "__main__":
    w = int(sys.argv[1])
    for c in (False, True):
        mp.start_processes(work, args=(w, c), nprocs=w, start_method="spawn")
