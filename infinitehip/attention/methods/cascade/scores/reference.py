"""Attention over sinks + sub-caches + stride that also accumulates each key's score, in eager PyTorch: the oracle
of `cpu.py` and `triton.py` (any key positions; the fast paths take the method's slot order).

The EMA runs query by query, as in decode: every query that sees key j updates s_j <- decay * s_j + (1 - decay) *
a_qj. Over a chunk of n queries this is s_j <- decay^(m_j) * s_j + sum_q (1 - decay) * decay^(n - 1 - q) * a_qj,
with m_j the chunk's queries that see j; so a chunk gives the scores its queries would give one at a time, and two
chunks the scores of their union. Exact softmax probabilities in fp32, in passes of rows (their scores take
heads x rows x keys floats).
"""

from __future__ import annotations

import torch

ELEMENTS_PER_PASS = 1 << 26  # fp32 scores of one pass (256 MiB)


def attention_with_scores_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                                    k_pos: torch.Tensor, scores: torch.Tensor, scale: float, decay: float,
                                    reduction: str) -> torch.Tensor:
    """q [n, H, d] at positions q_pos [n] (ascending), k/v [K, Hkv, d] (RoPE applied) at k_pos [K]; query q sees
    the keys at positions <= its own. scores [Hkv, K] fp32 (the keys' scores, zero for new keys) updated in place
    -> out [n, H, d]."""
    n, H, d = q.shape
    K, Hkv = k.shape[:2]
    G = H // Hkv
    kf, vf = k.float(), v.float()
    visible_count = (k_pos[None, :] <= q_pos[:, None]).sum(0)  # m_j
    increment = torch.zeros_like(scores)
    weights = (1 - decay) * decay ** torch.arange(n - 1, -1, -1, device=q.device, dtype=torch.float64)
    out = torch.empty_like(q)
    rows = max(1, ELEMENTS_PER_PASS // max(1, H * K))
    for a in range(0, n, rows):
        b = min(a + rows, n)
        qg = q[a:b].float().view(b - a, Hkv, G, d)
        logits = torch.einsum("nkgd,lkd->kgnl", qg, kf) * scale
        visible = k_pos[None, :] <= q_pos[a:b, None]
        probs = logits.masked_fill_(~visible, float("-inf")).softmax(-1)  # [Hkv, G, r, K]
        out[a:b] = torch.einsum("kgnl,lkd->nkgd", probs, vf).reshape(b - a, H, d).to(q.dtype)
        grouped = probs.amax(1) if reduction == "max" else probs.mean(1)  # [Hkv, r, K]
        increment += torch.einsum("knl,n->kl", grouped, weights[a:b].float())
    scores.mul_((decay ** visible_count.double()).float()).add_(increment)
    return out
