"""Landmark representatives: the most salient token of each (deduplicated) chunk per head.

- `reference`: eager PyTorch, the oracle.
- `triton`: one Triton kernel (imported on first use).

`salient_tokens(..., impl=...)` dispatches; see `reference.py` for the arguments.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.representatives.reference import salient_tokens_reference
from infinitehip.config.impl import select_impl


def salient_tokens(
    total: torch.Tensor,
    count: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    starts: torch.Tensor,
    lens: torch.Tensor,
    chunk_size: int,
    impl: str = "triton",
) -> torch.Tensor:
    """-> [U, H] int64 most salient token per chunk and head."""
    fn = select_impl(impl, salient_tokens_reference, f"infinitehip.attention.methods.infinitehip.representatives.triton", "salient_tokens_triton", "representatives")
    return fn(total, count, page_table, page_size, starts, lens, chunk_size)


__all__ = ["salient_tokens"]
