"""The question's summed soft vote: many queries over the same candidates of one sequence (question-time selection).

vote[t] = sum over queries i and heads h of softmax_t(sm_scale * q[i, h] . k[t, h // group]), one softmax per
(query, head) over every candidate. TokenSelect's `soft_vote` gives the same sum as `soft_vote(...).sum(0)`, but
scores each query as its own row: every row re-reads every key and writes [n, H, count] fp32 logits. Here a key
tile is read once for all n x group query heads of its kv head (one tensor-core dot).

- `reference`: eager PyTorch, the oracle;
- `triton`: two passes over the keys (per-(query, head) softmax normaliser, then the votes), imported on first use.
"""

from __future__ import annotations

import torch

from infinitehip.config.impl import select_impl
from infinitehip.attention.ops.question_vote.reference import summed_soft_vote_reference


def summed_soft_vote(q_rot: torch.Tensor, k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int, start: int,
                     count: int, sm_scale: float, impl: str = "reference",
                     valid: torch.Tensor | None = None) -> torch.Tensor:
    """q_rot [n, H, d] rotated queries; candidates [start, start + count) of the sequence with page_table [P] in the
    flat paged keys k_flat [S, Hkv, d] -> votes [count] fp32. valid [1] int64 (1 <= valid <= count, on the device):
    only candidates [start, start + valid) vote, the rest get 0, so count can be a static bound (a CUDA graph)."""
    fn = select_impl(impl, summed_soft_vote_reference, f"infinitehip.attention.ops.question_vote.triton", "summed_soft_vote_triton",
                     "summed soft vote")
    return fn(q_rot, k_flat, page_table, page_size, start, count, sm_scale, valid)


__all__ = ["summed_soft_vote"]
