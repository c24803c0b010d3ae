"""Eager reference of the question's summed soft vote (see __init__.py)."""

from __future__ import annotations

import torch


def summed_soft_vote_reference(q_rot: torch.Tensor, k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int,
                               start: int, count: int, sm_scale: float,
                               valid: torch.Tensor | None = None) -> torch.Tensor:
    """-> votes [count] fp32 (computed in fp32); valid [1]: only the first valid candidates vote, the rest get 0."""
    n, H, d = q_rot.shape
    Hkv = k_flat.shape[1]
    tokens = torch.arange(start, start + count, device=k_flat.device)
    slots = page_table.long()[tokens // page_size] * page_size + tokens % page_size
    k = k_flat[slots].float()  # [count, Hkv, d]
    logits = torch.einsum("nkgd,tkd->nkgt", q_rot.float().view(n, Hkv, H // Hkv, d), k) * sm_scale
    if valid is not None:
        logits = logits.masked_fill(torch.arange(count, device=k.device) >= valid, float("-inf"))
    return logits.softmax(-1).sum((0, 1, 2))
