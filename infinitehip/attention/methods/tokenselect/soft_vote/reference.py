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
    R, H, d = q_rot.shape
    Hkv = k_flat.shape[1]
    votes = torch.full((R, max_count), float("-inf"), dtype=torch.float32, device=q_rot.device)
    q = q_rot.float().view(R, Hkv, H // Hkv, d)  # query heads grouped by the kv head they read
    starts_l, counts_l = starts.tolist(), counts.tolist()
    if R > 1 and len(set(starts_l)) == 1 and bool((page_tables == page_tables[:1]).all()):
        # Rows of one sequence with one candidate start (a prefill chunk's blocks): gather the keys once.
        n = max(counts_l)
        tokens = torch.arange(starts_l[0], starts_l[0] + n, device=q.device)
        k = k_flat[token_slots(page_tables[0], tokens, page_size)].float()  # [n, Hkv, d]
        logits = torch.einsum("rkgd,nkd->rkgn", q, k).reshape(R, H, n) * sm_scale
        outside = torch.arange(n, device=q.device)[None, :] >= counts.to(q.device)[:, None]  # [R, n]
        probs = torch.softmax(logits.masked_fill(outside[:, None, :], float("-inf")), dim=-1).sum(1)
        votes[:, :n] = probs.masked_fill(outside, float("-inf"))
        return votes
    for r, (start, n) in enumerate(zip(starts_l, counts_l)):
        if n == 0:
            continue
        tokens = torch.arange(start, start + n, device=q.device)
        k = k_flat[token_slots(page_tables[r], tokens, page_size)].float()  # [n, Hkv, d]
        logits = torch.einsum("kgd,nkd->kgn", q[r], k).reshape(H, n) * sm_scale
        votes[r, :n] = torch.softmax(logits, dim=-1).sum(0)
    return votes
