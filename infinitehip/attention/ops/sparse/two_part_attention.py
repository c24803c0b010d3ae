"""Attention over key lists cut in two: a prefix every query of the block sees, then a short masked tail.

In prefill a query block's sorted key list is visible to all its queries except the last entries (the block's
own tokens, causal) and the padding. The prefix goes through torch's CPU flash kernel without a mask (and with
the GQA heads of a kv head packed into its query rows, so each key tile is read once per kv head); the tail is
the same kernel with an additive mask; the two merge through their log-sum-exps:
    out = out_p * exp(lse_p - lse) + out_t * exp(lse_t - lse),  lse = logaddexp(lse_p, lse_t).
Exact up to fp32 rounding. A row that sees no key at all is left undefined: the caller zeroes it.
"""

from __future__ import annotations

import torch

# (out, logsumexp) of scaled-dot-product attention, the kernel F.scaled_dot_product_attention runs on CPU.
_flash_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def pack_gqa(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [m, b, H, d] -> [m, Hkv, group * b, d]: row r of kv head j is query r % b of head j * group + r // b."""
    m, b, H, d = q.shape
    group = H // num_kv_heads
    return q.view(m, b, num_kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(m, num_kv_heads, group * b, d)


def unpack_gqa(out: torch.Tensor, b: int) -> torch.Tensor:
    """Inverse of pack_gqa: [m, Hkv, group * b, d] -> [m, b, H, d]."""
    m, Hkv, rows, d = out.shape
    return out.view(m, Hkv, rows // b, b, d).permute(0, 3, 1, 2, 4).reshape(m, b, -1, d)


def attend_two_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, tail_visible: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [m, Hkv, group * b, d] (packed), k / v [m, K, Hkv, d] (any strides, fp32) -> [m, Hkv, group * b, d].

    Keys [0, prefix) are visible to every query; key prefix + j is visible to query i iff tail_visible[:, i, j]
    ([m, b, W], W <= K - prefix). Rows that see no key: undefined (the caller zeroes them)."""
    m, Hkv, rows, d = q.shape
    b, W = tail_visible.shape[1:]
    if prefix == 0 and W == 0:
        return q.new_zeros(q.shape)
    if prefix > 0:
        out, lse = _flash_with_lse(q, k[:, :prefix].transpose(1, 2), v[:, :prefix].transpose(1, 2), scale=scale)
        if W == 0:
            return out
    # The tail through the same kernel with an additive mask, one row per packed query: [m, 1, group * b, W].
    # A row that sees no tail key sees its first one instead and gets no weight below.
    seen = tail_visible.any(-1, keepdim=True)  # [m, b, 1]
    first = torch.arange(W, device=q.device) == 0
    mask = torch.where(tail_visible | (~seen & first), 0.0, float("-inf")).to(q.dtype)
    mask = mask[:, None, None].expand(m, 1, rows // b, b, W).reshape(m, 1, rows, W)
    out_t, lse_t = _flash_with_lse(q, k[:, prefix : prefix + W].transpose(1, 2), v[:, prefix : prefix + W].transpose(1, 2),
                                   attn_mask=mask, scale=scale)
    if prefix == 0:
        return out_t
    # Merge: weights exp(lse_part - lse) of the two normalised outputs.
    lse_t = lse_t.masked_fill(~seen[:, None, None, :, 0].expand(m, Hkv, rows // b, b).reshape(m, Hkv, rows), float("-inf"))
    lse_all = torch.logaddexp(lse, lse_t)
    return out.mul_(torch.exp(lse - lse_all)[..., None]).add_(out_t.mul_(torch.exp(lse_t - lse_all)[..., None]))
