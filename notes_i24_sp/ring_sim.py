# ruff: noqa
"""Single-process check of the ring-attention online-softmax merge (prototype for 05e; not yet a notebook)."""
import torch


def ring_attention_sim(q, k, v, cp: int, causal: bool = False):
    """Simulate cp ranks: rank r holds block r of q/k/v; K/V blocks travel round the ring."""
    s, d = q.shape
    b = s // cp
    qs, ks, vs = q.split(b), k.split(b), v.split(b)
    outs = []
    for r in range(cp):
        m = torch.full((b, 1), -float("inf"), dtype=q.dtype)   # running max
        l = torch.zeros((b, 1), dtype=q.dtype)                  # running sum
        o = torch.zeros((b, d), dtype=q.dtype)                  # unnormalised output
        for step in range(cp):
            src = (r - step) % cp              # block received at this step
            if causal and src > r:
                continue                       # block entirely in the future: skipped
            sc = qs[r] @ ks[src].T / d**0.5    # (s/cp) x (s/cp) score block
            if causal and src == r:
                sc = sc.masked_fill(torch.ones(b, b, dtype=torch.bool).triu(1), -float("inf"))
            m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
            p = torch.exp(sc - m_new)
            alpha = torch.exp(m - m_new)       # rescale old partials
            l = l * alpha + p.sum(-1, keepdim=True)
            o = o * alpha + p @ vs[src]
            m = m_new
        outs.append(o / l)
    return torch.cat(outs)


if __name__ == "__main__":
    torch.manual_seed(0)
    for cp in (2, 4):
        for causal in (False, True):
            q, k, v = (torch.randn(32, 8, dtype=torch.float64) for _ in range(3))
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            got = ring_attention_sim(q, k, v, cp, causal)
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
            print("ok cp", cp, "causal", causal)
