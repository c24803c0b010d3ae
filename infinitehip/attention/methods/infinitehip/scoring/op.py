"""Chunk scoring of one InfiniteHiP pruning stage (paper Alg. 2 lines 6-11 with SelectRep, Alg. 3).

Two ops, each with a reference and a Triton implementation of identical signature and outputs:
`chunk_scores` (SelectRep bisection finds the representatives) and `representative_scores` (landmark mode:
the representatives are given; Triton kernel in `representative/triton.py`).

For each query block m and candidate chunk j: per head, a representative token found by hierarchical top-1
bisection, and the chunk score = max over heads and the block's valid queries of q . k_rep. Two
implementations with identical signatures and outputs:

- `reference`: eager PyTorch, the oracle (CPU and GPU).
- `triton`: one Triton kernel for every stage (stages differ only in the arguments).
- `cpu`: `representative_scores` as batched GEMMs (`representative/cpu.py`); `chunk_scores` uses the reference.

`chunk_scores(..., impl=...)` dispatches between them; see `reference.py` for the argument meanings. The
Triton module is imported on first use. `per_head=True` returns each query head's score [M, N, H] instead of
the max over heads (one call per head on that head's slices; `aggregate.py` combines them).
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.scoring.representative.cpu import representative_scores_cpu
from infinitehip.attention.methods.infinitehip.scoring.reference import (
    chunk_scores_reference, representative_scores_reference,
)
from infinitehip.config.impl import select_impl


def chunk_scores(
    q_rot: torch.Tensor,
    q_valid: torch.Tensor,
    k_flat: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    chunk_starts: torch.Tensor,
    chunk_lens: torch.Tensor,
    key_pos_base: torch.Tensor,
    token_pos_group: int | None,
    left_offset: int,
    right_offset: int,
    rep_offset: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    impl: str = "triton",
    per_head: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (scores [M, N] fp32 ([M, N, H] if per_head), -inf for padding chunks; representatives [M, N, H] int64)."""
    if per_head:
        parts = [chunk_scores(q_h, q_valid, k_h, page_table, page_size, chunk_starts, chunk_lens, key_pos_base,
                              token_pos_group, left_offset, right_offset, rep_offset, cos, sin, impl=impl)
                 for q_h, k_h, _ in _head_slices(q_rot, k_flat)]
        return torch.stack([s for s, _ in parts], -1), torch.cat([r for _, r in parts], -1)
    fn = select_impl(impl, chunk_scores_reference, f"infinitehip.attention.methods.infinitehip.scoring.triton", "chunk_scores_triton", "chunk scoring")
    return fn(q_rot, q_valid, k_flat, page_table, page_size, chunk_starts, chunk_lens, key_pos_base,
              token_pos_group, left_offset, right_offset, rep_offset, cos, sin)


def representative_scores(
    q_rot: torch.Tensor,
    q_valid: torch.Tensor,
    k_flat: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    reps: torch.Tensor,
    chunk_lens: torch.Tensor,
    key_pos_base: torch.Tensor,
    token_pos_group: int | None,
    rep_offset: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    impl: str = "triton",
    per_head: bool = False,
) -> torch.Tensor:
    """Landmark mode: reps [M, N, H] given -> scores [M, N] fp32 ([M, N, H] if per_head), -inf for padding chunks."""
    if per_head:
        return torch.stack([
            representative_scores(q_h, q_valid, k_h, page_table, page_size, reps[:, :, h : h + 1], chunk_lens,
                                  key_pos_base, token_pos_group, rep_offset, cos, sin, impl=impl)
            for q_h, k_h, h in _head_slices(q_rot, k_flat)], -1)
    fn = select_impl(impl, representative_scores_reference, f"infinitehip.attention.methods.infinitehip.scoring.representative.triton",
                     "representative_scores_triton", "chunk scoring", cpu=representative_scores_cpu)
    return fn(q_rot, q_valid, k_flat, page_table, page_size, reps, chunk_lens, key_pos_base, token_pos_group,
              rep_offset, cos, sin)


def _head_slices(q_rot: torch.Tensor, k_flat: torch.Tensor):
    """(q [M, b, 1, d], the head's kv head k [S, 1, d], h) for every query head h (GQA: h // group)."""
    group = q_rot.shape[2] // k_flat.shape[1]
    for h in range(q_rot.shape[2]):
        yield q_rot[:, :, h : h + 1].contiguous(), k_flat[:, h // group : h // group + 1], h


__all__ = ["chunk_scores", "representative_scores"]
