"""Chunk scoring of one InfiniteHiP pruning stage (paper Alg. 2 lines 6-11 with SelectRep, Alg. 3).

Two ops, each with a reference and a Triton implementation of identical signature and outputs:
`chunk_scores` (SelectRep bisection finds the representatives) and `representative_scores` (landmark mode:
the representatives are given; Triton kernel in `representative_triton.py`).

For each query block m and candidate chunk j: per head, a representative token found by hierarchical top-1
bisection, and the chunk score = max over heads and the block's valid queries of q . k_rep. Two
implementations with identical signatures and outputs:

- `reference`: eager PyTorch, the oracle (CPU and GPU).
- `triton`: one Triton kernel for every stage (stages differ only in the arguments).

`chunk_scores(..., impl=...)` dispatches between them; see `reference.py` for the argument meanings. The
Triton module is imported on first use.
"""

from __future__ import annotations

import importlib

import torch

from infinitehip.attention.infinitehip.scoring.reference import chunk_scores_reference, representative_scores_reference

IMPLS = ("triton", "reference")


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (scores [M, N] fp32, -inf for padding chunks; representatives [M, N, H] int64 token positions)."""
    if impl == "reference":
        fn = chunk_scores_reference
    elif impl == "triton":
        fn = importlib.import_module("infinitehip.attention.infinitehip.scoring.triton").chunk_scores_triton
    else:
        raise ValueError(f"unknown chunk scoring impl {impl!r}; expected one of {IMPLS}")
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
) -> torch.Tensor:
    """Landmark mode: reps [M, N, H] given -> scores [M, N] fp32, -inf for padding chunks."""
    if impl == "reference":
        fn = representative_scores_reference
    elif impl == "triton":
        fn = importlib.import_module("infinitehip.attention.infinitehip.scoring.representative_triton").representative_scores_triton
    else:
        raise ValueError(f"unknown chunk scoring impl {impl!r}; expected one of {IMPLS}")
    return fn(q_rot, q_valid, k_flat, page_table, page_size, reps, chunk_lens, key_pos_base, token_pos_group,
              rep_offset, cos, sin)


__all__ = ["IMPLS", "chunk_scores", "representative_scores"]
