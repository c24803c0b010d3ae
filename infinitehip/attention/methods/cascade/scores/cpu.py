"""The cascade's attention with scores on CPU (same results as `reference.py` up to fp32 rounding, tested).

Output: torch's CPU flash kernel returns each row's log-sum-exp beside its output. The kept keys [0, P) are visible
to every query: one unmasked call with the GQA heads packed into the query rows (each key tile read once per KV
head); the chunk's own n keys: one causal call (square, so torch's top-left causal mask is the slot rule). The two
merge by their log-sum-exps.

Scores: p_gqj = exp(q_g.k_j * scale - lse_gq) is query q's probability of key j under head g, so one product of
the queries (scaled) with the keys, minus the log-sum-exp, gives every probability: no softmax, no product with V.
The max over a group's heads is taken before the exp (exp is monotone: 1 / G of the exps), the queries' EMA
weights reduce the rows with one matrix-vector product. In passes of rows (the logits of a pass: heads x rows x
keys floats); a pass skips the keys after its last query.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.cascade.scores.ema import ema_factors, visible_counts
from infinitehip.attention.ops.sparse.two_part_attention import pack_gqa, unpack_gqa

# (out, logsumexp) of scaled-dot-product attention, the kernel F.scaled_dot_product_attention runs on CPU.
_flash_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
ELEMENTS_PER_PASS = 1 << 22  # fp32 logits of one scores pass (16 MiB: cache-sized passes beat larger ones)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, H, d], k/v [K, Hkv, d] in slot order -> out [n, H, d] fp32, lse [Hkv, G, n] fp32 (natural log)."""
    n, H, d = q.shape
    K, Hkv = k.shape[:2]
    G, P = H // Hkv, K - n
    qf, kf, vf = q.float(), k.float(), v.float()
    own_k = kf[P:].repeat_interleave(G, 1).transpose(0, 1)[None]  # [1, H, n, d]: the causal call needs H heads
    own_v = vf[P:].repeat_interleave(G, 1).transpose(0, 1)[None]
    out_t, lse_t = _flash_with_lse(qf.transpose(0, 1)[None], own_k, own_v, is_causal=True, scale=scale)
    out_t, lse_t = out_t[0].transpose(0, 1), lse_t.reshape(Hkv, G, n)  # [n, H, d], [Hkv, G, n]
    if P == 0:
        return out_t, lse_t
    # Kept keys, GQA packed: row r of KV head j is query r % n of head j * G + r // n.
    out_p, lse_p = _flash_with_lse(pack_gqa(qf[None], Hkv), kf[None, :P].transpose(1, 2), vf[None, :P].transpose(1, 2),
                                   scale=scale)
    out_p, lse_p = unpack_gqa(out_p, n)[0], lse_p.reshape(Hkv, G, n)
    lse = torch.logaddexp(lse_p, lse_t)
    weight = lambda part: torch.exp(part - lse).reshape(H, n).t()[..., None]  # [n, H, 1]
    return out_p.mul_(weight(lse_p)).add_(out_t.mul_(weight(lse_t))), lse


def attention_with_scores_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, scale: float,
                              decay: float, reduction: str) -> torch.Tensor:
    """op.attention_with_scores's arguments (slot order) -> out [n, H, d] in q's dtype; scores updated in place."""
    n, H, d = q.shape
    K, Hkv = k.shape[:2]
    G, P = H // Hkv, K - n
    out, lse = _attend(q, k, v, scale)
    weights, keep = ema_factors(n, decay, q.device)
    qg = (q.float() * scale).view(n, Hkv, G, d).permute(1, 2, 0, 3)  # [Hkv, G, n, d]
    kt = k.float().permute(1, 2, 0)[:, None]  # [Hkv, 1, d, K]
    increment = torch.zeros_like(scores)
    rows = max(1, ELEMENTS_PER_PASS // max(1, H * K))
    for a in range(0, n, rows):
        b = min(a + rows, n)
        end = P + b  # keys after the pass's last query are invisible to all its rows
        logits = torch.matmul(qg[:, :, a:b], kt[..., :end]).sub_(lse[:, :, a:b, None])  # [Hkv, G, r, end]
        if reduction == "max":
            grouped = logits[:, 0]
            for g in range(1, G):
                torch.maximum(grouped, logits[:, g], out=grouped)
        own = (logits if reduction == "mean" else grouped[:, None])[..., P + a :]  # the pass's own keys, [.., r, b - a]
        own.masked_fill_(torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).triu_(1), float("-inf"))
        probs = grouped.exp_() if reduction == "max" else logits.exp_().mean(1)  # [Hkv, r, end]
        increment[:, :end] += torch.matmul(weights[a:b], probs)
    scores.mul_(keep[visible_counts(n, K, q.device)]).add_(increment)
    return out.to(q.dtype)
