"""A random paged KV cache for attention tests that call a method directly (no engine)."""

from __future__ import annotations

import torch

from infinitehip.kv.paged_cache import PagedKVCache


def random_paged_cache(layers: int, pages: int, page_size: int, kv_heads: int, head_dim: int,
                       gen: torch.Generator) -> tuple[PagedKVCache, torch.Tensor]:
    """A CPU fp32 cache of `pages` pages whose keys and values are standard normal, and a page table [pages] int32
    that visits every page in a random order (a sequence's tokens scattered over the cache). Drawn from `gen` in
    that order: keys, values, page table."""
    cache = PagedKVCache(layers, pages, page_size, kv_heads, head_dim, torch.float32, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return cache, torch.randperm(pages, generator=gen).int()
