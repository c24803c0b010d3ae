"""Sparse attention over an explicit, head-shared key list per query block, reading the paged cache.

Keys are gathered through the page table and rotated on the fly with per-key RoPE positions (the cache
holds keys without RoPE), so StreamingLLM-style, original or any other position scheme is just a choice
of `key_rope_pos` / `query_rope_pos`. Three implementations with identical signatures (impl names:
config/impl.py):

- `reference`: eager PyTorch, the oracle (CPU and GPU).
- `triton`: FlashAttention-style prefill kernel and split-K (flash-decoding) decode kernels.
- `cpu`: the CPU formulation, `sdpa.py`: every block's keys gathered at once and one batched torch SDPA call.

`sparse_attention_prefill(..., impl=...)` / `sparse_attention_decode(..., impl=...)` dispatch between
them; see `reference.py` for the argument meanings. The Triton module is imported on first use.
"""

from __future__ import annotations

import importlib

import torch

from infinitehip.attention.ops.sparse import reference
from infinitehip.config.impl import KERNEL_IMPLS

_MODULES = {"triton": "triton", "cpu": "sdpa"}  # impl -> module of this package (imported on first use)


def _impl(name: str):
    if name == "reference":
        return reference
    if name in _MODULES:
        return importlib.import_module(f"infinitehip.attention.ops.sparse.{_MODULES[name]}")
    raise ValueError(f"unknown sparse attention impl {name!r}; expected one of {KERNEL_IMPLS}")


def sparse_attention_prefill(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    key_tokens: torch.Tensor,
    key_counts: torch.Tensor,
    key_rope_pos: torch.Tensor,
    query_pos: torch.Tensor,
    query_rope_pos: torch.Tensor,
    query_block_size: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    sm_scale: float,
    impl: str = "triton",
) -> torch.Tensor:
    """q [n, H, d] (pre-RoPE) of one sequence's prefill chunk -> [n, H, d] in q's dtype."""
    return _impl(impl).sparse_attention_prefill(
        q, k_flat, v_flat, page_table, page_size, key_tokens, key_counts, key_rope_pos, query_pos,
        query_rope_pos, query_block_size, cos, sin, sm_scale,
    )


def sparse_attention_decode(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    page_tables: torch.Tensor,
    page_size: int,
    key_tokens: torch.Tensor,
    key_counts: torch.Tensor,
    key_rope_pos: torch.Tensor,
    query_rope_pos: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    impl: str = "triton",
) -> torch.Tensor:
    """q [B, H, d] (pre-RoPE), one query per sequence -> [B, H, d] in q's dtype."""
    return _impl(impl).sparse_attention_decode(
        q, k_flat, v_flat, page_tables, page_size, key_tokens, key_counts, key_rope_pos, query_rope_pos,
        cos, sin, sm_scale, num_splits=num_splits,
    )


__all__ = ["sparse_attention_decode", "sparse_attention_prefill"]
