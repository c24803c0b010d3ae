"""Paged KV cache: per layer, keys (without RoPE) and values in fixed-size pages.

Storage per layer is [num_pages, page_size, num_kv_heads, head_dim] (vLLM's layout). Token t of a
sequence lives in page `page_table[t // page_size]`, slot `t % page_size`; kernels index the flat
view [num_pages * page_size, num_kv_heads, head_dim] with `slot = page * page_size + offset`.
"""

from __future__ import annotations

import torch


def token_slots(page_table: torch.Tensor, tokens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Flat cache slots (int64) of a sequence's token positions `tokens` (any shape)."""
    tokens = tokens.long()
    return page_table.long()[tokens // page_size] * page_size + tokens % page_size


def is_offloaded(cache) -> bool:
    """Whether `cache` keeps its KV in host memory behind GPU banks (`kv/offload/paged.py`): no resident pages."""
    return getattr(cache, "is_offloaded", False)


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        # Uninitialised: a slot is always written before any kernel reads it (and untouched host pages cost nothing).
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.k.shape[-2] * self.k.shape[-1] * self.k.element_size()

    def flat_k(self, layer: int) -> torch.Tensor:
        return self.k[layer].view(-1, *self.k.shape[-2:])

    def flat_v(self, layer: int) -> torch.Tensor:
        return self.v[layer].view(-1, *self.v.shape[-2:])

    def slots(self, page_table: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Flat slot ids [end - start] (int64) of token positions start..end-1 of one sequence."""
        return token_slots(page_table, torch.arange(start, end, device=page_table.device), self.page_size)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k/v [T, num_kv_heads, head_dim] into slots [T]."""
        self.flat_k(layer).index_copy_(0, slots, k.to(self.k.dtype))
        self.flat_v(layer).index_copy_(0, slots, v.to(self.v.dtype))

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every layer's k/v of slots src [N] copied to slots dst [N] (compaction; the ranges may overlap)."""
        for cache in (self.k, self.v):
            flat = cache.view(self.num_layers, -1, *cache.shape[-2:])
            flat.index_copy_(1, dst, flat.index_select(1, src))  # index_select copies first

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather k/v [N, num_kv_heads, head_dim] of slots [N]."""
        return self.flat_k(layer).index_select(0, slots), self.flat_v(layer).index_select(0, slots)

    def read_k(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Gather the keys [*slots.shape, num_kv_heads, head_dim] of slots (any shape)."""
        return self.flat_k(layer)[slots]
