"""TokenSelect (paper 002): token-level KV selection by per-head soft vote, with a decode Selection Cache.

`soft_vote(..., impl=...)` dispatches the selection scores between the eager oracle (`reference.py`) and the
Triton paged dot-product kernels (`triton.py`, imported on first use); `method.py` is the attention method.
"""

from __future__ import annotations

import importlib

import torch

from infinitehip.attention.tokenselect import reference

IMPLS = ("triton", "reference")


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
    if impl == "reference":
        fn = reference.soft_vote
    elif impl == "triton":
        fn = importlib.import_module("infinitehip.attention.tokenselect.triton").soft_vote
    else:
        raise ValueError(f"unknown soft vote impl {impl!r}; expected one of {IMPLS}")
    return fn(q_rot, k_flat, page_tables, page_size, starts, counts, max_count, sm_scale)


__all__ = ["IMPLS", "soft_vote"]
