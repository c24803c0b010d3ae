"""The cascade's attention with scores for one decode query over a fixed set of slots, the ones it sees given by a
mask: the static-shape form that decode steps run (attention/methods/cascade/decode.py), so they replay from CUDA
graphs. Torch ops only, the same on every device; the same results as `reference.py` up to fp32 rounding (tested
through the method against impl "reference").

A slot the query does not see (holding no token, or past the query) is left out exactly: its logit is -inf, its
value read as zero (such a slot may hold anything, NaN included), its score untouched. A slot it sees gets the EMA
of one query: score <- decay * score + (1 - decay) * attention (reduced over its KV group's query heads).
"""

from __future__ import annotations

import torch


def masked_attention_with_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                                 scores: torch.Tensor, scale: float, decay: float, reduction: str) -> torch.Tensor:
    """q [1, H, d] and k/v [K, Hkv, d] with RoPE applied, visible [K] bool (at least one), scores [Hkv, K] fp32
    updated in place -> out [1, H, d] in q's dtype."""
    H, d = q.shape[1:]
    Hkv = k.shape[1]
    qg = q[0].float().view(Hkv, H // Hkv, d)  # [Hkv, G, d]: head h = hkv * G + g
    logits = torch.matmul(qg, k.float().permute(1, 2, 0)).mul_(scale)  # [Hkv, G, K]
    logits.masked_fill_(~visible, float("-inf"))
    probs = logits.sub_(torch.logsumexp(logits, -1, keepdim=True)).exp_()  # [Hkv, G, K]
    values = torch.where(visible[:, None, None], v.float(), 0.0).transpose(0, 1)  # [Hkv, K, d]
    out = torch.matmul(probs, values)  # [Hkv, G, d]
    reduced = probs.amax(1) if reduction == "max" else probs.mean(1)  # [Hkv, K]
    updated = scores * decay + reduced * (1.0 - decay)
    scores.copy_(torch.where(visible, updated, scores))
    return out.reshape(1, H, d).to(q.dtype)
