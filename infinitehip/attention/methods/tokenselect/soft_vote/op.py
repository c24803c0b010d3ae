"""TokenSelect's per-head soft vote over paged keys: `soft_vote(..., impl=...)` dispatches between the eager oracle
(`reference.py`; also impl "cpu": no CPU formulation of its own) and the Triton paged dot-product kernels (`triton.py`,
imported on first use)."""

from __future__ import annotations

import torch

from infinitehip.config.impl import select_impl
from infinitehip.attention.methods.tokenselect.soft_vote import reference


def soft_vote(
    q_rot: torch.Tensor,
    k_flat: torch.Tensor,
    page_tables: torch.Tensor,
    page_size: int,
    starts: torch.Tensor,
    counts: torch.Tensor,
    max_count: int,
    sm_scale: float,
    impl: str = "triton",
) -> torch.Tensor:
    """-> votes [R, max_count] fp32 (sum over heads of each head's softmax), -inf past each row's count."""
    fn = select_impl(impl, reference.soft_vote, f"{__package__}.triton", "soft_vote", "soft vote")
    return fn(q_rot, k_flat, page_tables, page_size, starts, counts, max_count, sm_scale)


__all__ = ["soft_vote"]
