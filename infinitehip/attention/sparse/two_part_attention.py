"""Attention over key lists cut in two: a prefix every query of the block sees, then a short masked tail.

In prefill a query block's sorted key list is visible to all its queries except the last entries (the block's
own tokens, causal) and the padding. The prefix goes through torch's CPU flash kernel without a mask (and with
the GQA heads of a kv head packed into its query rows, so each key tile is read once per kv head); the tail is
an explicit masked softmax; the two merge through their log-sum-exps:
    out = out_p * exp(lse_p - lse) + out_t * exp(lse_t - lse),  lse = logaddexp(lse_p, lse_t).
Exact up to fp32 rounding; a row that sees nothing comes out as zeros.
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
    ([m, b, W], W <= K - prefix). Rows that see no key are zeros (finite only if every listed k / v is)."""
    m, Hkv, rows, d = q.shape
    b, W = tail_visible.shape[1:]
    parts = []  # (out, lse) per part
    if prefix > 0:
        out, lse = _flash_with_lse(q, k[:, :prefix].transpose(1, 2), v[:, :prefix].transpose(1, 2), scale=scale)
        parts.append((out, lse))
    if W > 0:
        k_t, v_t = k[:, prefix : prefix + W].transpose(1, 2), v[:, prefix : prefix + W].transpose(1, 2)  # [m, Hkv, W, d]
        s = torch.matmul(q, k_t.transpose(-1, -2)).mul_(scale)  # [m, Hkv, group * b, W]
        s.view(m, Hkv, rows // b, b, W).masked_fill_(~tail_visible[:, None, None], float("-inf"))
        top = s.amax(-1, keepdim=True)
        top = torch.where(torch.isneginf(top), 0.0, top)  # rows with no visible tail key: all weights 0
        p = s.sub_(top).exp_()
        total = p.sum(-1, keepdim=True)
        out = torch.matmul(p, v_t).div_(total.clamp(min=torch.finfo(total.dtype).tiny))
        parts.append((out, (total.log() + top).squeeze(-1)))
    if not parts:
        return q.new_zeros(q.shape)
    if len(parts) == 1:
        out, lse = parts[0]
        return out.masked_fill_(torch.isneginf(lse)[..., None], 0.0)
    (out_p, lse_p), (out_t, lse_t) = parts
    lse = torch.logaddexp(lse_p, lse_t)
    lse = torch.where(torch.isneginf(lse), 0.0, lse)
    out = out_p.mul_(torch.exp(lse_p - lse)[..., None]).add_(out_t * torch.exp(lse_t - lse)[..., None])
    return out
