"""Most salient token per chunk and head, eager PyTorch (the oracle for the Triton kernel beside it).

Landmark mode (see `saliency.py`): a chunk's representative for query head h is the token of the chunk
with the highest mean saliency sum[slot, h] / max(count[slot], 1), the first one on ties (torch.argmax).
Chunks arrive already deduplicated (`KeySaliency.representatives` maps query blocks' chunks onto them).
"""

from __future__ import annotations

import torch

from infinitehip.kv.paged_cache import token_slots


def salient_tokens_reference(
    total: torch.Tensor,  # [S, H] fp32 saliency sums per flat cache slot
    count: torch.Tensor,  # [S] fp32 queries that reached each slot
    page_table: torch.Tensor,  # [P] int
    page_size: int,
    starts: torch.Tensor,  # [U] int64 first token of each chunk
    lens: torch.Tensor,  # [U] int64 tokens in the chunk (tokens past chunk_size are ignored; 0: rep = start)
    chunk_size: int,
    max_elements: int = 1 << 24,  # bound on the [u, chunk_size, H] saliency tensor per slice of chunks
) -> torch.Tensor:
    """-> [U, H] int64: per chunk and head, the token of [start, start + len) with the highest mean saliency."""
    H = total.shape[1]
    reps = starts.new_zeros(starts.shape[0], H)
    offsets = torch.arange(chunk_size, device=starts.device)
    step = max(1, max_elements // max(1, chunk_size * H))
    for i in range(0, starts.shape[0], step):
        st, ln = starts[i : i + step], lens[i : i + step]
        inside = offsets < ln[:, None]  # [u, c]
        slots = token_slots(page_table, torch.where(inside, st[:, None] + offsets, st[:, None]), page_size)
        sal = total[slots] / count[slots].clamp(min=1)[..., None]  # [u, c, H]
        best = sal.masked_fill(~inside[..., None], float("-inf")).argmax(1)  # [u, H]
        reps[i : i + step] = st[:, None] + best
    return reps
