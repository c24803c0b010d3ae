"""The oracle of the prefill's landmark saliency sums: every (query, key) pair in reach, in blocks of queries.

A prefill chunk's queries q_rot [n, H, d] (rotated, fp32; query s at chunk position s) and keys k [L, Hkv, d] (rotated,
fp32; key i at chunk position first_key + i, first_key <= 0: keys of the previous chunk's last window - 1 positions
receive this chunk's queries too). Key t receives query s when 0 <= s - t < window: its sum is
sum over those s of q_rot[s, h] . k[t, h // group], per head h -> [L, H] fp32.
"""

from __future__ import annotations

import torch


def window_logit_sums_reference(q_rot: torch.Tensor, k: torch.Tensor, first_key: int, window: int,
                                block: int = 512) -> torch.Tensor:
    n, H, _ = q_rot.shape
    L = k.shape[0]
    k = k.repeat_interleave(H // k.shape[1], dim=1)  # [L, H, d]
    out = torch.zeros(L, H, dtype=torch.float32, device=q_rot.device)
    for b0 in range(0, n, block):
        qs = q_rot[b0 : b0 + block]  # [B, H, d]
        lo, hi = max(0, b0 - window + 1 - first_key), min(L, b0 + qs.shape[0] - first_key)  # keys in reach
        if lo >= hi:
            continue
        dist = (b0 + torch.arange(qs.shape[0], device=q_rot.device))[:, None] \
            - (first_key + torch.arange(lo, hi, device=q_rot.device))[None, :]
        reach = (dist >= 0) & (dist < window)  # [B, Lk]
        logits = torch.einsum("bhd,khd->hbk", qs, k[lo:hi]).masked_fill(~reach, 0)
        out[lo:hi] += logits.sum(1).T
    return out


def window_counts(n: int, L: int, first_key: int, window: int, device: torch.device) -> torch.Tensor:
    """[L] fp32: how many of the chunk's n queries each key receives."""
    t = torch.arange(first_key, first_key + L, device=device)
    return ((t + window).clamp(max=n) - t.clamp(min=0)).clamp(min=0).float()
