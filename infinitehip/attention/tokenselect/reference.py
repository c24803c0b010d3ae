"""Eager PyTorch oracle of the head soft vote (paper eq. 10) over a paged cache.

Row r (a prefill query block or a decoding sequence) scores the candidate tokens starts[r] ..
starts[r] + counts[r] - 1 of its sequence: keys are gathered through its page table (the cache holds keys
without RoPE), each query head h computes logits sm_scale * q_h . k (query head h reads kv head
h // (H / Hkv)), takes a softmax over the row's candidates, and the votes are the sum of the heads'
probabilities. Readable and slow: the oracle the Triton kernels are tested against (CPU and GPU).
"""

from __future__ import annotations

import torch

from infinitehip.kv.paged_cache import token_slots


def soft_vote(
    q_rot: torch.Tensor,  # [R, H, d] queries, already rotated (any dtype; computed in fp32)
    k_flat: torch.Tensor,  # [S, Hkv, d] flat paged cache of one layer, keys without RoPE
    page_tables: torch.Tensor,  # [R, P] int page table of each row's sequence
    page_size: int,
    starts: torch.Tensor,  # [R] int64 first candidate token of each row
    counts: torch.Tensor,  # [R] int64 candidates of each row
    max_count: int,  # width of the output (>= counts.max())
    sm_scale: float,
) -> torch.Tensor:
    """-> votes [R, max_count] fp32: sum over heads of the per-head softmax; -inf past each row's count."""
    R, H, _ = q_rot.shape
    group = H // k_flat.shape[1]
    votes = torch.full((R, max_count), float("-inf"), dtype=torch.float32, device=q_rot.device)
    for r, (start, n) in enumerate(zip(starts.tolist(), counts.tolist())):
        if n == 0:
            continue
        tokens = torch.arange(start, start + n, device=q_rot.device)
        k = k_flat[token_slots(page_tables[r], tokens, page_size)].float()  # [n, Hkv, d]
        k = k.repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,nhd->hn", q_rot[r].float(), k) * sm_scale
        votes[r, :n] = torch.softmax(logits, dim=-1).sum(0)
    return votes
