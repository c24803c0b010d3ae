"""Attention with logit soft-capping (Gemma 2): scores s -> tanh(s / cap) * cap before the mask and softmax.

SDPA has no place for the cap, so the capped path computes the scores itself; `cap=None` is plain SDPA.
Only the methods that declare `supports_attn_softcapping` (dense) and the sliding-window layers use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, cap: float | None,
           is_causal: bool = False) -> torch.Tensor:
    """q [..., H, n, d], k/v [..., Hkv, L, d], mask bool broadcastable to [..., H, n, L] (True: visible) ->
    [..., H, n, d]; scores scaled by d ** -0.5 (the model's own scale is folded into q)."""
    gqa = q.shape[-3] != k.shape[-3]
    if cap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)
    if gqa:  # [..., Hkv, L, d] -> [..., H, L, d]
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = torch.tanh(scores / cap) * cap
    if is_causal:
        n, L = scores.shape[-2:]
        mask = torch.ones(n, L, dtype=torch.bool, device=q.device).tril(L - n)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v.float()).to(q.dtype)
